"""The training loop: data -> model -> loss -> AdamW + schedule -> metrics, evals, checkpoints."""

from __future__ import annotations

import json
import math
import os
import signal
import statistics
import threading
import time
from pathlib import Path
from typing import Any, Mapping

import numpy as np
import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Column

from llmlab import console
from llmlab.data.batches import RandomWindows, check_length
from llmlab.data.prepare import cache_root, prepare
from llmlab.errors import ConfigError, UserError
from llmlab.eval.loss import bits_per_byte, evaluate_loss
from llmlab.model.ffn import FFN
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.sample.generate import SamplingConfig, decode_setting, decode_speed, generate
from llmlab.files import RunLock, atomic_write_text, disk_error
from llmlab.train.checkpoint import (Checkpoint, best_checkpoint, latest_in_run, load_checkpoint, load_weights,
                                     recover_checkpoints, save_checkpoint, unique_names)
from llmlab.train.device import autocast, grad_scaler, memory_stats, resolve_device, resolve_precision, synchronize
from llmlab.train.distill import Distiller
from llmlab.train.distributed import (any_rank, barrier, broadcast, full_model_state, full_optimizer_state, gather,
                                      gradient_sync, init_distributed, load_optimizer_state, mean, shutdown, wrap_model)
from llmlab.train.loggers import LOGGER, JsonlWriter, NoLogger, SafeLogger
from llmlab.train.mfu import device_peak_flops, raise_device_peak
from llmlab.perf import describe, other_load, rate, snapshot
from llmlab.train.optim import build_optimizer
from llmlab.train.schedule import SCHEDULE
from llmlab.train.settings import check_train_config, run_id


def model_card(model: Transformer, seq_len: int, precision: str) -> dict[str, Any]:
    counts = model.param_counts()
    cache_bytes = 2 if precision == "bf16" else 4
    return {"params": counts["total"], "params_embedding": counts["embedding"],
            "params_non_embedding": counts["non_embedding"], "params_active": counts["active"],
            "flops_per_token": model.flops_per_token(seq_len),
            "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(cache_bytes),
            "kv_cache_dtype": "bf16" if precision == "bf16" else "fp32", "caveats": model.caveats()}


def print_model_card(spec: ModelSpec, card: dict[str, Any]) -> None:
    m = spec.model
    parts = (f"{spec.attention.kind} attention, {spec.norm.placement}-norm {spec.norm.kind}, {spec.pos.kind} positions, "
             f"{spec.ffn.kind} FFN, {'tied' if m.tie_embeddings else 'untied'} head"
             + (f", {m.mtp_heads} MTP heads" if m.mtp_heads else "")
             + (f", objective {spec.objective.kind}" if spec.objective.kind != "clm" else ""))
    console.out.print(f"model {m.name}: d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, "
                      f"context {m.max_seq_len}, vocab {spec.vocab_size:,}; {parts}")
    console.out.print(f"  params {card['params'] / 1e6:.2f}M (embedding {card['params_embedding'] / 1e6:.2f}M, "
                      f"non-embedding {card['params_non_embedding'] / 1e6:.2f}M"
                      + (f", active {card['params_active'] / 1e6:.2f}M" if card["params_active"] != card["params"] else "")
                      + "); "
                      f"{card['flops_per_token'] / 1e6:.1f} MFLOPs/token (train); "
                      f"KV cache {card['kv_cache_bytes_per_token']:,} B/token ({card['kv_cache_dtype']})"
                      + (f", at most {spec.attention.window} positions" if hasattr(spec.attention, "window") else ""))


# Decode speed in the summary: the same prompt length, new tokens and batch for every run (fewer
# only where the context is shorter; the summary records the setting used).
DECODE_SETTING = {"prompt_tokens": 16, "tokens": 48, "repeats": 5}


def train_progress(out, total: int) -> Progress:
    """The live bar: step N/M, elapsed time and the loss come first and keep their width (at
    80 columns too); the time left and the rest of the status line take what is left and are
    cut with an ellipsis. A log file gets a line per log step instead (see ``run``)."""
    def keep(width: int) -> Column:
        return Column(no_wrap=True, min_width=width)
    return Progress(TextColumn("[bold]train", table_column=keep(5)), BarColumn(bar_width=8, table_column=keep(8)),
                    MofNCompleteColumn(table_column=keep(2 * len(str(total)) + 1)),
                    TimeElapsedColumn(table_column=keep(7)), TextColumn("{task.fields[loss]}", table_column=keep(10)),
                    TimeRemainingColumn(table_column=Column(no_wrap=True, overflow="ellipsis")),
                    TextColumn("{task.fields[status]}", table_column=Column(no_wrap=True, overflow="ellipsis", ratio=1)),
                    console=out, disable=not out.is_terminal)


