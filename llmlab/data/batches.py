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


def check_ids(tokens, vocab: int, source: str) -> None:
    """Every id in ``tokens`` (an array, or a `TokenStore`'s shards one at a time) below
    ``vocab``, or one line naming where the data came from."""
    top = max((int(a.max()) for a in getattr(tokens, "arrays", [tokens]) if a.size), default=-1)
    if top >= vocab:
        raise UserError(f"data: {source} holds token id {top}, past the vocabulary of {vocab:,}: "
                        "the cache entry is damaged; delete it to prepare the data again")


class RandomWindows:
    """Uniformly random windows of ``block + 1`` tokens; inputs are the first ``block``,
    targets the last ``block`` (inputs shifted by one).

    The stream depends on ``seed`` alone: every call draws the starts of the whole global
    batch (``batch`` windows for each of ``world`` ranks) and a rank keeps its own slice. So
    two runs with one seed see the same batches, and N processes with batch b see exactly
    what one process with batch N*b sees. The generator's state is part of a checkpoint, so
    resume continues the same stream."""

    def __init__(self, tokens: np.ndarray, block: int, batch: int, seed: int, rank: int = 0, world: int = 1,
                 vocab: int | None = None, source: str = "the train split"):
        check_length(tokens, block, "train")
        self.tokens, self.block, self.batch = tokens, block, batch
        self.rank, self.world = rank, world
        self.vocab, self.source = vocab, source
        self.rng = np.random.default_rng([seed, 0])

    def next_window(self) -> torch.Tensor:
        """(batch, block + 1) token ids; an objective turns them into inputs and targets. Each
        batch's ids are checked against ``vocab`` (one max over the batch): an id past the
        embedding is a damaged shard, which on CUDA would be a device-side assert."""
        starts = self.rng.integers(0, len(self.tokens) - self.block, size=self.batch * self.world)
        starts = starts[self.rank * self.batch:(self.rank + 1) * self.batch]
        window = np.stack([self.tokens[s:s + self.block + 1] for s in starts])
        if self.vocab is not None:
            check_ids(window, self.vocab, self.source)
        return torch.from_numpy(window.astype(np.int64))

    def state_dict(self) -> dict:
        """Where the window stream is: numpy's generator state (JSON-safe)."""
        return self.rng.bit_generator.state

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state


def window_starts(tokens: np.ndarray, block: int, max_windows: int | None = None) -> np.ndarray:
    """Starts of non-overlapping windows of ``block + 1`` tokens. All of them, or
    ``max_windows`` spread evenly over the split so a partial eval sees all of it."""
    check_length(tokens, block, "val")
    n = (len(tokens) - 1) // block
    index = np.arange(n)
    if max_windows is not None and max_windows < n:
        index = np.linspace(0, n - 1, max_windows).round().astype(np.int64)
    return index * block


def fixed_window_batches(tokens: np.ndarray, block: int, batch: int, max_windows: int | None = None):
    """Fixed windows in order (see `window_starts`), as (batch, block + 1) tensors; the last
    batch may be smaller."""
    starts = window_starts(tokens, block, max_windows)
    for first in range(0, len(starts), batch):
        yield torch.from_numpy(np.stack([tokens[s:s + block + 1] for s in starts[first:first + batch]]).astype(np.int64))


def num_fixed_windows(tokens: np.ndarray, block: int, max_windows: int | None = None) -> int:
    n = (len(tokens) - 1) // block
    return n if max_windows is None else min(n, max_windows)
