"""Tensors made once and kept across calls (packed weights, rotary tables, a shortlist head)."""

from __future__ import annotations

from contextlib import contextmanager
from typing import Iterator

import torch


@contextmanager
def kept_tensors() -> Iterator[None]:
    """Make ordinary tensors with no autograd history, also when the caller decodes in
    inference mode: a tensor made under inference mode could not be used by the training
    that follows (distillation, training after a sample)."""
    with torch.inference_mode(False), torch.no_grad():
        yield