def run_training(cfg: Mapping[str, Any], run_dir: str | Path, in_sweep: bool = False) -> dict[str, Any]:
    """Train as ``cfg`` (a resolved plain dict of the whole ``train`` config) says; write
    metrics, checkpoints and ``summary.json`` into ``run_dir``; return the summary. Under
    torchrun every rank calls this; rank 0's ``run_dir`` is the one used. ``in_sweep``: the
    run is one job of a sweep, which changes only what a stopped run says to do next."""
    trainer = Trainer(cfg, run_dir, in_sweep)
    try:
        summary = trainer.run()
    except BaseException:
        trainer.close(clean=False)
        raise
    trainer.close(clean=True)
    return summary


class Trainer:
    """One training run: built in ``__init__`` (data, model, optimizer, resume state), then
    ``run`` steps it to the end or to a budget and writes the summary."""

    def __init__(self, cfg: Mapping[str, Any], run_dir: str | Path, in_sweep: bool = False):
        try:
            self._build(cfg, run_dir, in_sweep)
        except BaseException:
            self.close(clean=False)
            raise

    def _build(self, cfg: Mapping[str, Any], run_dir: str | Path, in_sweep: bool) -> None:
        self.t_begin = time.perf_counter()  # wall time includes data preparation and model build
        self.cfg = cfg
        self.in_sweep = in_sweep
        self.job = job = check_train_config(cfg)
        self.loop = loop = job.loop
        self.dist, self.device = init_distributed(resolve_device(job.device), loop.fsdp)
        dist, device = self.dist, self.device
        self._quiet_before = console.out.quiet
        console.out.quiet = console.out.quiet or not dist.is_main  # one rank speaks
        self.run_dir = Path(broadcast(str(run_dir), dist))
        self.lock = None
        if dist.is_main:
            try:
                self.run_dir.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise disk_error(e, f"the run directory {self.run_dir}") or e
            self.lock = RunLock(self.run_dir).acquire()  # one trainer per run directory
            for line in recover_checkpoints(self.run_dir / "checkpoints"):
                console.out.print(f"checkpoints: {line} (left by a run that was killed)", style="yellow")
        barrier(dist)  # the other ranks look at the checkpoints only once rank 0 has recovered them
        self.run_id = run_id(cfg)
        self.precision = resolve_precision(job.precision, device)
        self.finished = finished_summary(self.run_dir, self.run_id) if loop.resume == "auto" else None
        if self.finished is not None:
            return
        torch.manual_seed(job.seed)

        if dist.is_main:  # one rank fills the cache; the others then read it
            self.prepared = prepare(cfg["data"], cfg["tokenizer"], job.cache_dir)
        barrier(dist)
        if not dist.is_main:
            self.prepared = prepare(cfg["data"], cfg["tokenizer"], job.cache_dir)
        prepared = self.prepared
        self.spec = spec = ModelSpec.from_config(cfg, prepared.vocab_size)
        self.block = block = spec.model.max_seq_len
        self.train_tokens, self.val_tokens = prepared.tokens("train"), prepared.tokens("val")
        self._token_counts = None  # counted at the first save
        check_length(self.val_tokens, block, "val")
        self.tokens_per_step = loop.batch_size * loop.grad_accum * block * dist.world_size
        self.steps = math.ceil(loop.max_tokens / self.tokens_per_step) if loop.max_tokens else loop.steps
        self.sampler = RandomWindows(self.train_tokens, block, loop.batch_size, job.seed, dist.rank, dist.world_size)
        self.mask_rng = torch.Generator().manual_seed(job.seed * 1000 + dist.rank)  # MLM masking, on the CPU

        self.model = model = Transformer(spec).to(device)
        self.card = model_card(model, block, self.precision)
        print_model_card(spec, self.card)
        for caveat in self.card["caveats"]:
            console.err.print(f"warning: {caveat}", style="yellow")
        self.weight_names = unique_names(model)
        self.ckpt = self._resume_checkpoint()
        if self.ckpt is not None:  # weights go in before FSDP shards them
            self._check_same_tokenizer(self.ckpt)
            load_weights(model, self.ckpt.weights, self.ckpt.path,
                         "this run's model settings (model.*, attention.*, norm.*, pos.*, objective.*)")
        self.wrapped = wrap_model(model, dist, device, find_unused=FFN.get(spec.ffn.kind).sparse)
        self.step_model = torch.compile(self.wrapped) if loop.compile else self.wrapped
        self.optimizer = build_optimizer(job.optim, model, device)
        self.schedule = SCHEDULE.build(job.sched, self.steps)
        self.amp = autocast(device, self.precision)
        self.distiller = (Distiller(job.distill, model, prepared.path / "tokenizer.json", device, job.seed, dist.rank)
                          if job.distill.teacher else None)
        self.scaler = grad_scaler(device, self.precision)
        if self.scaler.is_enabled() and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise ConfigError(f"precision: fp16 loss scaling needs a single optimizer; optim={job.optim.kind} has "
                              "several; use precision=bf16 or fp32")
        if loop.head_loss == "fused" and self.precision == "fp16":
            raise ConfigError("train.head_loss: fused computes the logits' gradients in the forward, before fp16 "
                              "loss scaling could protect them; use train.head_loss=auto or plain, or precision=bf16")
        if dist.fsdp and not isinstance(self.optimizer, torch.optim.Optimizer):
            raise ConfigError(f"train.fsdp: optim={job.optim.kind} is not supported with FSDP; use DDP "
                              "(train.fsdp=false) or optim=adamw")
        peak, self.peak_source = device_peak_flops(device, self.precision)
        self.peak = peak * dist.world_size  # MFU of the whole job
        self.start_step, self.tokens_seen, self.last_val = 0, 0, {}
        self.previous: list[dict] = []  # metrics.jsonl records of the steps before a resume
        self.window: dict = {}  # the logging interval a checkpoint cut in two: losses summed so far
        self.warned_peak = False
        self.window_loads: list[tuple[float, float]] = []  # (seconds, other load) of each timed log window
        if self.ckpt is not None:
            self._restore(self.ckpt)
        elif dist.is_main:  # records of an earlier start that saved no checkpoint are redone
            for name in ("metrics.jsonl", "samples.jsonl"):
                JsonlWriter.truncate_after(self.run_dir / name, 0)
        self.tokenizer = prepared.tokenizer()
        self.bytes_per_token_val = prepared.bytes_per_token("val")
        parallel = (f"; {dist.world_size} ranks, {'FSDP2' if dist.fsdp else 'DDP'}" if dist.enabled else "")
        console.out.print(f"device {device} ({self.precision}){parallel}; {self.tokens_per_step:,} tokens/step, "
                          f"{self.steps} steps = {self.tokens_per_step * self.steps / 1e6:.2f}M tokens; MFU peak "
                          f"{self.peak / 1e12:.2f} TFLOP/s ({self.peak_source}); run id {self.run_id}")

    # ---- resume -------------------------------------------------------------------------

    def _resume_checkpoint(self) -> Checkpoint | None:
        loop = self.loop
        if loop.resume == "auto":
            found = latest_in_run(self.run_dir)
            if found is None:
                return None
        elif loop.resume:
            found = loop.resume
        else:
            return None
        try:
            ckpt = load_checkpoint(found)
        except UserError as e:
            raise UserError(f"train.resume: {str(e).removeprefix('ckpt: ')}") from e
        other = ckpt.state.get("run_id")
        if loop.resume == "auto" and other and other != self.run_id:
            raise ConfigError(
                f"train.resume: {self.run_dir} holds a run of another config (run id {other}; this config is "
                f"{self.run_id}); use a new hydra.run.dir, train.resume={ckpt.path} to continue from it anyway, "
                "or train.resume=null to start over in this directory")
        return ckpt

    def _check_same_tokenizer(self, ckpt: Checkpoint) -> None:
        from llmlab.data.tokenizer import TextTokenizer

        ours = TextTokenizer.load(self.prepared.path / "tokenizer.json", eos=None).tok.get_vocab()
        theirs = TextTokenizer.load(ckpt.tokenizer_path, eos=None).tok.get_vocab()
        if ours != theirs:
            raise ConfigError(f"tokenizer: this run's tokenizer ({len(ours):,} tokens) is not the one {ckpt.path} was "
                              f"trained with ({len(theirs):,} tokens); resume with that run's tokenizer and data "
                              "settings, or start fresh with train.resume=null")

    def _restore(self, ckpt: Checkpoint) -> None:
        """Everything that decides the next step: optimizer, RNGs, data position."""
        rank = self.dist.rank
        trainer = ckpt.trainer_state()
        if trainer is None:
            if not self.loop.resume_weights_only:
                raise UserError(f"train.resume: {ckpt.path} has no trainer.pt (optimizer and random state), so the run "
                                "cannot continue its curve; pass train.resume_weights_only=true to continue from its "
                                "weights with a fresh optimizer, or train.resume=null to start over")
            console.out.print(f"resuming from the weights of {ckpt.path} alone: fresh optimizer and random state, so "
                              "the curve differs from an uninterrupted run", style="yellow")
            trainer = {}
        if "optimizer" in trainer:
            load_optimizer_state(self.model, self.optimizer, trainer["optimizer"])
        if "scaler" in trainer and self.scaler.is_enabled():
            self.scaler.load_state_dict(trainer["scaler"])
        torch_rng, mask_rng = trainer.get("torch_rng_by_rank"), trainer.get("mask_rng_by_rank")
        if torch_rng:  # a rank with no saved state of its own (more ranks than before) keeps its seed
            if rank < len(torch_rng):
                torch.set_rng_state(torch_rng[rank])
                self.mask_rng.set_state(mask_rng[rank])
        distill_rng = trainer.get("distill_rng_by_rank")
        if self.distiller is not None and distill_rng and rank < len(distill_rng):
            self.distiller.load_state(distill_rng[rank])
        self.sampler.load_state(ckpt.state["data_rng"])
        self.start_step, self.tokens_seen = int(ckpt.state["step"]), int(ckpt.state.get("tokens_seen", 0))
        self.last_val = ckpt.state.get("val") or {}
        self.window = ckpt.state.get("log_window") or {}
        if self.dist.is_main:  # the summary covers the steps before the resume too
            self.previous = JsonlWriter.truncate_after(self.run_dir / "metrics.jsonl", self.start_step)
            JsonlWriter.truncate_after(self.run_dir / "samples.jsonl", self.start_step)
        console.out.print(f"resumed from {ckpt.path} at step {self.start_step}")

    # ---- checkpoints, eval ----------------------------------------------------------------

    def save(self, step: int, window: dict | None = None) -> Path | None:
        """Every rank calls this (FSDP gathers its shards); rank 0 writes, the others wait.
        ``window``: the logging interval so far (losses summed over ranks' mean, micro-batches),
        so a resumed run logs the same interval average as an uninterrupted one."""
        dist = self.dist
        full = full_model_state(self.model, dist)
        optim_state = full_optimizer_state(self.model, self.optimizer, dist)
        rngs = gather((torch.get_rng_state(), self.mask_rng.get_state(),
                       self.distiller.state() if self.distiller is not None else None), dist)
        path = None
        if dist.is_main:
            prepared = self.prepared
            weights = {k: full[k] for k in self.weight_names}
            trainer = {"optimizer": optim_state, "torch_rng_by_rank": [r[0] for r in rngs],
                       "mask_rng_by_rank": [r[1] for r in rngs]}
            if self.distiller is not None:
                trainer["distill_rng_by_rank"] = [r[2] for r in rngs]
            if self.scaler.is_enabled():
                trainer["scaler"] = self.scaler.state_dict()
            path = save_checkpoint(
                self.run_dir / "checkpoints", step, weights, self.spec.to_dict(), self.cfg,
                prepared.path / "tokenizer.json",
                state={"tokens_seen": self.tokens_seen, "val": self.last_val, "run_id": self.run_id,
                       "world_size": dist.world_size, "data_rng": self.sampler.state(),
                       "data_key": prepared.meta["key"], "eos": prepared.meta["eos"],
                       "bytes_per_token": {s: prepared.bytes_per_token(s) for s in ("train", "val")},
                       "log_window": window or {}},
                trainer_state=trainer, keep=self.loop.keep_checkpoints, token_counts=self.token_counts())
        barrier(dist)
        return broadcast(path, dist)

    def token_counts(self) -> np.ndarray:
        """Token frequencies of the training split, counted once, saved with each checkpoint."""
        if self._token_counts is None:
            self._token_counts = self.prepared.token_counts("train")
        return self._token_counts

    def evaluate(self) -> tuple[dict[str, float], list[tuple[str, str]]]:
        """Validation loss (and prompt completions). Every rank scores the same windows, so
        all agree without a reduction; under FSDP they must all take part anyway."""
        loop, model = self.loop, self.model
        res = evaluate_loss(model, self.val_tokens, self.block, loop.batch_size, self.device, self.amp,
                            loop.eval_windows or None)
        out = {"val/loss": res["loss"], "val/ppl": res["ppl"], "val/accuracy": res["accuracy"]}
        if self.distiller is not None:
            out.update(self.distiller.compare(model, self.val_tokens, self.block, loop.batch_size, self.device,
                                              self.amp, loop.eval_windows or None))
        samples = []
        if model.objective.causal:  # bits per byte of a masked-token loss would mean nothing
            out["val/bpb"] = bits_per_byte(res["loss"], 1, self.bytes_per_token_val)
            samples = complete_prompts(model, self.tokenizer, loop.prompts, loop.sample_tokens, self.device,
                                       self.job.seed)
        return out, samples

    # ---- the loop ----------------------------------------------------------------------------

    def run(self) -> dict[str, Any]:
        if self.finished is not None:
            console.out.print(f"{self.run_dir} finished already (run id {self.run_id}); nothing to do. "
                              "To train again, use a new hydra.run.dir")
            return self.finished
        if self.start_step >= self.steps and (self.run_dir / "summary.json").is_file():
            console.out.print(f"{self.run_dir} finished all {self.steps} steps already; nothing to do")
            return json.loads((self.run_dir / "summary.json").read_text())
        loop, dist, device = self.loop, self.dist, self.device
        main = dist.is_main
        self.metrics = JsonlWriter(self.run_dir / "metrics.jsonl") if main else None
        self.samples = JsonlWriter(self.run_dir / "samples.jsonl") if main else None  # the prompt completions
        self.logger = SafeLogger(LOGGER.build(self.job.logger if main else NoLogger.Config()))
        if main:
            (self.run_dir / "config.yaml").write_text(_yaml(self.cfg))
            self.logger.start(self.run_dir, {**self.cfg, "model_card": self.card, "run_id": self.run_id,
                                             "world_size": dist.world_size})
        card, steps = self.card, self.steps
        # a log file gets a line per log step instead of a live bar (whose last frame rich would cut to 80 columns)
        progress = train_progress(console.out, self.steps)
        history: list[dict[str, float]] = list(self.previous)
        tok_rates: list[float] = [h["perf/tokens_per_s"] for h in self.previous
                                  if "perf/tokens_per_s" in h and h["step"] > loop.log_every]
        t_start = time.perf_counter()
        done = self.start_step
        ckpt_path = self.ckpt.path if self.ckpt is not None else None
        stop = StopRequest()
        self.model.train()
        with progress, stop:
            task = progress.add_task("train", total=steps, status="", loss="", completed=done)
            # a resume in mid-interval carries on the interval's sums, so its average covers it all
            t_window, n_timed, cpu_window = time.perf_counter(), 0, snapshot()
            loss_acc = torch.tensor(float(self.window.get("loss", 0.0)), device=device)
            n_acc = int(self.window.get("micro", 0))
            extra_acc: dict[str, Any] = {k: float(v) for k, v in (self.window.get("extra") or {}).items()}
            for step in range(self.start_step, steps):
                multiplier = self.schedule(step)
                for group in self.optimizer.param_groups:
                    group["lr"] = group["base_lr"] * multiplier
                lr = self.job.optim.lr * multiplier
                step_loss = self._step(loss_acc, extra_acc)
                n_acc += loop.grad_accum
                n_timed += 1
                grad_norm = self._update()
                self.tokens_seen += self.tokens_per_step
                done = step + 1

                if done % loop.log_every == 0 or done == steps:
                    synchronize(device)
                    dt = time.perf_counter() - t_window
                    cpu_now = snapshot()
                    load = other_load(cpu_window, cpu_now)
                    tok_s = n_timed * self.tokens_per_step / dt
                    if step >= loop.log_every:  # the first window includes warm-up and compilation
                        tok_rates.append(tok_s)
                        if load is not None:
                            self.window_loads.append((dt, load))
                    if card["flops_per_token"] * tok_s > self.peak:
                        self._peak_exceeded(card["flops_per_token"] * tok_s)
                    record = {"step": done, "train/loss": float(mean(loss_acc, dist)) / n_acc, "train/lr": lr,
                              "train/grad_norm": float(grad_norm), "train/tokens": self.tokens_seen,
                              "perf/tokens_per_s": tok_s, "perf/mfu": card["flops_per_token"] * tok_s / self.peak,
                              **({"perf/other_load": load} if load is not None else {}),
                              **{f"perf/{k}": v for k, v in memory_stats(device).items()},
                              **{k: float(mean(torch.as_tensor(v, device=device), dist)) / n_acc
                                 for k, v in sorted(extra_acc.items())}}
                    check_finite(record["train/loss"], done, ckpt_path)
                    history.append(record)
                    if main:
                        self.metrics.write(record)
                    self.logger.log({k: v for k, v in record.items() if k != "step"}, done)
                    status = (f"loss {record['train/loss']:.3f}  lr {lr:.2e}  grad {record['train/grad_norm']:.2f}  "
                              f"{tok_s:,.0f} tok/s  MFU {record['perf/mfu']:.1%}")
                    progress.update(task, loss=f"loss {record['train/loss']:.3f}",
                                    status=status.split("  ", 1)[1])  # the loss has its own column
                    if not console.out.is_terminal:  # a log file gets a line per log step instead of a live bar
                        progress.console.print(f"step {done:>6}/{steps}  {status}")
                    else:  # the run's log file gets it all the same
                        console.keep(f"step {done:>6}/{steps}  {status}")
                    t_window, loss_acc, n_acc, n_timed = time.perf_counter(), torch.zeros((), device=device), 0, 0
                    cpu_window = snapshot()
                    extra_acc = {}

                if not stop.requested:
                    if loop.max_time is not None and time.perf_counter() - t_start >= loop.max_time:
                        stop.requested = f"train.max_time={loop.max_time:g}s"
                    elif loop.max_steps is not None and done >= loop.max_steps and done < steps:
                        stop.requested = f"train.max_steps={loop.max_steps}"
                if any_rank(bool(stop.requested), dist, device) and not stop.requested:
                    stop.requested = "another rank"  # all ranks stop at the same step
                is_last = done == steps
                if (loop.eval_every and done % loop.eval_every == 0) or is_last:
                    t_eval = time.perf_counter()
                    self.last_val, samples = self.evaluate()
                    record = {"step": done, **self.last_val, "train/tokens": self.tokens_seen}
                    history.append(record)
                    if main:
                        self.metrics.write(record)
                    self.logger.log(self.last_val, done)
                    self.logger.log_samples(samples, done)
                    val = self.last_val
                    bpb = f"  bpb {val['val/bpb']:.4f}" if "val/bpb" in val else ""
                    agree = (f"  teacher agreement {val['val/teacher_agreement']:.3f} KL {val['val/teacher_kl']:.3f}"
                             if "val/teacher_agreement" in val else "")
                    progress.console.print(f"step {done:>6}  val loss {val['val/loss']:.4f}  "
                                           f"ppl {val['val/ppl']:.2f}  acc {val['val/accuracy']:.3f}{bpb}{agree}")
                    for prompt, text in samples:
                        progress.console.print(f"  {prompt!r} -> {text[:120]!r}", style="dim")
                        if main:
                            self.samples.write({"step": done, "prompt": prompt, "completion": text})
                    t_window += time.perf_counter() - t_eval  # eval time is not training throughput
                if (loop.ckpt_every and done % loop.ckpt_every == 0) or is_last or stop.requested:
                    check_finite(float(mean(step_loss, dist)), done, ckpt_path)  # never save a diverged model
                    t_ckpt = time.perf_counter()
                    window = {"loss": float(mean(loss_acc, dist)), "micro": n_acc,
                              "extra": {k: float(mean(torch.as_tensor(v, device=device), dist))
                                        for k, v in sorted(extra_acc.items())}} if n_acc else None
                    ckpt_path = self.save(done, window)
                    t_window += time.perf_counter() - t_ckpt
                progress.update(task, completed=done)
                if stop.requested:
                    same = "the same " + ("sweep command" if self.in_sweep else "command") + (
                        " without train.max_steps" if stop.requested.startswith("train.max_steps") else "")
                    where = ("; finished jobs are skipped" if self.in_sweep
                             else f" with hydra.run.dir={self.run_dir} (or train.resume={ckpt_path})")
                    progress.console.print(f"stopped by {stop.requested} after step {done}; checkpoint {ckpt_path}. "
                                           f"To continue, run {same}{where}", style="yellow")
                    break
        return self._finish(done, history, tok_rates, t_start, ckpt_path, stop.requested)

    def _step(self, loss_acc: torch.Tensor, extra_acc: dict) -> torch.Tensor:
        """Forward and backward over ``grad_accum`` micro-batches; gradients are all-reduced
        on the last one only. Returns the last micro-batch's loss."""
        loop, model, distiller = self.loop, self.model, self.distiller
        for micro in range(loop.grad_accum):
            window = (distiller.next_window(self.sampler.next_window, self.amp) if distiller is not None
                      else self.sampler.next_window())
            x, y = model.objective.make_batch(window, model.vocab_size, self.mask_rng)
            x, y = x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)
            with gradient_sync(self.wrapped, self.dist, sync=micro == loop.grad_accum - 1):
                with self.amp:
                    # the distiller reads the logits; otherwise the loss need not keep them
                    out = self.step_model(x, y, logits=distiller is not None, head_loss=loop.head_loss)
                    loss = out.loss
                    if distiller is not None:
                        kl = distiller.loss(x, out.logits)
                        # the data term keeps (1 - weight); auxiliary losses (MoE, MTP) stay whole
                        loss = loss + distiller.cfg.weight * (kl - out.main_loss)
                        out.metrics["distill/kl"] = kl.detach()
                self.scaler.scale(loss / loop.grad_accum).backward()
            loss_acc += out.metrics["loss/main"].detach()
            for key, value in out.metrics.items():
                if key != "loss/main":
                    extra_acc[key] = extra_acc.get(key, 0.0) + (value.detach() if torch.is_tensor(value) else value)
        return out.metrics["loss/main"].detach()

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
        return grad_norm

    def _finish(self, done: int, history: list[dict], tok_rates: list[float], t_start: float,
                ckpt_path: Path | None, stopped_by: str | None) -> dict[str, Any]:
        elapsed = time.perf_counter() - t_start
        last_val, card = self.last_val, self.card
        train_losses = [h["train/loss"] for h in history if "train/loss" in h]
        val_losses = [h["val/loss"] for h in history if "val/loss" in h]
        loads = self.window_loads
        load = sum(t * x for t, x in loads) / sum(t for t, _ in loads) if loads else None
        speed = rate(tok_rates, load) if tok_rates else rate([next(
            (h["perf/tokens_per_s"] for h in reversed(history) if "perf/tokens_per_s" in h), 0.0)], load)
        rate_ = speed.median
        # decode speed for the cost card; all ranks take part (FSDP needs every rank in a forward)
        decode = decode_speed(self.model, **DECODE_SETTING) if self.model.objective.causal else None
        summary = {
            "run_dir": str(self.run_dir), "run_id": self.run_id, "steps": done, "steps_planned": self.steps,
            "tokens": self.tokens_seen, "elapsed_s": round(elapsed, 2),
            "train_loss": train_losses[-1] if train_losses else None,
            "val_loss": last_val.get("val/loss"), "val_bpb": last_val.get("val/bpb"),
            "val_ppl": last_val.get("val/ppl"), "val_accuracy": last_val.get("val/accuracy"),
            "objective": self.spec.objective.kind,
            "best_checkpoint": str(best_checkpoint(self.run_dir / "checkpoints") or ckpt_path),
            "best_val_loss": min(val_losses + ([last_val["val/loss"]] if "val/loss" in last_val else []), default=None),
            "interrupted": stopped_by is not None,
            "stopped_by": stopped_by,  # SIGINT, SIGTERM, another rank, train.max_steps=N or train.max_time=Ns
            **speed.as_dict("tokens_per_s"),  # median over log windows, spread, count, other load
            "tokens_per_s_mean": statistics.fmean(tok_rates) if tok_rates else None,
            "mfu": card["flops_per_token"] * rate_ / self.peak,
            **(decode.as_dict("decode_tokens_per_s") if decode is not None else {"decode_tokens_per_s": None}),
            "decode_setting": decode_setting(self.block, DECODE_SETTING["prompt_tokens"], DECODE_SETTING["tokens"])
            if decode is not None else None,
            "seed": self.job.seed,
            **({"teacher": str(self.distiller.path), "teacher_agreement": last_val.get("val/teacher_agreement"),
                "teacher_kl": last_val.get("val/teacher_kl")} if self.distiller is not None else {}),
            "wall_s": round(time.perf_counter() - self.t_begin, 2),
            "device": str(self.device), "precision": self.precision, "world_size": self.dist.world_size,
            "parallel": ("fsdp" if self.dist.fsdp else "ddp") if self.dist.enabled else None,
            "checkpoint": str(ckpt_path) if ckpt_path else None, "data": str(self.prepared.path), **card,
        }
        if self.dist.is_main:
            atomic_write_text(self.run_dir / "summary.json", json.dumps(summary, indent=2))
        self.logger.log({"summary/val_loss": summary["val_loss"] or float("nan")}, done)
        bpb = f" ({summary['val_bpb']:.3f} bits/byte)" if summary["val_bpb"] is not None else ""
        val = f"{summary['val_loss']:.4f}" if summary["val_loss"] is not None else "n/a"
        console.out.print(f"done: {done} steps in {elapsed / 60:.1f} min; val loss {val}{bpb}; "
                          f"{describe(speed)}, MFU {summary['mfu']:.1%}", style="green")
        console.out.print(f"checkpoint: {ckpt_path}")
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
        for name in ("metrics", "samples"):
            if getattr(self, name, None) is not None:
                getattr(self, name).close()
        if getattr(self, "logger", None) is not None:
            self.logger.finish()
        if hasattr(self, "_quiet_before"):
            console.out.quiet = self._quiet_before
        if getattr(self, "lock", None) is not None:
            self.lock.release()
        if getattr(self, "dist", None) is not None:
            shutdown(self.dist, clean)


