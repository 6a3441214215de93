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

import torch
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeRemainingColumn

from llmlab import console
from llmlab.data.batches import RandomWindows, check_length
from llmlab.data.prepare import prepare
from llmlab.errors import ConfigError, UserError
from llmlab.eval.loss import bits_per_byte, evaluate_loss
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.sample.generate import SamplingConfig, generate
from llmlab.train.checkpoint import best_checkpoint, latest_in_run, load_checkpoint, load_weights, save_checkpoint
from llmlab.train.device import autocast, grad_scaler, memory_stats, resolve_device, resolve_precision, synchronize
from llmlab.train.loggers import LOGGER, JsonlWriter, SafeLogger
from llmlab.train.mfu import device_peak_flops
from llmlab.train.optim import build_optimizer
from llmlab.train.schedule import SCHEDULE
from llmlab.train.settings import check_train_config


def model_card(model: Transformer, seq_len: int, precision: str) -> dict[str, Any]:
    counts = model.param_counts()
    cache_bytes = 2 if precision == "bf16" else 4
    return {"params": counts["total"], "params_embedding": counts["embedding"],
            "params_non_embedding": counts["non_embedding"], "params_active": counts["active"],
            "flops_per_token": model.flops_per_token(seq_len),
            "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(cache_bytes),
            "kv_cache_dtype": "bf16" if precision == "bf16" else "fp32"}


