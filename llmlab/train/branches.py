"""Cooldown branches: one WSD run serves many lengths (Hägele et al. 2024, "Scaling Laws and
Compute-Optimal Training Beyond Fixed Training Durations", section 3).

A WSD run of S steps and one of T > S steps with the same warm-up take the same rate at every
step before the shorter one's cooldown starts (`WarmupStableDecay.decay_start`), so they are the
same run up to there. ``sched.branches=[S, ...]`` (or ``sched.branch_flops=[C, ...]``) saves the
long run's whole state at each such fork into ``<run dir>/branches/<S>/`` with the records up to
it; once the long run has finished, each branch resumes from its fork with its own schedule and
ends as the finished run ``train.steps=S`` (``train.max_flops=C``) would have made: its own
summary.json, metrics.jsonl and checkpoints, which `llmlab report`, `eval` and `sample` take
like any run. On one process in fp32 a branch equals that run bit for bit (tests/train/test_branches.py).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Mapping

from llmlab.errors import ConfigError
from llmlab.files import atomic_write_bytes, atomic_write_text, own_dir
from llmlab.train.schedule import SCHEDULE, warmup_steps
from llmlab.train.settings import LoopConfig, TrainJob, check_train_config

BRANCHES = "branches"  # the folder of a run's branches
# the settings that give a run its length, or stop it early: a branch sets its own
_LENGTH_KEYS = ("train.steps", "train.max_flops", "train.max_tokens", "train.max_steps", "train.max_time",
                "sched.branches", "sched.branch_flops")


@dataclass(frozen=True)
class Branch:
    steps: int  # its length: where it ends
    fork: int  # the step after which it leaves the long run: the first step of its cooldown
    budget: float | None  # its length as a FLOP budget, when given as one (sched.branch_flops)
    job: TrainJob  # the run it is: the long run's settings at its own length, with the same warm-up
    path: Path  # <run dir>/branches/<steps>
    overrides: list[str]  # its command line, for .hydra/overrides.yaml (reports group runs by it)

    @property
    def label(self) -> str:
        return f"{self.budget:.3g} FLOPs ({self.steps} steps)" if self.budget is not None else f"{self.steps} steps"


def plan(job: TrainJob, run_dir: Path, steps: int, tokens_per_step: int, flops_per_token: int,
         overrides: list[str] | None = None) -> list[Branch]:
    """The branches ``job`` asks for, checked against the run's length ``steps`` and warm-up:
    one line naming the setting for a branch at or past the run's end, inside the warm-up, or
    two that end at the same step."""
    sched = job.sched
    budgets = sched.branch_budgets()
    if not sched.branches and not budgets:
        return []
    long_run = job.max_flops is not None
    warmup = warmup_steps(sched, steps, long_run)
    wanted = [(int(s), None, "sched.branches", s) for s in sched.branches]
    for budget, written in zip(budgets, sched.branch_flops):  # below train.max_flops (`check_branch_ends`)
        length = replace(job.loop, max_flops=budget, max_tokens=None, steps=LoopConfig.steps)
        wanted.append((length.planned_steps(tokens_per_step, flops_per_token), budget, "sched.branch_flops", written))
    branches, ends = [], {}
    for end, budget, key, written in sorted(wanted, key=lambda w: w[0]):
        if end >= steps:
            raise ConfigError(f"{key}: {written} ends at step {end}, not before the run's end at step {steps}; a branch "
                              "ends before the run it leaves")
        if end <= warmup:
            raise ConfigError(f"{key}: {written} ends at step {end}, within the warm-up of {warmup} steps; a branch "
                              "leaves the constant rate after it")
        if end in ends:
            raise ConfigError(f"{key}: {written} and {ends[end]} both end at step {end}; each branch is one run")
        ends[end] = written
        config, pinned = branch_config(job.config, end, budget, warmup)
        branch_job = check_train_config(config)
        fork = SCHEDULE.build(branch_job.sched, end, budget_run=budget is not None).decay_start
        branches.append(Branch(end, fork, budget, branch_job, Path(run_dir) / BRANCHES / str(end),
                               branch_overrides(overrides or [], end, budget, warmup if pinned else None)))
    return branches


def branch_config(config: Mapping[str, Any], steps: int, budget: float | None, warmup: int) -> tuple[dict, bool]:
    """The settings of the run a branch is: the long run's, at its own length (``train.steps``,
    or ``train.max_flops`` for a budget), with no branches of its own, and whether its warm-up
    had to be pinned to the long run's ``warmup`` steps (its own default differs: a FLOP-budget
    run's warm-up is a share of its length, as is one set by ``sched.warmup_share``)."""
    cfg = copy.deepcopy(dict(config))
    train, sched = dict(cfg["train"]), dict(cfg["sched"])
    sched["branches"], sched["branch_flops"] = [], []
    train.update(max_steps=None, max_time=None, max_tokens=None, resume="auto")
    if budget is None:
        train.update(steps=steps, max_flops=None)
    else:
        train.update(steps=LoopConfig.steps, max_flops=budget)
    pinned = warmup_steps(SCHEDULE.config(sched, "sched"), steps, budget is not None) != warmup
    if pinned:
        sched.update(warmup=warmup, warmup_share=None)
    cfg["train"], cfg["sched"] = train, sched
    return cfg, pinned


def branch_overrides(overrides: list[str], steps: int, budget: float | None, pinned_warmup: int | None) -> list[str]:
    """The long run's command line with its length, branches and (where pinned) warm-up
    replaced by the branch's."""
    replaced = _LENGTH_KEYS + (("sched.warmup", "sched.warmup_share") if pinned_warmup is not None else ())
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in replaced]
    length = f"train.max_flops={budget:.6g}" if budget is not None else f"train.steps={steps}"
    return kept + [length] + ([f"sched.warmup={pinned_warmup}"] if pinned_warmup is not None else [])


def started(branch: Branch) -> bool:
    """Whether the branch has run past its fork or finished: its fork is not saved again, so a
    long run resumed from before a fork leaves a branch's own progress alone."""
    if (branch.path / "summary.json").is_file():
        return True
    root = branch.path / "checkpoints"
    return root.is_dir() and any(p.name.startswith("step_") and p.name[5:].isdigit() and int(p.name[5:]) > branch.fork
                                 for p in root.iterdir())


def write_records(branch: Branch, run_dir: Path) -> None:
    """The branch's folder with what it shares with the long run up to its fork: its command
    line (.hydra/overrides.yaml), and the metric and sample records of those steps."""
    from omegaconf import OmegaConf

    from llmlab.train.loggers import JsonlWriter

    own_dir(branch.path, "sched.branches")
    own_dir(branch.path / ".hydra", "sched.branches")
    atomic_write_text(branch.path / ".hydra" / "overrides.yaml", OmegaConf.to_yaml(OmegaConf.create(branch.overrides)))
    for name in ("metrics.jsonl", "samples.jsonl"):
        source = Path(run_dir) / name
        data = source.read_bytes() if source.is_file() else b""
        atomic_write_bytes(branch.path / name, data)
        JsonlWriter.truncate_after(branch.path / name, branch.fork)
