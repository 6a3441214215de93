"""Learning-rate schedules (config group ``sched``): a multiplier of ``optim.lr`` per step.
Each kind is one file in this package, its class registered with ``@SCHEDULE.register(name)``
and holding its nested ``Config``; the package finds them all (`llmlab.registry.discover`).

Every schedule warms up linearly first. Its length is ``sched.warmup`` steps, or
``sched.warmup_share`` of the run's steps. Unset, it is `DEFAULT_WARMUP` steps, except in a run
whose length is a FLOP budget (``train.max_flops``): there it is `BUDGET_WARMUP_SHARE` of the
run. A budget sweep's runs range from tens of steps (a large model at a small budget) to
thousands, and a fixed step count would be most of the shortest ones: a share keeps every run's
schedule the same shape, so the sweep compares sizes and budgets, not warm-up lengths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

from llmlab.errors import ConfigError
from llmlab.names import parse_flops
from llmlab.registry import Checked, Registry, bounded, discover

SCHEDULE = Registry("sched", group="sched")

DEFAULT_WARMUP = 50  # steps, when neither sched.warmup nor sched.warmup_share is set
BUDGET_WARMUP_SHARE = 0.05  # of the run's steps, in a train.max_flops run with neither set


def warmup_steps(cfg, total_steps: int, budget_run: bool = False) -> int:
    """The warm-up's length in steps: ``warmup``, or ``warmup_share`` of ``total_steps``, or the
    default (`DEFAULT_WARMUP` steps; `BUDGET_WARMUP_SHARE` of a FLOP-budget run); at most the run."""
    if cfg.warmup_share is not None:
        steps = round(cfg.warmup_share * total_steps)
    elif cfg.warmup is not None:
        steps = cfg.warmup
    else:
        steps = round(BUDGET_WARMUP_SHARE * total_steps) if budget_run else DEFAULT_WARMUP
    return min(steps, total_steps)


class Schedule:
    @dataclass
    class Config(Checked):
        kind: str = ""
        warmup: int | None = bounded(None, at_least=0)  # steps of linear warm-up from 0; null: 50, or 5% of a train.max_flops run
        warmup_share: float | None = bounded(None, at_least=0, below=1)  # the warm-up as a share of the run's steps (instead of warmup)
        branches: list[int] = field(default_factory=list)  # wsd: steps where a cooldown branch ends, each a finished run under <run dir>/branches/<step>/
        branch_flops: list[Any] = field(default_factory=list)  # wsd: the same, each branch's length a training-FLOPs budget (1e11)
        # whether the schedule holds a constant rate that cooldown branches can leave (`branch_plan`)
        forks: ClassVar[bool] = False

        def check(self, prefix: str) -> None:
            if self.warmup is not None and self.warmup_share is not None:
                raise ConfigError(f"{prefix}.warmup_share: set either {prefix}.warmup (steps) or {prefix}.warmup_share "
                                  f"(a share of the run), not both: warmup={self.warmup}, warmup_share={self.warmup_share}")
            for key, values in (("branches", self.branches), ("branch_flops", self.branch_flops)):
                if values and not self.forks:
                    raise ConfigError(f"{prefix}.{key}: a cooldown branch leaves a constant learning rate, which "
                                      f"{prefix}={self.kind} does not hold; use {prefix}=wsd")
            for value in self.branches:
                if value < 1:
                    raise ConfigError(f"{prefix}.branches: each branch ends at a step >= 1, got {value}")
            for key, values in (("branches", self.branches), ("branch_flops", self.branch_flops)):
                seen: dict[float, Any] = {}
                for value in values:
                    number = value if key == "branches" else parse_flops(value, f"{prefix}.{key}")
                    if number in seen:
                        raise ConfigError(f"{prefix}.{key}: {value} is given twice; each branch is one run")
                    seen[number] = value

        def branch_budgets(self, prefix: str = "sched") -> list[float]:
            """``branch_flops`` as numbers (each may be written ``1e11`` or ``2e10*5``)."""
            return [parse_flops(v, f"{prefix}.branch_flops") for v in self.branch_flops]

    def __init__(self, cfg, total_steps: int, budget_run: bool = False):
        self.cfg = cfg
        self.total = max(1, total_steps)
        self.warmup = warmup_steps(cfg, self.total, budget_run)

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


discover(__name__, __path__)  # every kind's file, each registering itself
