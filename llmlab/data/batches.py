"""Batches of token windows: random for training, fixed for evaluation."""

from __future__ import annotations

import numpy as np
import torch

from llmlab.errors import UserError


def check_length(tokens: np.ndarray, block: int, split: str) -> None:
    if len(tokens) < block + 1:
        raise UserError(
            f"data: the {split} split has {len(tokens):,} tokens, fewer than one block of "
            f"model.max_seq_len+1={block + 1}; give more text or lower model.max_seq_len")


class RandomWindows:
    """Uniformly random windows of ``block + 1`` tokens; inputs are the first ``block``,
    targets the last ``block`` (inputs shifted by one). Each rank draws its own stream; the
    generator's state is part of a checkpoint, so resume continues the same stream."""

    def __init__(self, tokens: np.ndarray, block: int, batch: int, seed: int, rank: int = 0):
        check_length(tokens, block, "train")
        self.tokens, self.block, self.batch = tokens, block, batch
        self.rng = np.random.default_rng([seed, rank])

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        starts = self.rng.integers(0, len(self.tokens) - self.block, size=self.batch)
        rows = np.stack([self.tokens[s:s + self.block + 1] for s in starts]).astype(np.int64)
        data = torch.from_numpy(rows)
        return data[:, :-1], data[:, 1:]

    def state(self) -> dict:
        return self.rng.bit_generator.state

    def load_state(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def fixed_windows(tokens: np.ndarray, block: int, batch: int, max_windows: int | None = None):
    """Non-overlapping windows from the start of ``tokens``, in order: every token is scored
    once. Yields (inputs, targets) batches; the last batch may be smaller."""
    check_length(tokens, block, "val")
    n = (len(tokens) - 1) // block
    if max_windows is not None:
        n = min(n, max_windows)
    for first in range(0, n, batch):
        idx = range(first, min(n, first + batch))
        rows = np.stack([tokens[i * block: i * block + block + 1] for i in idx]).astype(np.int64)
        data = torch.from_numpy(rows)
        yield data[:, :-1], data[:, 1:]


def num_fixed_windows(tokens: np.ndarray, block: int, max_windows: int | None = None) -> int:
    n = (len(tokens) - 1) // block
    return n if max_windows is None else min(n, max_windows)
