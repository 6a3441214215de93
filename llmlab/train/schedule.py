"""Learning-rate schedules (config group ``sched``): a multiplier of ``optim.lr`` per step."""

from __future__ import annotations

import math
from dataclasses import dataclass

from llmlab.registry import Registry, bounded, choice

SCHEDULE = Registry("sched", group="sched")


class Schedule:
    @dataclass
    class Config:
        kind: str = ""
        warmup: int = bounded(50, at_least=0)  # steps of linear warm-up from 0

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


@dataclass
class DecayConfig(Schedule.Config):
    """Settings of a schedule that decays to a floor of ``min_lr_ratio`` times the peak."""

    min_lr_ratio: float = bounded(0.0, at_least=0, at_most=1)


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


@SCHEDULE.register("constant")
class Constant(Schedule):
    """Linear warm-up, then optim.lr to the end."""

    @dataclass
    class Config(Schedule.Config):
        kind: str = "constant"

    def after_warmup(self, progress: float) -> float:
        return 1.0


@SCHEDULE.register("linear")
class Linear(Schedule):
    """Linear decay to ``min_lr_ratio`` of the peak."""

    @dataclass
    class Config(DecayConfig):
        kind: str = "linear"

    def after_warmup(self, progress: float) -> float:
        return 1 - (1 - self.cfg.min_lr_ratio) * progress


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

    def __call__(self, step: int) -> float:
        if step < self.warmup:
            return (step + 1) / self.warmup
        decay_steps = max(1, round(self.cfg.decay_fraction * self.total))
        decay_start = self.total - decay_steps
        if step < decay_start:
            return 1.0
        progress = min(1.0, (step - decay_start + 1) / decay_steps)
        r = self.cfg.min_lr_ratio
        if self.cfg.cooldown == "cosine":
            return r + (1 - r) * 0.5 * (1 + math.cos(math.pi * progress))
        return 1 - (1 - r) * progress
