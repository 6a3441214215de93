"""The ``sched=linear`` learning-rate schedule."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.train.schedule import SCHEDULE, DecayConfig, Schedule


@SCHEDULE.register("linear")
class Linear(Schedule):
    """Linear decay to ``min_lr_ratio`` of the peak."""

    @dataclass
    class Config(DecayConfig):
        kind: str = "linear"

    def after_warmup(self, progress: float) -> float:
        return 1 - (1 - self.cfg.min_lr_ratio) * progress
