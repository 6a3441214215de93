"""Finished runs as `llmlab report` reads them: found under sweep or run directories, read as
data (their ``summary.json``, ``metrics.jsonl`` and ``.hydra/overrides.yaml``; nothing is
resolved or run), and grouped by their overrides minus ``seed``."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

from llmlab.errors import UserError
from llmlab.names import compact_override

@dataclass
class Run:
    path: Path
    summary: dict
    overrides: list[str]
    seed: Any
    curve: list[tuple[float, float]]  # (tokens, val loss)
    unreadable_lines: int = 0  # lines of metrics.jsonl that are not a JSON record (cut by a crash, edited)

    @cached_property
    def label_overrides(self) -> list[str]:
        """The overrides that can set this run apart, large round numbers short (``1e12``);
        worked out once per run (grouping and the scaling section ask for it many times)."""
        return setting_apart([compact_override(o) for o in self.overrides])


# settings that add runs beside a run without changing what it trains: its cooldown branches
# (`llmlab.train.branches`), each a run of its own with its own length
BESIDE = ("sched.branches", "sched.branch_flops")


def setting_apart(overrides: list[str]) -> list[str]:
    """Overrides that can set a group apart: all but ``seed``, the keys that only change
    how a run is watched or where it runs (logger, log intervals, prompts, sample lengths,
    device...), which the run id leaves out too, and the branches a run leaves (`BESIDE`): a
    run with branches trains what it trains without them."""
    from llmlab.names import RUN_ID_IGNORES, RUN_ID_IGNORES_TRAIN

    def watch_only(key: str) -> bool:
        parts = key.lstrip("+~").split("/")[0].split(".")
        return (parts[0] == "seed" or parts[0] in RUN_ID_IGNORES or key.lstrip("+~") in BESIDE
                or (parts[0] == "train" and len(parts) > 1 and parts[1] in RUN_ID_IGNORES_TRAIN))
    return [o for o in overrides if not watch_only(o.split("=", 1)[0])]


@dataclass
class Group:
    label: str
    runs: list[Run] = field(default_factory=list)

    def by_seed(self) -> dict[Any, Run]:
        return {r.seed: r for r in self.runs}


def find_runs(paths: list[str | Path]) -> list[Run]:
    """Every run directory (one with a summary.json) at or under ``paths``, in the order the
    paths are given (a sweep's jobs in job order), so the first group is the first run given."""
    found: dict[Path, Run] = {}
    for p in paths:
        p = Path(os.path.expanduser(p))  # an unknown ~user stays as written (Path.expanduser raises)
        if not p.exists():
            raise UserError(f"runs: {p} does not exist")
        candidates = ([p / "summary.json"] if (p / "summary.json").is_file()
                      else sorted(p.glob("**/summary.json"), key=lambda f: natural_key(f.parent)))
        for s in candidates:
            run = read_run(s.parent)
            if run is not None:
                found[s.parent.resolve()] = run
    if not found:
        raise UserError(f"runs: no finished runs (summary.json) under {', '.join(map(str, paths))}")
    return list(found.values())


def read_run(path: Path) -> Run | None:
    summary = read_summary(path)
    if summary is None:
        return None
    overrides = read_overrides(path)
    seed = summary.get("seed")
    if seed is None:
        seed = next((o.split("=", 1)[1] for o in overrides if o.split("=", 1)[0] == "seed"), None)
    curve, unreadable = [], 0
    metrics = path / "metrics.jsonl"
    if metrics.is_file():
        for line in metrics.read_text(errors="replace").splitlines():
            try:
                rec = json.loads(line)
            except ValueError:
                unreadable += 1  # a line cut short by a crash, or edited: left out, and the report says so
                continue
            if isinstance(rec, dict) and "val/loss" in rec and "train/tokens" in rec:
                try:
                    curve.append((float(rec["train/tokens"]), float(rec["val/loss"])))
                except (TypeError, ValueError):
                    raise UserError(f"runs: {metrics}: a val/loss record holds a value that is not a number") from None
    curve.sort()
    return Run(path, summary, overrides, seed, curve, unreadable)


def read_overrides(path: Path) -> list[str]:
    """A run's command-line overrides (Hydra's record), without Hydra's own. Read as plain
    YAML and kept as literal text: a run directory may come from someone else, and an
    interpolation in it (``${oc.env:SECRET}``) must never be resolved."""
    import yaml

    ov = path / ".hydra" / "overrides.yaml"
    if not ov.is_file():
        return []
    try:
        items = yaml.safe_load(ov.read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as e:
        raise UserError(f"runs: {ov} is not readable YAML ({(str(e).splitlines() or [''])[0]})") from e
    if items is None:
        return []
    if not isinstance(items, list) or not all(isinstance(o, (str, int, float, bool)) for o in items):
        raise UserError(f"runs: {ov} is not a list of overrides (key=value strings)")
    return [str(o) for o in items if not str(o).startswith("hydra")]


# summary.json values the report computes with; anything else there is only shown
NUMERIC_SUMMARY = ("val_loss", "tokens_per_s", "decode_tokens_per_s", "mfu", "params", "flops_per_token",
                   "kv_cache_bytes_per_token", "tokens_per_s_spread", "tokens_per_s_other_load",
                   "decode_tokens_per_s_spread", "decode_tokens_per_s_other_load", "params_non_embedding", "tokens")
POSITIVE_SUMMARY = ("params", "params_non_embedding", "flops_per_token", "tokens")  # the scaling fit takes their logs


def read_summary(path: Path) -> dict | None:
    """A run's summary.json, checked: an object whose numeric fields are numbers or null.
    None while there is none (a run still going)."""
    f = path / "summary.json"
    try:
        summary = json.loads(f.read_text())
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise UserError(f"runs: {f} is not valid JSON ({(str(e).splitlines() or [''])[0]})") from e
    if not isinstance(summary, dict):
        raise UserError(f"runs: {f} holds a JSON {type(summary).__name__}, not an object")
    for key in NUMERIC_SUMMARY:
        value = summary.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float))):
            raise UserError(f"runs: {f}: {key} is {value!r}, not a number")
        if key in POSITIVE_SUMMARY and value is not None and not value > 0:
            raise UserError(f"runs: {f}: {key} is {value!r}; it must be > 0")
    if isinstance(summary.get("seed"), (list, dict)):  # runs are paired by it
        raise UserError(f"runs: {f}: seed is {summary['seed']!r}, not a number or a name")
    return summary


