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
    total = torch.zeros((), dtype=torch.float64, device=device)
    correct = torch.zeros((), dtype=torch.long, device=device)
    count = 0
    for window in fixed_window_batches(tokens, block, batch, max_windows):
        x, y = model.objective.make_batch(window, model.vocab_size, generator)
        x, y = x.to(device), y.to(device)
        with autocast:
            logits = model(x).logits
        logits = logits.float().reshape(-1, logits.shape[-1])
        y = y.reshape(-1)
        scored = y != IGNORE
        total += F.cross_entropy(logits, y, ignore_index=IGNORE, reduction="sum").double()
        correct += (logits.argmax(-1).eq(y) & scored).sum()
        count += int(scored.sum())
        if on_batch is not None:
            on_batch(window.shape[0])
    model.train(was_training)
    loss = float(total) / max(1, count)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "accuracy": float(correct) / max(1, count),
            "tokens": count, "windows": num_fixed_windows(tokens, block, max_windows)}