def print_model_card(spec: ModelSpec, card: dict[str, Any]) -> None:
    m = spec.model
    parts = (f"{spec.attention.kind} attention, {spec.norm.placement}-norm {spec.norm.kind}, {spec.pos.kind} positions, "
             f"{m.ffn} FFN, {'tied' if m.tie_embeddings else 'untied'} head"
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


def run_training(cfg: Mapping[str, Any], run_dir: str | Path) -> dict[str, Any]:
    """Train as ``cfg`` (a resolved plain dict of the whole ``train`` config) says; write
    metrics, checkpoints and ``summary.json`` into ``run_dir``; return the summary."""
    t_begin = time.perf_counter()  # wall time includes data preparation and model build
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    job = check_train_config(cfg)
    loop = job.loop
    device = resolve_device(job.device)
    precision = resolve_precision(job.precision, device)
    rank = int(os.environ.get("RANK", 0))
    torch.manual_seed(job.seed)

    prepared = prepare(cfg["data"], cfg["tokenizer"], job.cache_dir)
    spec = ModelSpec.from_config(cfg, prepared.vocab_size)
    block = spec.model.max_seq_len
    train_tokens, val_tokens = prepared.tokens("train"), prepared.tokens("val")
    check_length(val_tokens, block, "val")
    sampler = RandomWindows(train_tokens, block, loop.batch_size, job.seed, rank)
    mask_rng = torch.Generator().manual_seed(job.seed * 1000 + rank)  # MLM masking, on the CPU

    model = Transformer(spec).to(device)
    card = model_card(model, block, precision)
    print_model_card(spec, card)
    step_model = torch.compile(model) if loop.compile else model
    optimizer = build_optimizer(job.optim, model, device)
    schedule = SCHEDULE.build(job.sched, loop.steps)
    amp = autocast(device, precision)
    scaler = grad_scaler(device, precision)
    if scaler.is_enabled() and not isinstance(optimizer, torch.optim.Optimizer):
        raise ConfigError(f"precision: fp16 loss scaling needs a single optimizer; optim={job.optim.kind} has "
                          "several; use precision=bf16 or fp32")
    peak, peak_source = device_peak_flops(device, precision)
    tokens_per_step = loop.batch_size * loop.grad_accum * block
    console.out.print(f"device {device} ({precision}); {tokens_per_step:,} tokens/step, {loop.steps} steps "
                      f"= {tokens_per_step * loop.steps / 1e6:.2f}M tokens; MFU peak {peak / 1e12:.2f} TFLOP/s "
                      f"({peak_source})")

    tokenizer = prepared.tokenizer()
    bytes_per_token_val = prepared.bytes_per_token("val")
    (run_dir / "config.yaml").write_text(_yaml(cfg))
    metrics_file = JsonlWriter(run_dir / "metrics.jsonl")
    logger = SafeLogger(LOGGER.build(job.logger))
    logger.start(run_dir, {**cfg, "model_card": card})

    def save(step: int, state: dict) -> Path:
        return save_checkpoint(
            run_dir / "checkpoints", step, model, spec.to_dict(), cfg, prepared.path / "tokenizer.json",
            state={**state, "data_rng": sampler.state(), "data_key": prepared.meta["key"],
                   "eos": prepared.meta["eos"], "bytes_per_token": {s: prepared.bytes_per_token(s) for s in ("train", "val")}},
            trainer_state={"optimizer": optimizer.state_dict(), "torch_rng": torch.get_rng_state(),
                           "mask_rng": mask_rng.get_state()},
            keep=loop.keep_checkpoints)

    def run_eval(step: int) -> tuple[dict[str, float], list[tuple[str, str]]]:
        res = evaluate_loss(model, val_tokens, block, loop.batch_size, device, amp, loop.eval_windows or None)
        out = {"val/loss": res["loss"], "val/ppl": res["ppl"], "val/accuracy": res["accuracy"]}
        if model.objective.causal:  # bits per byte of a masked-token loss would mean nothing
            out["val/bpb"] = bits_per_byte(res["loss"], 1, bytes_per_token_val)
            samples = complete_prompts(model, tokenizer, loop.prompts, loop.sample_tokens, device, job.seed)
        else:
            samples = []
        return out, samples

    progress = Progress(SpinnerColumn(), TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
                        TimeRemainingColumn(), TextColumn("{task.fields[status]}"), console=console.out)
    history: list[dict[str, float]] = []
    tok_rates: list[float] = []
    t_start = time.perf_counter()
    tokens_seen, start_step = 0, 0
    last_val: dict[str, float] = {}
    ckpt_path = None
    resume_from = latest_in_run(run_dir) if loop.resume == "auto" else loop.resume
    if resume_from:
        # everything that decides the next step: weights, optimizer, RNGs, data position
        try:
            ckpt = load_checkpoint(resume_from)
        except UserError as e:
            raise UserError(f"train.resume: {str(e).removeprefix('ckpt: ')}") from e
        load_weights(model, ckpt.weights, ckpt.path)
        trainer = ckpt.trainer_state() or {}
        if "optimizer" in trainer:
            optimizer.load_state_dict(trainer["optimizer"])
        if "torch_rng" in trainer:
            torch.set_rng_state(trainer["torch_rng"])
        if "mask_rng" in trainer:
            mask_rng.set_state(trainer["mask_rng"])
        sampler.load_state(ckpt.state["data_rng"])
        start_step, tokens_seen = int(ckpt.state["step"]), int(ckpt.state.get("tokens_seen", 0))
        last_val = ckpt.state.get("val") or {}
        console.out.print(f"resumed from {ckpt.path} at step {start_step}")
        if start_step >= loop.steps and (run_dir / "summary.json").is_file():
            console.out.print(f"{run_dir} finished all {loop.steps} steps already; nothing to do")
            metrics_file.close()
            logger.finish()
            return json.loads((run_dir / "summary.json").read_text())
    done = start_step
    stop = StopRequest()
    model.train()
    with progress, stop:
        task = progress.add_task("train", total=loop.steps, status="", completed=start_step)
        t_window, loss_acc, n_acc = time.perf_counter(), torch.zeros((), device=device), 0
        extra_acc: dict[str, torch.Tensor] = {}
        for step in range(start_step, loop.steps):
            multiplier = schedule(step)
            for group in optimizer.param_groups:
                group["lr"] = group["base_lr"] * multiplier
            lr = job.optim.lr * multiplier
            for _ in range(loop.grad_accum):
                x, y = model.objective.make_batch(sampler.next_window(), model.vocab_size, mask_rng)
                x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
                with amp:
                    out = step_model(x, y)
                scaler.scale(out.loss / loop.grad_accum).backward()
                loss_acc += out.metrics["loss/main"]
                for key, value in out.metrics.items():
                    if key != "loss/main":
                        extra_acc[key] = extra_acc.get(key, 0.0) + value
                n_acc += 1
            if scaler.is_enabled():
                scaler.unscale_(optimizer)  # clip the true gradients, not the scaled ones
            grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), loop.grad_clip or float("inf"))
            if scaler.is_enabled():
                scaler.step(optimizer)  # skips the step if the scaled gradients overflowed
                scaler.update()
            else:
                optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            tokens_seen += tokens_per_step
            done = step + 1

            if done % loop.log_every == 0 or done == loop.steps:
                synchronize(device)
                dt = time.perf_counter() - t_window
                steps_in_window = n_acc // loop.grad_accum
                tok_s = steps_in_window * tokens_per_step / dt
                if step >= loop.log_every:  # the first window includes warm-up and compilation
                    tok_rates.append(tok_s)
                record = {"step": done, "train/loss": float(loss_acc) / n_acc, "train/lr": lr,
                          "train/grad_norm": float(grad_norm), "train/tokens": tokens_seen,
                          "perf/tokens_per_s": tok_s, "perf/mfu": card["flops_per_token"] * tok_s / peak,
                          **{f"perf/{k}": v for k, v in memory_stats(device).items()},
                          **{k: float(v) / n_acc for k, v in extra_acc.items()}}
                check_finite(record["train/loss"], done, ckpt_path)
                history.append(record)
                metrics_file.write(record)
                logger.log({k: v for k, v in record.items() if k != "step"}, done)
                status = (f"loss {record['train/loss']:.3f}  lr {lr:.2e}  grad {record['train/grad_norm']:.2f}  "
                          f"{tok_s:,.0f} tok/s  MFU {record['perf/mfu']:.1%}")
                progress.update(task, status=status)
                if not console.out.is_terminal:  # a log file gets a line per log step instead of a live bar
                    progress.console.print(f"step {done:>6}/{loop.steps}  {status}")
                t_window, loss_acc, n_acc = time.perf_counter(), torch.zeros((), device=device), 0
                extra_acc = {}

            if loop.max_time is not None and time.perf_counter() - t_start >= loop.max_time and not stop.requested:
                stop.requested = f"train.max_time={loop.max_time:g}s"
            is_last = done == loop.steps
            if (loop.eval_every and done % loop.eval_every == 0) or is_last:
                t_eval = time.perf_counter()
                last_val, samples = run_eval(done)
                record = {"step": done, **last_val, "train/tokens": tokens_seen}
                metrics_file.write(record)
                logger.log(last_val, done)
                logger.log_samples(samples, done)
                bpb = f"  bpb {last_val['val/bpb']:.4f}" if "val/bpb" in last_val else ""
                progress.console.print(f"step {done:>6}  val loss {last_val['val/loss']:.4f}  "
                                       f"ppl {last_val['val/ppl']:.2f}  acc {last_val['val/accuracy']:.3f}{bpb}")
                for prompt, text in samples:
                    progress.console.print(f"  {prompt!r} -> {text[:120]!r}", style="dim")
                t_window += time.perf_counter() - t_eval  # eval time is not training throughput
            if (loop.ckpt_every and done % loop.ckpt_every == 0) or is_last or stop.requested:
                check_finite(float(out.metrics["loss/main"]), done, ckpt_path)  # never save a diverged model
                t_ckpt = time.perf_counter()
                ckpt_path = save(done, {"tokens_seen": tokens_seen, "val": last_val})
                t_window += time.perf_counter() - t_ckpt
            progress.update(task, completed=done)
            if stop.requested:
                progress.console.print(
                    f"stopped by {stop.requested} after step {done}; checkpoint {ckpt_path}. To continue, run the "
                    f"same command with hydra.run.dir={run_dir} (or train.resume={ckpt_path})", style="yellow")
                break

    elapsed = time.perf_counter() - t_start
    train_losses = [h["train/loss"] for h in history if "train/loss" in h]
    summary = {
        "run_dir": str(run_dir), "steps": done, "tokens": tokens_seen, "elapsed_s": round(elapsed, 2),
        "train_loss": train_losses[-1] if train_losses else None,
        "val_loss": last_val.get("val/loss"), "val_bpb": last_val.get("val/bpb"), "val_ppl": last_val.get("val/ppl"),
        "val_accuracy": last_val.get("val/accuracy"), "objective": spec.objective.kind,
        "best_checkpoint": str(best_checkpoint(run_dir / "checkpoints") or ckpt_path),
        "best_val_loss": min([h["val/loss"] for h in history if "val/loss" in h] + (
            [last_val["val/loss"]] if "val/loss" in last_val else []), default=None),
        "interrupted": bool(stop.requested),
        "tokens_per_s": statistics.median(tok_rates) if tok_rates else (history[-1]["perf/tokens_per_s"] if history else None),
        "tokens_per_s_mean": statistics.fmean(tok_rates) if tok_rates else None,
        "wall_s": round(time.perf_counter() - t_begin, 2),
        "device": str(device), "precision": precision, "checkpoint": str(ckpt_path) if ckpt_path else None,
        "data": str(prepared.path), **card,
    }
    summary["mfu"] = card["flops_per_token"] * (summary["tokens_per_s"] or 0) / peak
    summary["tokens_per_s"] = summary["tokens_per_s"] or 0.0
    (run_dir / "summary.json").write_text(json.dumps(summary, indent=2))
    metrics_file.close()
    logger.log({"summary/val_loss": summary["val_loss"] or float("nan")}, done)
    logger.finish()
    bpb = f" ({summary['val_bpb']:.3f} bits/byte)" if summary["val_bpb"] is not None else ""
    val = f"{summary['val_loss']:.4f}" if summary["val_loss"] is not None else "n/a"
    console.out.print(f"done: {done} steps in {elapsed / 60:.1f} min; val loss {val}{bpb}; "
                      f"{summary['tokens_per_s']:,.0f} tok/s, MFU {summary['mfu']:.1%}", style="green")
    console.out.print(f"checkpoint: {ckpt_path}")
    return summary


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
