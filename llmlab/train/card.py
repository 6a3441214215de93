"""What a run says about itself: the model card at the start and the summary at the end
(``summary.json``, what `llmlab report` reads)."""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import torch

from llmlab import console
from llmlab.model.cache import cache_dtype
from llmlab.model.transformer import ModelSpec, Transformer
from llmlab.train.device import amp_dtype
from llmlab.perf import describe, is_number as _number, rate

# Decode speed in the summary: the same prompt length, new tokens and batch for every run (fewer
# only where the context is shorter; the summary records the setting used).
DECODE_SETTING = {"prompt_tokens": 16, "tokens": 48, "repeats": 5}


def model_card(model: Transformer, seq_len: int, precision: str, device_type: str) -> dict[str, Any]:
    """What the run's model is and costs. The KV cache in the dtype decoding on ``device_type``
    under ``precision`` keeps it in (`llmlab.model.cache.cache_dtype`)."""
    counts = model.param_counts()
    cache = cache_dtype(torch.float32, device_type, amp_dtype(precision))
    return {"params": counts["total"], "params_embedding": counts["embedding"],
            "params_non_embedding": counts["non_embedding"], "params_active": counts["active"],
            "flops_per_token": model.flops_per_token(seq_len),
            "kv_cache_bytes_per_token": model.kv_cache_bytes_per_token(cache.itemsize),
            "kv_cache_dtype": "fp32" if cache == torch.float32 else precision, "caveats": model.caveats()}


def print_model_card(model: Transformer, card: dict[str, Any]) -> None:
    spec: ModelSpec = model.spec
    m = spec.model
    parts = (f"{spec.attention.kind} attention, {spec.norm.placement}-norm {spec.norm.kind}, {spec.pos.kind} positions, "
             f"{spec.ffn.kind} FFN, {'tied' if m.tie_embeddings else 'untied'} head"
             + (f", {m.mtp_heads} MTP heads" if m.mtp_heads else "")
             + (f", objective {spec.objective.kind}" if spec.objective.kind != "clm" else ""))
    console.out.print(f"model {m.name}: d_model {m.d_model}, {m.n_layers} layers, {m.n_heads} heads, "
                      f"context {m.max_seq_len}, vocab {spec.vocab_size:,}; {parts}")
    window = model.blocks[0].attn.window() if len(model.blocks) else None
    console.out.print(f"  params {card['params'] / 1e6:.2f}M (embedding {card['params_embedding'] / 1e6:.2f}M, "
                      f"non-embedding {card['params_non_embedding'] / 1e6:.2f}M"
                      + (f", active {card['params_active'] / 1e6:.2f}M" if card["params_active"] != card["params"] else "")
                      + "); "
                      f"{card['flops_per_token'] / 1e6:.1f} MFLOPs/token (train); "
                      f"KV cache {card['kv_cache_bytes_per_token']:,} B/token ({card['kv_cache_dtype']})"
                      + (f", at most {window} positions" if window is not None else ""))
    for caveat in card["caveats"]:
        console.err.print(f"warning: {caveat}", style="yellow")


def summarize(history: list[dict], rates: list[float], loads: list[tuple[float, float]]) -> dict[str, Any]:
    """The losses and the training speed of a run's metrics: the last train loss, the best
    validation loss, and the median tokens/s over log windows with its spread and the other
    load the windows ran under (time-weighted)."""
    # a resumed run's history comes from metrics.jsonl, a file a hand may have edited: numbers only
    train_losses = [h["train/loss"] for h in history if _number(h.get("train/loss"))]
    val_losses = [h["val/loss"] for h in history if _number(h.get("val/loss"))]
    load = sum(t * x for t, x in loads) / sum(t for t, _ in loads) if loads else None
    speed = rate(rates, load) if rates else rate([next(
        (h["perf/tokens_per_s"] for h in reversed(history) if _number(h.get("perf/tokens_per_s"))), 0.0)], load)
    return {"train_loss": train_losses[-1] if train_losses else None, "val_losses": val_losses, "speed": speed,
            "tokens_per_s_mean": statistics.fmean(rates) if rates else None,
            "loss_spikes": sum(spike(train_losses[max(0, i - SPIKE_WINDOW):i], loss) is not None
                               for i, loss in enumerate(train_losses))}


SPIKE_WINDOW = 20  # the log windows a loss is compared with
SPIKE_RISE = 0.1  # ... and how far above their median it must be, as a share of it


def spike(before: list[float], loss: float) -> float | None:
    """The median of the last `SPIKE_WINDOW` log windows' losses where ``loss`` jumps well
    above them: over 10% above their median and over 6 median absolute deviations (their own
    spread: a loss still falling fast spreads wide); None otherwise, or with fewer than 5."""
    recent = before[-SPIKE_WINDOW:]
    if len(recent) < 5:
        return None
    median = statistics.median(recent)
    spread = statistics.median(abs(x - median) for x in recent)
    return median if loss > median * (1 + SPIKE_RISE) and loss - median > 6 * spread else None


def print_done(summary: dict[str, Any], speed, elapsed: float, ckpt_path: Path | None) -> None:
    bpb = f" ({summary['val_bpb']:.3f} bits/byte)" if summary["val_bpb"] is not None else ""
    val = f"{summary['val_loss']:.4f}" if summary["val_loss"] is not None else "n/a"
    console.out.print(f"done: {summary['steps']} steps in {elapsed / 60:.1f} min; val loss {val}{bpb}; "
                      f"{describe(speed)}, MFU {summary['mfu']:.1%}", style="green")
    console.out.print(f"checkpoint: {ckpt_path}")


def finished_summary(run_dir: Path, rid: str) -> dict | None:
    """The summary of a run of this config that already ran to its end in ``run_dir``."""
    try:
        summary = json.loads((Path(run_dir) / "summary.json").read_text())
    except (OSError, ValueError):
        return None
    if isinstance(summary, dict) and summary.get("run_id") == rid and not summary.get("interrupted"):
        return summary
    return None


def stopped_by_signal(summary: dict) -> bool:
    """Whether a run stopped early because it was asked to (SIGINT, SIGTERM), not at a budget."""
    reason = summary.get("stopped_by")
    return bool(reason) and not reason.startswith("train.")
