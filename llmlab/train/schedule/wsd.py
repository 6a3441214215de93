"""The ``sched=wsd`` learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

from llmlab.registry import bounded, choice
from llmlab.train.schedule import SCHEDULE, DecayConfig, Schedule


@SCHEDULE.register("wsd")
class WarmupStableDecay(Schedule):
    """Warmup-stable-decay (Hu et al. 2024, MiniCPM, section 4): hold the peak, then cool down
    over the last ``decay_fraction`` of training, linearly or along a cosine, to
    ``min_lr_ratio``."""

    @dataclass
    class Config(DecayConfig):
        kind: str = "wsd"
        decay_fraction: float = bounded(0.2, above=0, at_most=1)
        cooldown: str = choice("linear", ("linear", "cosine"))  # the shape of the final decay
        forks: ClassVar[bool] = True

    @property
    def decay_start(self) -> int:
        """The first step whose rate is below the peak: a run of this length and a longer one
        with the same warm-up agree on every step before it (where a cooldown branch forks)."""
        return self.total - max(1, round(self.cfg.decay_fraction * self.total))

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        decay_start = self.decay_start
        decay_steps = self.total - decay_start
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        r = self.cfg.min_lr_ratio
        if self.cfg.cooldown == "cosine":
            return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1 - (1 - r) * progress