def some_of(items: list[str], shown: int = 5) -> str:
    """Up to ``shown`` of ``items`` for a one-line note, and how many more there are."""
    return "; ".join(items[:shown]) + (f"; and {len(items) - shown} more" if len(items) > shown else "")


def natural_key(path: Path) -> list:
    """Sweep jobs in job order: 2_... before 10_..."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(path))]


def group_runs(runs: list[Run], others: list[list[str]] = ()) -> list[Group]:
    """Group by overrides minus seed; labels keep only the overrides that differ between groups.
    ``others``: the overrides of runs that did not finish (a sweep's failed jobs), which count
    in what differs, so a group's label still says what sets it apart from them."""
    keys = {tuple(sorted(r.label_overrides)) for r in runs}
    keys |= {tuple(sorted(setting_apart(ovs))) for ovs in others}
    shared = set.intersection(*(set(k) for k in keys)) if keys else set()
    groups: dict[tuple, Group] = {}
    for run in runs:  # groups in the order their first run was given
        key = tuple(sorted(r for r in run.label_overrides if r not in shared))
        if key not in groups:
            # the group that sets none of what sets the others apart is their baseline: "defaults"
            groups[key] = Group(" ".join(key) or ("all runs" if shared and len(keys) == 1 else "defaults"))
        groups[key].runs.append(run)
    return list(groups.values())