def finished_summary(run_dir: Path, rid: str) -> dict | None:
    """The summary of a run of this config that already ran to its end in ``run_dir``."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if summary.get("run_id") == rid and not summary.get("interrupted"):
        return summary
    return None


def stopped_by_signal(summary: dict) -> bool:
    """Whether a run stopped early because it was asked to (SIGINT, SIGTERM), not at a budget."""
    reason = summary.get("stopped_by")
    return bool(reason) and not reason.startswith("train.")


class StopRequest:
    """SIGINT / SIGTERM ask the loop to finish its step, save a checkpoint and stop; a second
    SIGINT interrupts at once. Handlers are installed only in the main thread."""

    def __init__(self):
        self.requested: str | None = None
        self._previous: dict = {}

    def _handle(self, signum, frame):
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.requested = signal.Signals(signum).name
        console.err.print(f"{self.requested}: finishing this step, then saving a checkpoint "
                          "(press ^C again to stop at once)", style="yellow")

    def __enter__(self):
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc):
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        return False


def check_finite(loss: float, step: int, last_good) -> None:
    if not math.isfinite(loss):
        raise UserError(f"training diverged: the loss is {loss} at step {step}; nothing was saved after it. "
                        f"Last good checkpoint: {last_good or 'none'}. Try a lower optim.lr or train.grad_clip")


def complete_prompts(model: Transformer, tokenizer, prompts: list[str], n_tokens: int, device: torch.device,
                     seed: int) -> list[tuple[str, str]]:
    """Sample a short completion of each prompt, with a generator of its own so the training
    random stream is untouched."""
    if not prompts or not n_tokens:
        return []
    gen = torch.Generator(device=device).manual_seed(seed)
    cfg = SamplingConfig(max_new_tokens=n_tokens, temperature=0.8, top_k=50)
    out = []
    for prompt in prompts:
        ids = tokenizer.encode(prompt) or [tokenizer.eos_id or 0]
        x = torch.tensor([ids], device=device)
        y = generate(model, x, cfg, eos_id=tokenizer.eos_id, generator=gen)
        out.append((prompt, tokenizer.decode(y[0, len(ids):].tolist(), skip_special=True)))
    return out


def _yaml(cfg: Mapping[str, Any]) -> str:
    from omegaconf import OmegaConf
    return OmegaConf.to_yaml(OmegaConf.create(dict(cfg)))
