"""Hydra's own files in a run or sweep directory that llmlab did not just create.

Hydra writes ``.hydra/config.yaml``, ``hydra.yaml`` and ``overrides.yaml`` and its job log
(``<command>.log``) into a job's directory, and ``multirun.yaml`` into a sweep's, by opening
each name for writing, which follows a link planted there. `NoLinksOut`, a Hydra callback
(``hydra.callbacks`` in every command's config), runs before Hydra writes any of them: it
replaces each such link with nothing (said in one line, `llmlab.files.release`), so Hydra
writes a file of its own, and it refuses a directory that is a link out of its parent
before any directory is made. Everything else llmlab writes follows the same rule itself
(`llmlab.files`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

HYDRA_FILES = ("config.yaml", "hydra.yaml", "overrides.yaml")


def guard_job_dir(job_dir: Path, subdir: str | None, job_name: str, key: str) -> None:
    """Make ``job_dir``'s Hydra files safe to open by name; refuse (UserError naming ``key``) a
    job directory or ``subdir`` (``.hydra``) that is a link out of its parent."""
    from llmlab.errors import UserError
    from llmlab.files import link_out, release

    for folder in [job_dir, *([job_dir / subdir] if subdir else [])]:
        target = link_out(folder)
        if target is not None:
            raise UserError(f"{key}: {folder} is a link out of its folder (to {target}); llmlab does not write "
                            "through links: move it aside, or choose another directory")
    if not job_dir.is_dir():
        return
    release(job_dir / f"{job_name}.log")
    if subdir and (job_dir / subdir).is_dir():
        for name in HYDRA_FILES:
            release(job_dir / subdir / name)


class NoLinksOut(Callback):
    """Before Hydra writes into a run directory (``on_run_start``) or a sweep directory and the
    job directories already in it (``on_multirun_start``): no link there is written through.
    Hydra turns an exception in a callback into a warning and goes on, so a refusal ends the
    command here, in one line (`llmlab.errors.fail`)."""

    def on_run_start(self, config: Any, **kwargs: Any) -> None:
        hydra = config.hydra
        _refusing(guard_job_dir, Path(str(hydra.run.dir)), hydra.output_subdir, str(hydra.job.name), "hydra.run.dir")

    def on_multirun_start(self, config: Any, **kwargs: Any) -> None:
        _refusing(guard_sweep_dir, config.hydra)


def guard_sweep_dir(hydra: Any) -> None:
    """`guard_job_dir` for a sweep directory, its ``multirun.yaml`` and every job directory an
    earlier launch of the same sweep left in it."""
    from llmlab.files import release

    sweep_dir = Path(str(hydra.sweep.dir))
    guard_job_dir(sweep_dir, None, str(hydra.job.name), "hydra.sweep.dir")
    if not sweep_dir.is_dir():
        return
    release(sweep_dir / "multirun.yaml")
    for job_dir in sorted(sweep_dir.iterdir()):
        if job_dir.is_dir():  # a link to a folder included
            guard_job_dir(job_dir, hydra.output_subdir, str(hydra.job.name), "hydra.sweep.dir")


def _refusing(check, *args) -> None:
    from llmlab.errors import UserError, fail
    from llmlab.files import disk_error

    try:
        check(*args)
    except UserError as e:
        fail(str(e), 1)
    except OSError as e:  # a link that cannot be removed (a read-only folder): Hydra would write through it
        fail(str(disk_error(e, "a run directory's file") or f"cannot check {e.filename}: {e.strerror}"), 1)
