"""The training loop: data -> model -> loss -> optimizer + schedule -> metrics, evals, checkpoints.

`Trainer` builds a run (data, model, optimizer, resume state) and ``run`` is the loop. Each
of its parts has a module of its own: `llmlab.train.meter` (the log window and records),
`llmlab.train.evaluation`, `llmlab.train.resume` (checkpoints), `llmlab.train.stopping`
(signals and budgets) and `llmlab.train.card` (the model card and the summary). What stays
here is what reads and writes the trainer's own state: the build with the
checks that belong to each of its steps, the step, and the writers of records and summary.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Mapping

import torch

from llmlab import console
from llmlab.data.batches import RandomWindows, check_ids, check_length
from llmlab.data.prepare import prepare
from llmlab.errors import UserError
from llmlab.eval.tasks import task_files
from llmlab.files import RunLock, atomic_write_text, disk_error, open_append, own_dir
from llmlab.model import ring
from llmlab.model.transformer import Transformer
from llmlab.perf import is_number as _number
from llmlab.sample.generate import decode_setting, decode_speed
from llmlab.train import branches, resume
from llmlab.train.card import (DECODE_SETTING, SPIKE_WINDOW, finished_summary, model_card, print_done,
                               print_model_card, spike, summarize)
from llmlab.train.checkpoint import (best_checkpoint, check_sizes_against_weights, check_vocab, load_checkpoint, load_weights,
                                     unique_names)
from llmlab.train.recovery import recover_checkpoints
from llmlab.train.device import (autocast, grad_scaler, keep_freed_memory, memory_stats, resolve_device,
                                 precision_note, resolve_precision, synchronize)
from llmlab.train.distill import Distiller
from llmlab.train.ema import WeightAverage
from llmlab.train.distributed import barrier, broadcast, gradient_sync, init_distributed, mean, shutdown, wrap_model
from llmlab.train.evaluation import Evaluator, val_line
from llmlab.train.loggers import LOGGER, JsonlWriter, SafeLogger
from llmlab.train.meter import History, LogWindow, train_progress
from llmlab.train.mfu import Peak
from llmlab.train.optim import build_optimizer
from llmlab.train.schedule import SCHEDULE
from llmlab.train.parts import Parts, RunData
from llmlab.train.resume import RunRecord
from llmlab.train.settings import GROUPS, TrainJob, check_train_config
from llmlab.train.state import Progress, RankRandom
from llmlab.train.stopping import StopPolicy, check_finite, how_to_continue


def run_training(job: TrainJob | Mapping[str, Any], run_dir: str | Path, in_sweep: bool = False,
                 branch_of: Path | None = None) -> dict[str, Any]:
    """Train as ``job`` says (a `TrainJob`, or the composed ``train`` config as a plain dict,
    resolved here); write metrics, checkpoints and ``summary.json`` into ``run_dir``; then,
    once the run has finished, its cooldown branches (`llmlab.train.branches`); return the
    run's summary. Under torchrun every rank calls this; rank 0's ``run_dir`` is the one used.
    ``in_sweep``: the run is one job of a sweep, and ``branch_of``: the run is a branch of that
    run; each changes only what a stopped run says to do next."""
    if not isinstance(job, TrainJob):
        job = check_train_config(job)
    trainer = Trainer(job, run_dir, in_sweep, branch_of)
    try:
        summary = trainer.run()
    except BaseException:
        trainer.close(clean=False)
        raise
    trainer.close(clean=True)
    if trainer.plan.branches and not summary.get("interrupted"):
        run_branches(trainer.plan.branches, trainer.run_dir, in_sweep)
    return summary


def run_branches(planned: list[branches.Branch], run_dir: Path, in_sweep: bool) -> None:
    """Each branch from its fork to its end, one after another; a finished one says so and is
    skipped, an interrupted one resumes, and a stop by a signal ends the series (the same
    command continues it)."""
    for branch in planned:
        if finished_summary(branch.path, branch.job.run_id) is not None:
            console.out.print(f"branch {branch.label}: finished already in {branch.path}")
            continue
        if not (branch.path / "checkpoints").is_dir():  # a branch not finished has its fork there, at least
            console.out.print(f"branch {branch.label}: {branch.path} holds no fork of this run (removed?), so it "
                              "cannot be trained; start the run again in a new hydra.run.dir to have it", style="yellow")
            continue
        console.out.print(f"branch {branch.label}: the cooldown from step {branch.fork} in {branch.path}")
        with console.keeping(branch.path / "train.log", open_append):  # what it prints, kept in its own folder
            summary = run_training(branch.job, branch.path, in_sweep, branch_of=run_dir)
        if summary.get("interrupted"):
            break


@dataclass(frozen=True)
class Plan:
    """How long the run is: its model card (FLOPs per token...), its steps, its cooldown branches."""

    card: dict[str, Any]
    steps: int
    branches: list[branches.Branch] = field(default_factory=list)


@dataclass
class Records:
    """What the loop writes as it goes (rank 0's; None on the others): metrics.jsonl,
    samples.jsonl and the logger (wandb...)."""

    metrics: JsonlWriter | None
    samples: JsonlWriter | None
    logger: SafeLogger

    def close(self) -> None:
        for records in (self.metrics, self.samples):
            if records is not None:
                records.close()
        self.logger.finish()


class Trainer:
    """One training run: built in ``__init__`` from the job into its declared parts (`RunData`,
    `Parts`, `Plan`), then ``run`` steps them to the end or to a budget and writes the summary."""

    def __init__(self, job: TrainJob, run_dir: str | Path, in_sweep: bool = False, branch_of: Path | None = None):
        self._quiet_before = console.out.quiet  # restored by close(), however far the build got
        # what close() releases, set as the build gets to it
        self.records: Records | None = None
        self.lock = self.dist = None
        self.job, self.in_sweep, self.branch_of = job, in_sweep, branch_of
        self.plan = Plan({}, 0)
        try:
            self._build(run_dir)
        except BaseException:
            self.close(clean=False)
            raise

    @property
    def loop(self):
        return self.job.loop

    @property
    def run_id(self) -> str:
        return self.job.run_id

    # ---- building a run ----------------------------------------------------------------------

    def _build(self, run_dir: str | Path) -> None:
        self.t_begin = time.perf_counter()  # wall time includes data preparation and model build
        job, loop = self.job, self.loop
        self.dist, self.device = init_distributed(resolve_device(job.device), loop.fsdp, loop.context_parallel)
        console.out.quiet = console.out.quiet or not self.dist.is_main  # one rank speaks
        self._claim_run_dir(run_dir)
        self.precision = resolve_precision(job.precision, self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # the step's activations live in host memory: reuse it, do not fault it in again
        self.finished = finished_summary(self.run_dir, self.run_id) if loop.resume == "auto" else None
        if self.finished is not None:
            if job.sched.branches or job.sched.branch_flops:  # they may be left to train: their plan
                self.data = self._build_data()
                self.plan = self._plan_length(Transformer(self.data.spec))
            return
        torch.manual_seed(job.seed)
        self.data = data = self._build_data()
        self.ckpt = resume.resume_checkpoint(loop, self.run_dir, self.run_id, self.dist.is_main)
        model, wrapped, weight_names = self._build_model()
        plan = self.plan
        self.parts = parts = self._build_parts(model, wrapped)
        if self.ckpt is not None:
            resume.restore(parts, self.ckpt, self.dist, loop.resume_weights_only)
        self.start_step = parts.progress.step
        self.previous: list[dict] = []  # metrics.jsonl records of the steps before a resume
        if self.dist.is_main:  # the records of steps after the checkpoint (or all, without one) are redone
            self.previous = JsonlWriter.truncate_after(self.run_dir / "metrics.jsonl", self.start_step)
            JsonlWriter.truncate_after(self.run_dir / "samples.jsonl", self.start_step)
        prepared = data.prepared
        self.record = RunRecord(self.run_dir, self.run_id, data.spec.to_dict(), job.config,
                                prepared.path / "tokenizer.json",
                                {"data_key": prepared.path.name, "eos": prepared.meta["eos"],
                                 "bytes_per_token": {s: prepared.bytes_per_token(s) for s in ("train", "val")}},
                                weight_names, loop.keep_checkpoints, lambda: data.token_counts)
        dist = self.dist
        if loop.fsdp and not dist.enabled:
            console.out.print("train.fsdp: one process holds the whole model, so nothing is sharded; start several "
                              "with torchrun --nproc_per_node=N to shard it", style="yellow")
        parallel = (f"; {dist.world_size} ranks, {'FSDP2' if dist.fsdp else 'DDP'}" if dist.enabled else "")
        if dist.context > 1:
            parallel += (f", each sequence split across {dist.context} of them (ring attention, "
                         f"{data.seq_len // dist.context} positions each)")
        note = precision_note(job.precision, self.precision, self.device)
        console.out.print(f"device {self.device} ({note}){parallel}; {data.tokens_per_step:,} tokens/step, "
                          f"{plan.steps} steps (warm-up {parts.schedule.warmup}) = "
                          f"{data.tokens_per_step * plan.steps / 1e6:.2f}M tokens = "
                          f"{data.tokens_per_step * plan.steps * plan.card['flops_per_token']:.3g} FLOPs; MFU peak "
                          f"{self.peak.flops / 1e12:.2f} TFLOP/s ({self.peak.source}); run id {self.run_id}")

    def _claim_run_dir(self, run_dir: str | Path) -> None:
        """Rank 0 makes and locks the run directory (one trainer per directory), checks that it
        holds no other config's run, and only then finishes what a killed save left; the other
        ranks look at it only then."""
        self.run_dir = Path(broadcast(str(run_dir), self.dist))
        if self.dist.is_main:
            try:
                own_dir(self.run_dir, "hydra.run.dir")
            except OSError as e:
                raise disk_error(e, f"the run directory {self.run_dir}") or e
            self.lock = RunLock(self.run_dir).acquire()
            resume.check_owner(self.loop, self.run_dir, self.run_id)  # refuse before touching anything
            for line in recover_checkpoints(self.run_dir / "checkpoints", locked=self.lock.held):
                console.out.print(f"checkpoints: {line} (left by a run that was killed)", style="yellow")
        barrier(self.dist)

    def _build_data(self) -> RunData:
        job, loop, dist = self.job, self.loop, self.dist
        if dist.is_main:  # one rank fills the cache; the others then read it
            prepared = prepare(job.data, job.tokenizer, job.cache_dir)
        barrier(dist)
        if not dist.is_main:
            prepared = prepare(job.data, job.tokenizer, job.cache_dir)
        if job.init is None:
            spec = replace(job.spec, vocab_size=prepared.vocab_size)
        else:  # the source's embedding table, whatever its tokenizer counts
            spec = job.spec
            check_vocab(prepared.vocab_size, job.spec.vocab_size, job.init.path)
        seq_len = spec.model.max_seq_len
        val_tokens = prepared.tokens("val")
        check_length(val_tokens, seq_len, "val")
        check_ids(val_tokens, prepared.vocab_size, f"{prepared.path} (val split)")  # once: eval reads it all
        # ranks that share a sequence (train.context_parallel) read the same windows and masks
        return RunData(prepared, spec, prepared.tokens("train"), val_tokens,
                       loop.batch_size * job.grad_accum * seq_len * dist.data_world, prepared.tokenizer())

    def _build_model(self) -> tuple[Transformer, Any, dict]:
        """The model with its starting weights (init=, or the checkpoint resumed), as the ranks
        share it, and its weights' unique names."""
        job, data, ckpt = self.job, self.data, self.ckpt
        source = None
        if job.init is not None and ckpt is None:  # init= (a resume has its own weights): the
            source = load_checkpoint(job.init.path)  # shapes checked before a model is allocated
            check_sizes_against_weights(data.spec, source.weights, source.path)
        model = Transformer(data.spec).to(self.device)
        model.checkpointing = self.loop.activation_checkpointing
        if job.data.doc_mask:  # attention stays inside each document of a window
            if data.tokenizer.eos_id is None:
                raise UserError("data.doc_mask: the prepared data marks no document's end (its tokenizer has no "
                                "end-of-document token), so no boundary can be kept; drop data.doc_mask")
            model.doc_eos = data.tokenizer.eos_id
        self.plan = self._plan_length(model)
        print_model_card(model, self.plan.card)
        weight_names = unique_names(model)
        if source is not None:  # init=: the source's weights, before FSDP shards them
            load_weights(model, source.weights, source.path, f"its {source.spec_file}")
            console.out.print(f"init: the weights of {source.path} (as its {source.spec_file} describes them); "
                              "the optimizer and schedule start at step 0")
        if ckpt is not None:  # weights go in before FSDP shards them
            resume.check_same_tokenizer(data.prepared.path / "tokenizer.json", ckpt)
            load_weights(model, ckpt.weights, ckpt.path,
                         "this run's model settings (model.*, attention.*, ffn.*, norm.*, pos.*, objective.*)")
        return model, wrap_model(model, self.dist, self.device, find_unused=model.blocks[0].ffn.sparse), weight_names

    def _plan_length(self, model: Transformer) -> Plan:
        """The model card, the run's steps and its cooldown branches."""
        from llmlab.eval.runs import read_overrides

        card = model_card(model, self.data.seq_len, self.precision, self.device.type)
        steps = self.loop.planned_steps(self.data.tokens_per_step, card["flops_per_token"])
        sched = self.job.sched
        planned = []
        if sched.branches or sched.branch_flops:  # each branch's command line is this run's, at its own length
            planned = branches.plan(self.job, self.run_dir, steps, self.data.tokens_per_step, card["flops_per_token"],
                                    read_overrides(self.run_dir))
        return Plan(card, steps, planned)

    def _build_parts(self, model: Transformer, wrapped: Any) -> Parts:
        job, loop, dist, device, data = self.job, self.loop, self.dist, self.device, self.data
        optimizer = build_optimizer(job.optim, model, device)
        schedule = SCHEDULE.build(job.sched, self.plan.steps, budget_run=job.max_flops is not None)
        amp = autocast(device, self.precision)
        distiller = (Distiller(job.distill, model, data.prepared.path / "tokenizer.json", device, job.seed, dist.rank)
                     if job.distill.teacher else None)
        scaler = grad_scaler(device, self.precision)  # fp16 and the optimizer: check_optimizer_fits
        self.peak = Peak(device, self.precision, dist)  # measuring it draws from torch's random stream: before a resume
        return Parts(
            model=model, wrapped=wrapped, step_model=torch.compile(wrapped) if loop.compile else wrapped,
            optimizer=optimizer, scaler=scaler, schedule=schedule, amp=amp, progress=Progress(), window=LogWindow(device, dist),
            sampler=RandomWindows(data.train_tokens, data.seq_len, loop.batch_size, job.seed, dist.data_rank,
                                  dist.data_world, vocab=data.prepared.vocab_size,
                                  source=f"{data.prepared.path} (train split)"),
            random=RankRandom(job.seed, dist.data_rank), distiller=distiller,
            ema=WeightAverage(model, loop.ema) if loop.ema else None,  # from the weights it starts with
            evaluator=Evaluator(data.val_tokens, data.seq_len, loop, amp, distiller, data.tokenizer,
                                data.bytes_per_token_val, job.seed, device,
                                task_files(loop.eval_tasks, "train.eval_tasks")),
            declared={r.group: r.build(job.declared[r.group], model, data) for r in GROUPS})

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        if self._nothing_to_do():
            return self.finished
        self._open_records()
        loop, steps = self.loop, self.plan.steps
        window, history = self.parts.window, History(self.previous, loop.log_every)
        window.restart_clock()
        progress, stop = train_progress(console.out, steps), StopPolicy(loop, self.dist, self.device)
        done, ckpt, stopping = self.start_step, (self.ckpt.path if self.ckpt is not None else None), None
        self.parts.model.train()
        with progress, stop:
            task = progress.add_task("train", total=steps, status="", loss="", completed=done)
            forks = self._forks()
            for step in range(self.start_step, steps):
                if step in forks:
                    window.pause(self._fork, forks[step])
                lr = self._set_lr(step)
                self.parts.model.at_step(step)
                step_loss = self._step(window)
                grad_norm = self._update()
                self.parts.progress.tokens_seen += self.data.tokens_per_step
                self.parts.progress.step = step + 1
                done = step + 1
                if done % loop.log_every == 0 or done == steps:
                    self._log(window, history, done, lr, grad_norm, ckpt, progress, task)
                # read once a step, agreed by every rank: a signal that lands later in this step
                # is acted on after the next, so a stop always comes with its checkpoint
                stopping = stop.check(done, steps)
                if (loop.eval_every and done % loop.eval_every == 0) or done == steps:
                    window.pause(self._evaluate, done, history, progress, ckpt)  # eval time is not training time
                if (loop.ckpt_every and done % loop.ckpt_every == 0) or done == steps or stopping:
                    check_finite(float(mean(step_loss, self.dist)), done, ckpt)  # never save a diverged model
                    ckpt = window.pause(resume.save, self.parts, self.record, self.dist)
                progress.update(task, completed=done)
                if stopping:
                    progress.console.print(how_to_continue(stopping, done, ckpt, self.run_dir, self.in_sweep,
                                                           self.branch_of), style="yellow")
                    break
        return self._finish(done, history, time.perf_counter() - stop.t_start, ckpt, stopping)

    def _forks(self) -> dict[int, list[branches.Branch]]:
        """The branches still to fork, by the step they leave this run at."""
        out: dict[int, list[branches.Branch]] = {}
        for branch in self.plan.branches:
            if branch.fork >= self.start_step and not branches.started(branch):
                out.setdefault(branch.fork, []).append(branch)
        return out

    def _fork(self, planned: list[branches.Branch]) -> None:
        """Save this run's whole state into each branch's folder, as the branch's own checkpoint
        (its settings and run id), with the records it shares with this run."""
        for branch in planned:
            if self.dist.is_main:
                branches.write_records(branch, self.run_dir)
            record = replace(self.record, run_dir=branch.path, run_id=branch.job.run_id, config=branch.job.config)
            resume.save(self.parts, record, self.dist)
            console.out.print(f"branch {branch.label}: forked at step {branch.fork} into {branch.path}; it finishes "
                              "after this run")

    def _nothing_to_do(self) -> bool:
        if self.finished is not None:
            console.out.print(f"{self.run_dir} finished already (run id {self.run_id}); nothing to do. "
                              "To train again, use a new hydra.run.dir")
            return True
        path = self.run_dir / "summary.json"
        if self.start_step >= self.plan.steps and path.is_file():
            try:
                summary = json.loads(path.read_text())
            except (OSError, ValueError):
                summary = None
            if not isinstance(summary, dict):  # damaged: kept aside, and written again below
                aside = path.with_name(f"summary.json.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                if self.dist.is_main:
                    path.rename(aside)
                console.out.print(f"{path} is unreadable: set aside as {aside.name}; the run finished all "
                                  f"{self.plan.steps} steps, so its summary is written again", style="yellow")
                return False
            console.out.print(f"{self.run_dir} finished all {self.plan.steps} steps already; nothing to do")
            self.finished = summary
            return True
        return False

    def _open_records(self) -> None:
        main = self.dist.is_main
        self.records = records = Records(
            JsonlWriter(self.run_dir / "metrics.jsonl") if main else None,
            JsonlWriter(self.run_dir / "samples.jsonl") if main else None,  # the prompt completions
            SafeLogger(LOGGER.build(self.job.logger if main else LOGGER.config_of("none")())))
        if main:
            atomic_write_text(self.run_dir / "config.yaml", _yaml(self.job.config))
            records.logger.start(self.run_dir, {**self.job.config, "model_card": self.plan.card, "run_id": self.run_id,
                                                "world_size": self.dist.world_size})

    def _set_lr(self, step: int) -> float:
        multiplier = self.parts.schedule(step)
        for group in self.parts.optimizer.param_groups:
            group["lr"] = group["base_lr"] * multiplier
        return self.job.optim.lr * multiplier

    def _step(self, window: LogWindow) -> torch.Tensor:
        """Forward and backward over ``grad_accum`` micro-batches; gradients are all-reduced
        on the last one only. Returns the last micro-batch's loss."""
        loop, model, distiller = self.loop, self.parts.model, self.parts.distiller
        accum = self.job.grad_accum
        for micro in range(accum):
            batch = (distiller.next_window(self.parts.sampler.next_window, self.parts.amp) if distiller is not None
                     else self.parts.sampler.next_window())
            x, y = model.objective.make_batch(batch, model.vocab_size, self.parts.random.mask)
            x, y = self._my_slice(x), self._my_slice(y)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with gradient_sync(self.parts.wrapped, self.dist, sync=micro == accum - 1):
                with self.parts.amp, self._sharded():
                    # the distiller reads the logits; otherwise the loss need not keep them
                    out = self.parts.step_model(x, y, logits=distiller is not None, head_loss=loop.head_loss,
                                          z_loss=loop.z_loss)
                    loss = out.loss
                    if distiller is not None:
                        kl = distiller.loss(x, out.logits)
                        # the data term keeps (1 - weight); auxiliary losses (MoE, MTP) stay whole
                        loss = loss + distiller.cfg.weight * (kl - out.main_loss)
                        out.metrics["distill/kl"] = kl.detach()
                self.parts.scaler.scale(loss / accum).backward()
            window.add(out.metrics)
        window.stepped()
        return out.metrics["loss/main"].detach()

    def _my_slice(self, t: torch.Tensor) -> torch.Tensor:
        """This rank's contiguous slice of each sequence (train.context_parallel), else all of it."""
        dist = self.dist
        if dist.context == 1:
            return t
        size = t.shape[1] // dist.context
        return t[:, dist.context_rank * size:(dist.context_rank + 1) * size]

    def _sharded(self):
        """The forward's context: ring attention over the ranks that share the sequence."""
        return ring.sharded(self.dist.context_group) if self.dist.context > 1 else contextlib.nullcontext()

    def _update(self) -> torch.Tensor:
        """Clip, step, zero: the optimizer step of one training step; returns the grad norm."""
        scaler, optimizer = self.parts.scaler, self.parts.optimizer
        if scaler.is_enabled():
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(self.parts.model.parameters(), self.loop.grad_clip or float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a sharded DTensor
            grad_norm = grad_norm.full_tensor()
        if scaler.is_enabled():
            scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.parts.ema is not None:
            self.parts.ema.update()
        return grad_norm

    # ---- what the loop writes and prints -------------------------------------------------------

    def _record(self, record: dict, history: History) -> None:
        history.records.append(record)
        if self.records.metrics is not None:
            self.records.metrics.write(record)
        self.records.logger.log({k: v for k, v in record.items() if k != "step"}, record["step"])

    def _log(self, window: LogWindow, history: History, done: int, lr: float, grad_norm, ckpt, progress,
             task) -> None:
        synchronize(self.device)  # the window's time is the device's
        closed = window.close()
        tok_s = closed["steps"] * self.data.tokens_per_step / closed["seconds"]
        load = closed["other_load"]
        if done > self.loop.log_every:  # the first window holds warm-up and compilation
            history.timed(tok_s, closed["seconds"], load)
        flops = self.plan.card["flops_per_token"] * tok_s
        if flops > self.peak.flops:
            self.peak.exceeded(flops)
        record = {"step": done, "train/loss": closed["loss"], "train/lr": lr, "train/grad_norm": float(grad_norm),
                  "train/tokens": self.parts.progress.tokens_seen, "perf/tokens_per_s": tok_s, "perf/mfu": flops / self.peak.flops,
                  **({"perf/other_load": load} if load is not None else {}),
                  **{f"perf/{k}": v for k, v in memory_stats(self.device).items()}, **closed["extra"]}
        for group, part in self.parts.declared.items():  # declared groups' figures (probe=...), off the clock
            record.update({f"{group}/{k}": v for k, v in window.pause(part.measure, done).items()})
        check_finite(record["train/loss"], done, ckpt)
        before = []  # the last SPIKE_WINDOW train losses, newest last (not the whole history each log step)
        for r in reversed(history.records):
            if len(before) == SPIKE_WINDOW:
                break
            if _number(r.get("train/loss")):
                before.insert(0, r["train/loss"])
        if (median := spike(before, record["train/loss"])) is not None:
            progress.console.print(f"step {done}: loss spike: {record['train/loss']:.3f}, against a median of "
                                   f"{median:.3f} over the last {min(len(before), SPIKE_WINDOW)} log steps", style="yellow")
        self._record(record, history)
        index_kl = f"  index KL {record['indexer/kl']:.3f}" if "indexer/kl" in record else ""
        status = (f"loss {record['train/loss']:.3f}{index_kl}  lr {lr:.2e}  grad {record['train/grad_norm']:.2f}  "
                  f"{tok_s:,.0f} tok/s  MFU {record['perf/mfu']:.1%}")
        progress.update(task, loss=f"loss {record['train/loss']:.3f}", status=status.split("  ", 1)[1])
        if not console.out.is_terminal:  # a log file gets a line per log step instead of a live bar
            progress.console.print(f"step {done:>6}/{self.plan.steps}  {status}")
        else:  # the run's log file gets it all the same
            console.keep(f"step {done:>6}/{self.plan.steps}  {status}")

    def _evaluate(self, done: int, history: History, progress, last_good: Path | None = None) -> None:
        self.parts.progress.last_val, samples = self.parts.evaluator(self.parts.model)
        if self.parts.ema is not None:  # the average, scored on the same windows
            with self.parts.ema.swapped_in():
                self.parts.progress.last_val["val/loss_ema"] = self.parts.evaluator.loss(self.parts.model)
        self._record({"step": done, **self.parts.progress.last_val, "train/tokens": self.parts.progress.tokens_seen}, history)
        self.records.logger.log_samples(samples, done)
        progress.console.print(val_line(done, self.parts.progress.last_val))
        # weights that overflow in the forward pass after the last update: the step's own loss
        # (taken before it) was finite, the validation loss is not; nothing is saved after this
        check_finite(self.parts.progress.last_val["val/loss"], done, last_good, what="validation loss")
        for prompt, text in samples:
            progress.console.print(f"  {prompt!r} -> {text[:120]!r}", style="dim")
            if self.records.samples is not None:
                self.records.samples.write({"step": done, "prompt": prompt, "completion": text})

    def _finish(self, done: int, history: History, elapsed: float, ckpt_path: Path | None,
                stopped_by: str | None) -> dict[str, Any]:
        last_val, card, tokens_seen = self.parts.progress.last_val, self.plan.card, self.parts.progress.tokens_seen
        seen = summarize(history.records, history.rates, history.loads)
        speed = seen["speed"]
        # decode speed for the cost card; all ranks take part (FSDP needs every rank in a forward)
        decode = decode_speed(self.parts.model, **DECODE_SETTING) if self.parts.model.objective.causal else None
        summary = {
            "run_dir": str(self.run_dir), "run_id": self.run_id, "steps": done, "steps_planned": self.plan.steps,
            "tokens": tokens_seen, "flops": tokens_seen * card["flops_per_token"],
            "max_flops": self.job.max_flops, "elapsed_s": round(elapsed, 2), "train_loss": seen["train_loss"],
            "val_loss": last_val.get("val/loss"), "val_loss_ema": last_val.get("val/loss_ema"), "val_bpb": last_val.get("val/bpb"),
            "val_ppl": last_val.get("val/ppl"), "val_accuracy": last_val.get("val/accuracy"),
            "objective": self.data.spec.objective.kind,
            "best_checkpoint": str(best_checkpoint(self.run_dir / "checkpoints") or ckpt_path),
            "loss_spikes": seen["loss_spikes"],
            "best_val_loss": min(seen["val_losses"] + ([last_val["val/loss"]] if "val/loss" in last_val else []),
                                 default=None),
            "interrupted": stopped_by is not None,
            "stopped_by": stopped_by,  # SIGINT, SIGTERM, another rank, train.max_steps=N or train.max_time=Ns
            **speed.as_dict("tokens_per_s"),  # median over log windows, spread, count, other load
            "tokens_per_s_mean": seen["tokens_per_s_mean"],
            "mfu": card["flops_per_token"] * speed.median / self.peak.flops,
            **(decode.as_dict("decode_tokens_per_s") if decode is not None else {"decode_tokens_per_s": None}),
            "decode_setting": decode_setting(self.data.seq_len, DECODE_SETTING["prompt_tokens"], DECODE_SETTING["tokens"])
            if decode is not None else None,
            "seed": self.job.seed,
            **({"teacher": str(self.parts.distiller.path), "teacher_agreement": last_val.get("val/teacher_agreement"),
                "teacher_kl": last_val.get("val/teacher_kl")} if self.parts.distiller is not None else {}),
            "wall_s": round(time.perf_counter() - self.t_begin, 2),
            "device": str(self.device), "precision": self.precision, "world_size": self.dist.world_size,
            "parallel": ("fsdp" if self.dist.fsdp else "ddp") if self.dist.enabled else None,
            "context_parallel": self.dist.context,
            "checkpoint": str(ckpt_path) if ckpt_path else None, "data": str(self.data.prepared.path), **card,
            **({"branches": [str(b.path) for b in self.plan.branches]} if self.plan.branches else {}),
        }
        if self.dist.is_main:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        self.records.logger.log({"summary/val_loss": summary["val_loss"] or float("nan")}, done)
        print_done(summary, speed, elapsed, ckpt_path)
        return summary

    def close(self, clean: bool = True) -> None:
        """Flush and release everything the run holds. ``clean``: every rank got here the
        normal way, so they can meet at a barrier before the process group goes (after an
        error another rank may never arrive)."""
        if self.records is not None:
            self.records.close()
        console.out.quiet = self._quiet_before
        if self.lock is not None:
            self.lock.release()
        if self.dist is not None:
            shutdown(self.dist, clean)


def _yaml(cfg: Mapping[str, Any]) -> str:
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(dict(cfg)))
