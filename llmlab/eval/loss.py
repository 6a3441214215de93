"""Held-out loss: mean next-token cross-entropy, perplexity and bits per byte."""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import torch
import torch.nn.functional as F

from llmlab.data.batches import fixed_windows, num_fixed_windows


def bits_per_byte(loss_nats_per_token: float, tokens: int, nbytes: int) -> float:
    """Convert a per-token loss to bits per byte of the source text, so models with
    different tokenizers (and compressors) compare on one scale."""
    return loss_nats_per_token * tokens / (nbytes * math.log(2))


@torch.no_grad()
def evaluate_loss(model, tokens: np.ndarray, block: int, batch: int, device: torch.device, autocast,
                  max_windows: int | None = None, on_batch: Callable[[int], None] | None = None) -> dict:
    """Mean loss over fixed non-overlapping windows of ``tokens``; every scored token counts once."""
    was_training = model.training
    model.eval()
    total, count = torch.zeros((), dtype=torch.float64, device=device), 0
    for x, y in fixed_windows(tokens, block, batch, max_windows):
        x, y = x.to(device), y.to(device)
        with autocast:
            logits, _, _ = model(x)
        nll = F.cross_entropy(logits.float().view(-1, logits.shape[-1]), y.reshape(-1), reduction="sum")
        total += nll.double()
        count += y.numel()
        if on_batch is not None:
            on_batch(x.shape[0])
    model.train(was_training)
    loss = float(total) / max(1, count)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count,
            "windows": num_fixed_windows(tokens, block, max_windows)}
