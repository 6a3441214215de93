"""Held-out loss: mean next-token cross-entropy, perplexity and bits per byte."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from llmlab.data.batches import fixed_window_batches, num_fixed_windows
from llmlab.model.objective import IGNORE


def bits_per_byte(loss_nats_per_token: float, tokens: int, nbytes: int) -> float:
    """Convert a per-token loss to bits per byte of the source text, so models with
    different tokenizers (and compressors) compare on one scale."""
    return loss_nats_per_token * tokens / (nbytes * math.log(2))


@torch.no_grad()
def evaluate_loss(model, tokens: np.ndarray, block: int, batch: int, device: torch.device, autocast,
                  max_windows: int | None = None, on_batch: Callable[[int], None] | None = None,
                  seed: int = 0) -> dict:
    """Mean loss and accuracy over fixed non-overlapping windows of ``tokens``, built into
    inputs and targets by the model's objective (next token, or masked tokens with a fixed
    seed so that repeated evals mask the same positions). Every scored token counts once."""
    was_training = model.training
    model.eval()
    generator = torch.Generator().manual_seed(seed)
    # per position in the window: summed loss, scored tokens, correct predictions
    pos_loss = torch.zeros(block, dtype=torch.float64, device=device)
    pos_count = torch.zeros(block, dtype=torch.long, device=device)
    pos_correct = torch.zeros(block, dtype=torch.long, device=device)
    for window in fixed_window_batches(tokens, block, batch, max_windows):
        x, y = model.objective.make_batch(window, model.vocab_size, generator)
        x, y = x.to(device), y.to(device)
        with autocast:
            logits = model(x).logits
        logits = logits.float()  # (B, T, V)
        scored = y != IGNORE  # (B, T)
        nll = F.cross_entropy(logits.transpose(1, 2), y, ignore_index=IGNORE, reduction="none")  # (B, T)
        pos_loss += nll.double().sum(0)
        pos_count += scored.sum(0)
        pos_correct += (logits.argmax(-1).eq(y) & scored).sum(0)
        if on_batch is not None:
            on_batch(window.shape[0])
    model.train(was_training)
    count = int(pos_count.sum())
    loss = float(pos_loss.sum()) / max(1, count)
    counts = pos_count.tolist()
    per_position = {
        "position": list(range(block)),
        "loss": [s / c if c else None for s, c in zip(pos_loss.tolist(), counts)],
        "accuracy": [k / c if c else None for k, c in zip(pos_correct.tolist(), counts)],
        "tokens": counts,
    }
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "accuracy": int(pos_correct.sum()) / max(1, count),
            "tokens": count, "windows": num_fixed_windows(tokens, block, max_windows), "per_position": per_position}
