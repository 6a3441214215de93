"""llmlab report: sweep or run directories -> grouped statistics, Markdown, JSON and a PNG."""

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from llmlab.commands import Command
from llmlab.errors import ConfigError
from llmlab.registry import Checked, bounded, choice

SELECT = ("all", "best_lr")
# llmlab.study.surface.FORMS, named here without importing numpy, and auto: per variant, the form
# that predicts the second largest budget best from the smaller ones (a nested hold-out)
SURFACES = ("chinchilla", "kaplan", "auto")
SIZES = ("params", "flops")  # llmlab.study.design.SIZE_MEASURES
DRIFTS = ("lab", "none")  # llmlab.study.section.DRIFTS


@dataclass
class ScalingConfig:
    """The ``scaling`` section: how the scaling fit measures a run."""

    size: str = choice("params", SIZES)  # N in the fit: params (non-embedding parameters) or flops (training FLOPs per token / 6: attention and head counted)
    drift: str = choice("lab", DRIFTS)  # the hold-out's frontier: lab (moved by this lab's measured drift past the fitted budgets, its spread in the interval) or none (the fitted line, its leave-one-budget-out interval)

@dataclass
class ReportConfig(Checked):
    """``llmlab report``'s settings."""

    runs: list[str] = field(default_factory=list)  # sweep or run directories (searched for summary.json)
    baseline: Any = None  # the group the others are compared with: its label, a unique part of it, or its index; null: the first
    out: str | None = None  # where report.md/.json/.png go; null: this command's run dir
    select: str = choice("all", SELECT)  # best_lr: keep each cell's best optim.lr by final val loss (a sweep with an optim.lr axis)
    min_steps: int = bounded(0, at_least=0)  # the scaling fit leaves out runs of fewer steps (there a larger model is held back by its few steps)
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    surface: str = choice("chinchilla", SURFACES)  # the scaling fit's form: chinchilla (E + A/N^a + B/D^b), kaplan (size and tokens interact), or auto (per variant, the one a nested hold-out picks)

    def check(self, prefix: str) -> None:
        if not self.runs:
            raise ConfigError("runs: give at least one sweep or run directory (llmlab report DIR ...)")


def run(job: ReportConfig, run_dir: Path) -> None:
    from llmlab.study.report import write_report

    out = Path(os.path.expanduser(job.out)) if job.out else run_dir
    write_report([str(r) for r in job.runs], job.baseline, out, select=job.select, min_steps=job.min_steps,
                 surface=job.surface, size=job.scaling.size, drift=job.scaling.drift)


COMMAND = Command("report", ReportConfig, run)
SCHEMA = COMMAND.schema
