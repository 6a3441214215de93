"""The ``sched=constant`` learning-rate schedule."""

from __future__ import annotations

from dataclasses import dataclass

from llmlab.train.schedule import SCHEDULE, Schedule


@SCHEDULE.register("constant")
class Constant(Schedule):
    """Linear warm-up, then optim.lr to the end."""

    @dataclass
    class Config(Schedule.Config):
        kind: str = "constant"

    def after_warmup(self, progress: float) -> float:
        return 1.0
