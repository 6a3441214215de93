"""Train sweeps (``llmlab train -m``): what a job does when it fails or is stopped, and the
comparison written when the sweep ends.

A job that fails (a learning rate that diverges, say) writes its one-line error to
``failed.txt`` in its directory and the sweep goes on. A signal stops the whole sweep once
the running job has saved its checkpoint. When every job has run, `SweepReport` compares the
finished ones in the sweep directory (``llmlab report``), lists the rest, and makes the sweep
exit with status 1 if any job did not finish.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

FAILED = "failed.txt"


def run_job(cfg: dict, run_dir: Path, job_num: int) -> None:
    """One job of a sweep."""
    from llmlab import console
    from llmlab.errors import UserError
    from llmlab.files import atomic_write_text
    from llmlab.train.card import stopped_by_signal
    from llmlab.train.loop import run_training

    failed = run_dir / FAILED
    failed.unlink(missing_ok=True)
    try:
        summary = run_training(cfg, run_dir, in_sweep=True)
    except UserError as e:
        # one job's failure does not cost the others: the sweep goes on, and ends non-zero
        line = (str(e).strip().splitlines() or ["unknown error"])[0]
        if is_rank_zero():
            atomic_write_text(failed, line + "\n")
        console.err.print(f"llmlab: error: job {job_num} ({run_dir.name}): {line}", style="red")
        return
    if stopped_by_signal(summary):
        console.out.print(f"sweep stopped by {summary['stopped_by']}: the jobs after job {job_num} were not started",
                          style="yellow")
        raise SystemExit(0)


def is_rank_zero() -> bool:
    return int(os.environ.get("RANK") or 0) == 0


class SweepReport(Callback):
    """Hydra calls ``on_multirun_end`` in the launching process once every job has run, with
    any launcher (local, joblib, submitit)."""

    def __init__(self, baseline: str | int | None = None) -> None:
        self.baseline = baseline

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        if not is_rank_zero():
            return
        from llmlab import console
        from llmlab.errors import UserError, fail
        from llmlab.study.report import write_report
        from llmlab.eval.runs import natural_key

        sweep_dir = Path(str(config.hydra.sweep.dir))
        jobs = sorted((p for p in sweep_dir.iterdir() if (p / ".hydra").is_dir()), key=natural_key)
        unfinished = {j: ((j / FAILED).read_text().strip() if (j / FAILED).is_file() else "no summary.json")
                      for j in jobs if not (j / "summary.json").is_file()}
        if len(unfinished) < len(jobs):
            console.out.print(f"sweep of {len(jobs)} jobs: {sweep_dir}")
            try:
                write_report([sweep_dir], self.baseline, sweep_dir, unfinished)
            except UserError as e:
                fail(f"{e} (the jobs ran; `llmlab report {sweep_dir} baseline=...` writes the report)", 1)
        for job, why in unfinished.items():
            console.err.print(f"job {job.name} did not finish: {why}", style="red")
        if unfinished:
            fail(f"{len(unfinished)} of {len(jobs)} jobs did not finish; running the same sweep command again "
                 "retries them and skips the finished ones", 1)
