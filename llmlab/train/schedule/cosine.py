"""The ``sched=cosine`` learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.registry import bounded
from llmlab.train.schedule import SCHEDULE, DecayConfig, Schedule


@SCHEDULE.register("cosine")
class Cosine(Schedule):
    """Cosine decay to ``min_lr_ratio`` of the peak (Loshchilov & Hutter 2017, SGDR)."""

    @dataclass
    class Config(DecayConfig):
        kind: str = "cosine"
        min_lr_ratio: float = bounded(0.1, at_least=0, at_most=1)

    def after_warmup(self, progress: float) -> float:
        r = self.cfg.min_lr_ratio
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))
