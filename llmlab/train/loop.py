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
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch

from llmlab import console
from llmlab.data.batches import RandomWindows, check_ids, check_length
from llmlab.data.prepare import cache_root, prepare
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
from llmlab.train.loggers import LOGGER, JsonlWriter, NoLogger, SafeLogger
from llmlab.train.meter import History, LogWindow, train_progress
from llmlab.train.mfu import device_peak_flops, raise_device_peak
from llmlab.train.optim import build_optimizer
from llmlab.train.schedule import SCHEDULE
from llmlab.train.resume import Resumable, RunRecord
from llmlab.train.settings import TrainJob, check_train_config
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
    if trainer.branches and not summary.get("interrupted"):
        run_branches(trainer.branches, trainer.run_dir, in_sweep)
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


class Trainer:
    """One training run: built in ``__init__`` (data, model, optimizer, resume state), then
    ``run`` steps it to the end or to a budget and writes the summary."""

    def __init__(self, job: TrainJob, run_dir: str | Path, in_sweep: bool = False, branch_of: Path | None = None):
        self._quiet_before = console.out.quiet  # restored by close(), however far the build got
        # what close() releases, set as the build gets to it
        self.metrics = self.samples = self.logger = self.lock = self.dist = None
        self.branch_of = branch_of
        self.branches: list[branches.Branch] = []
        try:
            self._build(job, run_dir, in_sweep)
        except BaseException:
            self.close(clean=False)
            raise

    # ---- building a run ----------------------------------------------------------------------

    def _build(self, job: TrainJob, run_dir: str | Path, in_sweep: bool) -> None:
        self.t_begin = time.perf_counter()  # wall time includes data preparation and model build
        self.job, self.in_sweep = job, in_sweep
        self.loop = loop = job.loop
        self.dist, self.device = init_distributed(resolve_device(job.device), loop.fsdp, loop.context_parallel)
        console.out.quiet = console.out.quiet or not self.dist.is_main  # one rank speaks
        self.run_id = job.run_id
        self._claim_run_dir(run_dir)
        self.precision = resolve_precision(job.precision, self.device)
        if self.device.type == "cpu":
            keep_freed_memory()  # the step's activations live in host memory: reuse it, do not fault it in again
        self.finished = finished_summary(self.run_dir, self.run_id) if loop.resume == "auto" else None
        if self.finished is not None:
            if job.sched.branches or job.sched.branch_flops:  # they may be left to train: their plan
                self._build_data()
                self._plan_length(Transformer(self.spec))
            return
        torch.manual_seed(job.seed)
        self._build_data()
        self._build_model()
        self._build_optimizer()
        self.progress = Progress()
        self.window = LogWindow(self.device, self.dist)
        self.ema = WeightAverage(self.model, loop.ema) if loop.ema else None  # from the weights it starts with
        self.resumable = Resumable(self.model, self.optimizer, self.scaler, self.sampler, self.random, self.distiller,
                                   self.progress, self.window, self.ema)
        if self.ckpt is not None:
            resume.restore(self.resumable, self.ckpt, self.dist, loop.resume_weights_only)
        self.start_step = self.progress.step
        self.previous: list[dict] = []  # metrics.jsonl records of the steps before a resume
        if self.dist.is_main:  # the records of steps after the checkpoint (or all, without one) are redone
            self.previous = JsonlWriter.truncate_after(self.run_dir / "metrics.jsonl", self.start_step)
            JsonlWriter.truncate_after(self.run_dir / "samples.jsonl", self.start_step)
        prepared = self.prepared
        self.record = RunRecord(self.run_dir, self.run_id, self.spec.to_dict(), job.config,
                                prepared.path / "tokenizer.json",
                                {"data_key": prepared.path.name, "eos": prepared.meta["eos"],
                                 "bytes_per_token": {s: prepared.bytes_per_token(s) for s in ("train", "val")}},
                                self.weight_names, loop.keep_checkpoints, self.token_counts)
        self.evaluator = Evaluator(self.val_tokens, self.seq_len, loop, self.amp, self.distiller, self.tokenizer,
                                   self.bytes_per_token_val, job.seed, self.device, task_files(loop.eval_tasks, "train.eval_tasks"))
        dist = self.dist
        if loop.fsdp and not dist.enabled:
            console.out.print("train.fsdp: one process holds the whole model, so nothing is sharded; start several "
                              "with torchrun --nproc_per_node=N to shard it", style="yellow")
        parallel = (f"; {dist.world_size} ranks, {'FSDP2' if dist.fsdp else 'DDP'}" if dist.enabled else "")
        if dist.context > 1:
            parallel += (f", each sequence split across {dist.context} of them (ring attention, "
                         f"{self.seq_len // dist.context} positions each)")
        note = precision_note(job.precision, self.precision, self.device)
        console.out.print(f"device {self.device} ({note}){parallel}; {self.tokens_per_step:,} tokens/step, "
                          f"{self.steps} steps (warm-up {self.schedule.warmup}) = "
                          f"{self.tokens_per_step * self.steps / 1e6:.2f}M tokens = "
                          f"{self.tokens_per_step * self.steps * self.card['flops_per_token']:.3g} FLOPs; MFU peak "
                          f"{self.peak / 1e12:.2f} TFLOP/s ({self.peak_source}); run id {self.run_id}")

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

    def _build_data(self) -> None:
        job, loop, dist = self.job, self.loop, self.dist
        if dist.is_main:  # one rank fills the cache; the others then read it
            self.prepared = prepare(job.data, job.tokenizer, job.cache_dir)
        barrier(dist)
        if not dist.is_main:
            self.prepared = prepare(job.data, job.tokenizer, job.cache_dir)
        prepared = self.prepared
        if job.init is None:
            self.spec = replace(job.spec, vocab_size=prepared.vocab_size)
        else:  # the source's embedding table, whatever its tokenizer counts
            self.spec = job.spec
            check_vocab(prepared.vocab_size, job.spec.vocab_size, job.init.path)
        self.seq_len = seq_len = self.spec.model.max_seq_len
        self.train_tokens, self.val_tokens = prepared.tokens("train"), prepared.tokens("val")
        self._token_counts = None  # counted at the first save
        check_length(self.val_tokens, seq_len, "val")
        check_ids(self.val_tokens, prepared.vocab_size, f"{prepared.path} (val split)")  # once: eval reads it all
        # ranks that share a sequence (train.context_parallel) read the same windows and masks
        self.tokens_per_step = loop.batch_size * job.grad_accum * seq_len * dist.data_world
        self.sampler = RandomWindows(self.train_tokens, seq_len, loop.batch_size, job.seed, dist.data_rank,
                                     dist.data_world, vocab=prepared.vocab_size, source=f"{prepared.path} (train split)")
        self.random = RankRandom(job.seed, dist.data_rank)
        self.tokenizer = prepared.tokenizer()
        self.bytes_per_token_val = prepared.bytes_per_token("val")

    def _build_model(self) -> None:
        self.ckpt = resume.resume_checkpoint(self.loop, self.run_dir, self.run_id, self.dist.is_main)
        source = None
        if self.job.init is not None and self.ckpt is None:  # init= (a resume has its own weights): the
            source = load_checkpoint(self.job.init.path)  # shapes checked before a model is allocated
            check_sizes_against_weights(self.spec, source.weights, source.path)
        self.model = model = Transformer(self.spec).to(self.device)
        model.checkpointing = self.loop.activation_checkpointing
        if self.job.data.doc_mask:  # attention stays inside each document of a window
            if self.tokenizer.eos_id is None:
                raise UserError("data.doc_mask: the prepared data marks no document's end (its tokenizer has no "
                                "end-of-document token), so no boundary can be kept; drop data.doc_mask")
            model.doc_eos = self.tokenizer.eos_id
        self._plan_length(model)
        print_model_card(model, self.card)
        self.weight_names = unique_names(model)
        if source is not None:  # init=: the source's weights, before FSDP shards them
            load_weights(model, source.weights, source.path, f"its {source.spec_file}")
            console.out.print(f"init: the weights of {source.path} (as its {source.spec_file} describes them); "
                              "the optimizer and schedule start at step 0")
        if self.ckpt is not None:  # weights go in before FSDP shards them
            resume.check_same_tokenizer(self.prepared.path / "tokenizer.json", self.ckpt)
            load_weights(model, self.ckpt.weights, self.ckpt.path,
                         "this run's model settings (model.*, attention.*, ffn.*, norm.*, pos.*, objective.*)")
        self.wrapped = wrap_model(model, self.dist, self.device, find_unused=model.blocks[0].ffn.sparse)
        self.step_model = torch.compile(self.wrapped) if self.loop.compile else self.wrapped

    def _plan_length(self, model: Transformer) -> None:
        """The model card, the run's steps and its cooldown branches."""
        from llmlab.eval.runs import read_overrides

        self.card = model_card(model, self.seq_len, self.precision)
        self.steps = self.loop.planned_steps(self.tokens_per_step, self.card["flops_per_token"])
        sched = self.job.sched
        if sched.branches or sched.branch_flops:  # each branch's command line is this run's, at its own length
            self.branches = branches.plan(self.job, self.run_dir, self.steps, self.tokens_per_step,
                                          self.card["flops_per_token"], read_overrides(self.run_dir))

    def _build_optimizer(self) -> None:
        job, dist, device = self.job, self.dist, self.device
        self.optimizer = build_optimizer(job.optim, self.model, device)
        self.schedule = SCHEDULE.build(job.sched, self.steps, budget_run=job.max_flops is not None)
        self.amp = autocast(device, self.precision)
        self.distiller = (Distiller(job.distill, self.model, self.prepared.path / "tokenizer.json", device, job.seed,
                                    dist.rank) if job.distill.teacher else None)
        self.scaler = grad_scaler(device, self.precision)  # fp16 and the optimizer: check_optimizer_fits
        peak, self.peak_source = device_peak_flops(device, self.precision)
        self.peak = peak * dist.world_size  # MFU of the whole job
        self.warned_peak = False

    def token_counts(self) -> np.ndarray:
        """Token frequencies of the training split, counted once, saved with each checkpoint."""
        if self._token_counts is None:
            self._token_counts = self.prepared.token_counts("train")
        return self._token_counts

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        if self._nothing_to_do():
            return self.finished
        self._open_records()
        loop, steps = self.loop, self.steps
        window, history = self.window, History(self.previous, loop.log_every)
        window.restart_clock()
        progress, stop = train_progress(console.out, steps), StopPolicy(loop, self.dist, self.device)
        done, ckpt, stopping = self.start_step, (self.ckpt.path if self.ckpt is not None else None), None
        self.model.train()
        with progress, stop:
            task = progress.add_task("train", total=steps, status="", loss="", completed=done)
            forks = self._forks()
            for step in range(self.start_step, steps):
                if step in forks:
                    window.pause(self._fork, forks[step])
                lr = self._set_lr(step)
                self.model.at_step(step)
                step_loss = self._step(window)
                grad_norm = self._update()
                self.progress.tokens_seen += self.tokens_per_step
                self.progress.step = step + 1
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
                    ckpt = window.pause(resume.save, self.resumable, self.record, self.dist)
                progress.update(task, completed=done)
                if stopping:
                    progress.console.print(how_to_continue(stopping, done, ckpt, self.run_dir, self.in_sweep,
                                                           self.branch_of), style="yellow")
                    break
        return self._finish(done, history, time.perf_counter() - stop.t_start, ckpt, stopping)

    def _forks(self) -> dict[int, list[branches.Branch]]:
        """The branches still to fork, by the step they leave this run at."""
        out: dict[int, list[branches.Branch]] = {}
        for branch in self.branches:
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
            resume.save(self.resumable, record, self.dist)
            console.out.print(f"branch {branch.label}: forked at step {branch.fork} into {branch.path}; it finishes "
                              "after this run")

    def _nothing_to_do(self) -> bool:
        if self.finished is not None:
            console.out.print(f"{self.run_dir} finished already (run id {self.run_id}); nothing to do. "
                              "To train again, use a new hydra.run.dir")
            return True
        path = self.run_dir / "summary.json"
        if self.start_step >= self.steps and path.is_file():
            try:
                summary = json.loads(path.read_text())
            except (OSError, ValueError):
                summary = None
            if not isinstance(summary, dict):  # damaged: kept aside, and written again below
                aside = path.with_name(f"summary.json.damaged-{time.strftime('%Y%m%d-%H%M%S')}")
                if self.dist.is_main:
                    path.rename(aside)
                console.out.print(f"{path} is unreadable: set aside as {aside.name}; the run finished all "
                                  f"{self.steps} steps, so its summary is written again", style="yellow")
                return False
            console.out.print(f"{self.run_dir} finished all {self.steps} steps already; nothing to do")
            self.finished = summary
            return True
        return False

    def _open_records(self) -> None:
        main = self.dist.is_main
        self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl") if main else None
        self.samples = JsonlWriter(self.run_dir / "samples.jsonl") if main else None  # the prompt completions
        self.logger = SafeLogger(LOGGER.build(self.job.logger if main else NoLogger.Config()))
        if main:
            atomic_write_text(self.run_dir / "config.yaml", _yaml(self.job.config))
            self.logger.start(self.run_dir, {**self.job.config, "model_card": self.card, "run_id": self.run_id,
                                             "world_size": self.dist.world_size})

    def _set_lr(self, step: int) -> float:
        multiplier = self.schedule(step)
        for group in self.optimizer.param_groups:
            group["lr"] = group["base_lr"] * multiplier
        return self.job.optim.lr * multiplier

    def _step(self, window: LogWindow) -> torch.Tensor:
        """Forward and backward over ``grad_accum`` micro-batches; gradients are all-reduced
        on the last one only. Returns the last micro-batch's loss."""
        loop, model, distiller = self.loop, self.model, self.distiller
        accum = self.job.grad_accum
        for micro in range(accum):
            batch = (distiller.next_window(self.sampler.next_window, self.amp) if distiller is not None
                     else self.sampler.next_window())
            x, y = model.objective.make_batch(batch, model.vocab_size, self.random.mask)
            x, y = self._my_slice(x), self._my_slice(y)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with gradient_sync(self.wrapped, self.dist, sync=micro == accum - 1):
                with self.amp, self._sharded():
                    # the distiller reads the logits; otherwise the loss need not keep them
                    out = self.step_model(x, y, logits=distiller is not None, head_loss=loop.head_loss,
                                          z_loss=loop.z_loss)
                    loss = out.loss
                    if distiller is not None:
                        kl = distiller.loss(x, out.logits)
                        # the data term keeps (1 - weight); auxiliary losses (MoE, MTP) stay whole
                        loss = loss + distiller.cfg.weight * (kl - out.main_loss)
                        out.metrics["distill/kl"] = kl.detach()
                self.scaler.scale(loss / accum).backward()
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
        scaler, optimizer = self.scaler, self.optimizer
        if scaler.is_enabled():
            scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
        grad_norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.loop.grad_clip or float("inf"))
        if hasattr(grad_norm, "full_tensor"):  # FSDP: a sharded DTensor
            grad_norm = grad_norm.full_tensor()
        if scaler.is_enabled():
            scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
            scaler.update()
        else:
            optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if self.ema is not None:
            self.ema.update()
        return grad_norm

    # ---- what the loop writes and prints -------------------------------------------------------

    def _record(self, record: dict, history: History) -> None:
        history.records.append(record)
        if self.metrics is not None:
            self.metrics.write(record)
        self.logger.log({k: v for k, v in record.items() if k != "step"}, record["step"])

    def _log(self, window: LogWindow, history: History, done: int, lr: float, grad_norm, ckpt, progress,
             task) -> None:
        synchronize(self.device)  # the window's time is the device's
        closed = window.close()
        tok_s = closed["steps"] * self.tokens_per_step / closed["seconds"]
        load = closed["other_load"]
        if done > self.loop.log_every:  # the first window holds warm-up and compilation
            history.timed(tok_s, closed["seconds"], load)
        flops = self.card["flops_per_token"] * tok_s
        if flops > self.peak:
            self._peak_exceeded(flops)
        record = {"step": done, "train/loss": closed["loss"], "train/lr": lr, "train/grad_norm": float(grad_norm),
                  "train/tokens": self.progress.tokens_seen, "perf/tokens_per_s": tok_s, "perf/mfu": flops / self.peak,
                  **({"perf/other_load": load} if load is not None else {}),
                  **{f"perf/{k}": v for k, v in memory_stats(self.device).items()}, **closed["extra"]}
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
            progress.console.print(f"step {done:>6}/{self.steps}  {status}")
        else:  # the run's log file gets it all the same
            console.keep(f"step {done:>6}/{self.steps}  {status}")

    def _evaluate(self, done: int, history: History, progress, last_good: Path | None = None) -> None:
        self.progress.last_val, samples = self.evaluator(self.model)
        if self.ema is not None:  # the average, scored on the same windows
            with self.ema.swapped_in():
                self.progress.last_val["val/loss_ema"] = self.evaluator.loss(self.model)
        self._record({"step": done, **self.progress.last_val, "train/tokens": self.progress.tokens_seen}, history)
        self.logger.log_samples(samples, done)
        progress.console.print(val_line(done, self.progress.last_val))
        # weights that overflow in the forward pass after the last update: the step's own loss
        # (taken before it) was finite, the validation loss is not; nothing is saved after this
        check_finite(self.progress.last_val["val/loss"], done, last_good, what="validation loss")
        for prompt, text in samples:
            progress.console.print(f"  {prompt!r} -> {text[:120]!r}", style="dim")
            if self.samples is not None:
                self.samples.write({"step": done, "prompt": prompt, "completion": text})

    def _finish(self, done: int, history: History, elapsed: float, ckpt_path: Path | None,
                stopped_by: str | None) -> dict[str, Any]:
        last_val, card, tokens_seen = self.progress.last_val, self.card, self.progress.tokens_seen
        seen = summarize(history.records, history.rates, history.loads)
        speed = seen["speed"]
        # decode speed for the cost card; all ranks take part (FSDP needs every rank in a forward)
        decode = decode_speed(self.model, **DECODE_SETTING) if self.model.objective.causal else None
        summary = {
            "run_dir": str(self.run_dir), "run_id": self.run_id, "steps": done, "steps_planned": self.steps,
            "tokens": tokens_seen, "flops": tokens_seen * card["flops_per_token"],
            "max_flops": self.job.max_flops, "elapsed_s": round(elapsed, 2), "train_loss": seen["train_loss"],
            "val_loss": last_val.get("val/loss"), "val_loss_ema": last_val.get("val/loss_ema"), "val_bpb": last_val.get("val/bpb"),
            "val_ppl": last_val.get("val/ppl"), "val_accuracy": last_val.get("val/accuracy"),
            "objective": self.spec.objective.kind,
            "best_checkpoint": str(best_checkpoint(self.run_dir / "checkpoints") or ckpt_path),
            "loss_spikes": seen["loss_spikes"],
            "best_val_loss": min(seen["val_losses"] + ([last_val["val/loss"]] if "val/loss" in last_val else []),
                                 default=None),
            "interrupted": stopped_by is not None,
            "stopped_by": stopped_by,  # SIGINT, SIGTERM, another rank, train.max_steps=N or train.max_time=Ns
            **speed.as_dict("tokens_per_s"),  # median over log windows, spread, count, other load
            "tokens_per_s_mean": seen["tokens_per_s_mean"],
            "mfu": card["flops_per_token"] * speed.median / self.peak,
            **(decode.as_dict("decode_tokens_per_s") if decode is not None else {"decode_tokens_per_s": None}),
            "decode_setting": decode_setting(self.seq_len, DECODE_SETTING["prompt_tokens"], DECODE_SETTING["tokens"])
            if decode is not None else None,
            "seed": self.job.seed,
            **({"teacher": str(self.distiller.path), "teacher_agreement": last_val.get("val/teacher_agreement"),
                "teacher_kl": last_val.get("val/teacher_kl")} if self.distiller is not None else {}),
            "wall_s": round(time.perf_counter() - self.t_begin, 2),
            "device": str(self.device), "precision": self.precision, "world_size": self.dist.world_size,
            "parallel": ("fsdp" if self.dist.fsdp else "ddp") if self.dist.enabled else None,
            "context_parallel": self.dist.context,
            "checkpoint": str(ckpt_path) if ckpt_path else None, "data": str(self.prepared.path), **card,
            **({"branches": [str(b.path) for b in self.branches]} if self.branches else {}),
        }
        if self.dist.is_main:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        self.logger.log({"summary/val_loss": summary["val_loss"] or float("nan")}, done)
        print_done(summary, speed, elapsed, ckpt_path)
        return summary

    def _peak_exceeded(self, achieved: float) -> None:
        """The run reaches more FLOP/s than the reference peak. A measured peak was taken too
        low (under contention): measure again and raise it, so MFU stays at or under 100%. A
        data sheet's peak is not raised: then the FLOPs count is wrong, and one warning says so."""
        world = self.dist.world_size
        raised = raise_device_peak(self.device, self.precision, achieved / world)
        if raised is not None:
            old, self.peak = self.peak, raised * world
            self.peak_source = "re-measured" if raised * world > achieved else "raised to what this run reached"
            console.err.print(f"MFU: the reference peak ({old / 1e9:,.1f} GFLOP/s) was below what this run reaches "
                              f"({achieved / 1e9:,.1f}); it was measured under load. Now {self.peak / 1e9:,.1f} "
                              f"GFLOP/s ({self.peak_source}), kept in {cache_root() / 'peak.json'}", style="yellow")
        elif not self.warned_peak and self.dist.is_main:
            self.warned_peak = True
            console.err.print(f"MFU is above 100%: this run reaches more than the reference peak "
                              f"({self.peak / 1e9:,.0f} GFLOP/s, {self.peak_source})", style="yellow")

    def close(self, clean: bool = True) -> None:
        """Flush and release everything the run holds. ``clean``: every rank got here the
        normal way, so they can meet at a barrier before the process group goes (after an
        error another rank may never arrive)."""
        for records in (self.metrics, self.samples):
            if records is not None:
                records.close()
        if self.logger is not None:
            self.logger.finish()
        console.out.quiet = self._quiet_before
        if self.lock is not None:
            self.lock.release()
        if self.dist is not None:
            shutdown(self.dist, clean)


def _yaml(cfg: Mapping[str, Any]) -> str:
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(dict(cfg)))
