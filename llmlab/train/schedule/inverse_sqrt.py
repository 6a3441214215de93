"""The ``sched=inverse_sqrt`` learning-rate schedule."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.registry import bounded
from llmlab.train.schedule import SCHEDULE, Schedule


@SCHEDULE.register("inverse_sqrt")
class InverseSqrt(Schedule):
    """Inverse square-root decay (Vaswani et al. 2017, section 5.3): after the warm-up the rate
    falls as one over the square root of the steps, with no set end, so a run can be extended
    without a new schedule."""

    @dataclass
    class Config(Schedule.Config):
        kind: str = "inverse_sqrt"
        timescale: int | None = bounded(None, at_least=1)  # steps after the warm-up until the rate is 1/sqrt(2) of the peak; null: the warm-up's length

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        timescale = self.cfg.timescale or max(1, self.warmup)
        return math.sqrt(timescale / (timescale + step + 1 - self.warmup))
