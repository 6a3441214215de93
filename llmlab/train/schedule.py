"""Learning-rate schedules (config group ``sched``): a multiplier of ``optim.lr`` per step."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.errors import ConfigError
from llmlab.registry import Registry

SCHEDULE = Registry("sched")


class Schedule:
    @dataclass
    class Config:
        kind: str = ""
        warmup: int = 100  # steps of linear warm-up from 0

        def check(self, prefix: str) -> None:
            if self.warmup < 0:
                raise ConfigError(f"{prefix}.warmup: must be >= 0, got {self.warmup}")

    def __init__(self, cfg, total_steps: int):
        self.cfg = cfg
        self.total = max(1, total_steps)
        self.warmup = min(cfg.warmup, self.total)

    def __call__(self, step: int) -> float:
        """Multiplier for the update made at ``step`` (0-based)."""
        if step < self.warmup:
            return (step + 1) / self.warmup
        span = max(1, self.total - self.warmup)
        return self.after_warmup(min(1.0, (step - self.warmup) / span))

    def after_warmup(self, progress: float) -> float:
        raise NotImplementedError


@SCHEDULE.register("cosine")
class Cosine(Schedule):
    """Cosine decay to ``min_lr_ratio`` of the peak (Loshchilov & Hutter 2017, SGDR)."""

    @dataclass
    class Config(Schedule.Config):
        kind: str = "cosine"
        min_lr_ratio: float = 0.1

        def check(self, prefix: str) -> None:
            super().check(prefix)
            if not 0 <= self.min_lr_ratio <= 1:
                raise ConfigError(f"{prefix}.min_lr_ratio: must be in [0, 1], got {self.min_lr_ratio}")

    def after_warmup(self, progress: float) -> float:
        r = self.cfg.min_lr_ratio
        return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))


@SCHEDULE.register("constant")
class Constant(Schedule):
    @dataclass
    class Config(Schedule.Config):
        kind: str = "constant"

    def after_warmup(self, progress: float) -> float:
        return 1.0
