"""Sweep reports: runs grouped by their overrides minus ``seed``, compared over seeds.

For each group: final validation loss as mean ± 95% CI (Student t over seeds), validation loss
at a token count every run reached (matched tokens), the cost card (parameters, FLOPs/token,
KV-cache bytes/token) and speed (training and decode tokens/s). Each group is then compared
with a baseline group, paired by seed: the mean difference, with paired t-test and sign-test
p-values from 3 seeds on. One PNG overlays the validation curves, mean over seeds with the
min-max band. The grouping and the statistics are here, the tables' words in `tables`. A sweep with a budget axis and a size axis
also gets a scaling section (`llmlab.study.section`), and ``select=best_lr`` keeps each
cell's best learning rate before anything is compared.

"""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np

from llmlab.errors import UserError
from llmlab.eval.runs import Group, Run, find_runs, group_runs, read_overrides
from llmlab.eval.stats import mean_ci, paired_t_test, sign_test
from llmlab.files import atomic_write_text, own_dir
from llmlab.study import design as de
from llmlab.study import markdown as md
from llmlab.study import section as se
from llmlab.study.design import axes, override_key
from llmlab.study.tables import (COLUMNS, COMPARE_COLUMNS, MIN_SEEDS_FOR_TESTS, compare_rows, fmt_num, notes, plural,
                                  table_rows)


def interpolate(curve: list[tuple[float, float]], tokens: float) -> float | None:
    if not curve or tokens > curve[-1][0] or tokens < curve[0][0]:
        return None
    xs, ys = zip(*curve)
    return float(np.interp(tokens, xs, ys))


def _mean(values: list[float | None]) -> float | None:
    values = [v for v in values if v is not None]
    return sum(values) / len(values) if values else None


def build_report(runs: list[Run], baseline: str | int | None = None, others: list[list[str]] = ()) -> dict:
    groups = group_runs(runs, others)
    base = pick_baseline(groups, baseline)
    ended = [r.curve[-1][0] for r in runs if r.curve]
    matched = min(ended) if ended and len(ended) == len(runs) else None
    rows = []
    for g in groups:
        finals = [r.summary.get("val_loss") for r in g.runs if r.summary.get("val_loss") is not None]
        ci = mean_ci(finals) if finals else None
        at = [interpolate(r.curve, matched) for r in g.runs] if matched is not None else []
        at = [v for v in at if v is not None]
        at_ci = mean_ci(at) if at else None
        first = g.runs[0].summary
        rows.append({
            "group": g.label, "seeds": len(g.runs), "runs": [str(r.path) for r in g.runs],
            "val_loss_mean": ci.mean if ci else None, "val_loss_ci95": ci.half_width if ci else None,
            "val_loss_values": finals,
            "val_loss_at_matched_mean": at_ci.mean if at_ci else None,
            "val_loss_at_matched_ci95": at_ci.half_width if at_ci else None,
            "params": first.get("params"), "flops_per_token": first.get("flops_per_token"),
            "kv_cache_bytes_per_token": first.get("kv_cache_bytes_per_token"),
            "caveats": list(dict.fromkeys(c for r in g.runs for c in _strings(r.summary.get("caveats")))),
            **group_speed(g.runs, "tokens_per_s", "train_tokens_per_s"),
            **group_speed(g.runs, "decode_tokens_per_s", "decode_tokens_per_s"),
            "mfu": _mean([r.summary.get("mfu") for r in g.runs]),
        })
    comparisons = [compare(g, base) for g in groups if g is not base]
    return {"matched_tokens": matched, "baseline": base.label, "groups": rows, "comparisons": comparisons,
            "speed_note": speed_note(rows, [r for g in groups for r in g.runs]),
            "size_note": size_note(rows, base.label, swept_sizes(groups)),
            "no_loss": [str(r.path) for g in groups for r in g.runs if r.summary.get("val_loss") is None],
            "unreadable_metrics": {str(r.path / "metrics.jsonl"): r.unreadable_lines
                                   for g in groups for r in g.runs if r.unreadable_lines}}


# Groups whose parameters or FLOPs per token differ by more than this share from the baseline's
# are flagged: their loss difference is partly a size difference.
SIZE_SHARE = 0.05


def swept_sizes(groups: list[Group]) -> dict[str, tuple[str, ...]]:
    """Per group label: its values of the size settings (``model.*``) that vary over the
    groups (the scaling section's size axes); empty when no size is swept."""
    swept, _ = axes([g.runs[0] for g in groups])
    if not swept:
        return {}
    return {g.label: tuple(sorted(o for o in g.runs[0].label_overrides if override_key(o) in swept)) for g in groups}


def size_note(rows: list[dict], baseline: str, swept: dict[str, tuple[str, ...]] | None = None) -> str | None:
    """One line naming the groups whose size differs from the baseline's by more than
    `SIZE_SHARE` (parameters or training FLOPs per token); None when all match. When a size
    setting is a swept axis (``swept``: each group's values of it), sizes differ by design: a
    group is compared with the first group of its own size instead, and the line says so once."""
    swept = swept or {}
    flagged = []
    for r in rows:
        same_size = [b for b in rows if swept.get(b["group"]) == swept.get(r["group"])] if swept else []
        base = same_size[0] if swept else next(b for b in rows if b["group"] == baseline)
        diffs = [f"{what} {r[key] / base[key] - 1:+.0%}" for key, what in
                 (("params", "params"), ("flops_per_token", "FLOPs/token"))
                 if r.get(key) and base.get(key) and abs(r[key] / base[key] - 1) > SIZE_SHARE]
        if diffs:
            r["size_differs"] = True
            flagged.append(f"{r['group']} ({', '.join(diffs)} against {base['group']})" if swept else
                           f"{r['group']} ({', '.join(diffs)})")
    if swept:
        keys = sorted({o.split("=", 1)[0] for values in swept.values() for o in values})
        line = (f"Sizes differ by design: {', '.join(keys)} is swept, so groups of different sizes are not flagged; "
                "‡ compares a group with the first group of the same size")
        return line + (f", and these differ by more than {SIZE_SHARE:.0%}: {'; '.join(flagged)}." if flagged else
                       f", and none differs by more than {SIZE_SHARE:.0%}.")
    if not flagged:
        return None
    return (f"Sizes differ from the baseline's by more than {SIZE_SHARE:.0%}, so a loss difference is partly a "
            f"size difference: {'; '.join(flagged)}.")


def _strings(value) -> list[str]:
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def group_speed(runs: list[Run], key: str, name: str) -> dict:
    """A group's speed: the median of its runs' medians; its spread, the larger of the runs'
    own spreads and the spread between runs; the most other load any run saw (None where
    no run could tell); and whether that makes it a figure taken under contention."""
    import statistics

    from llmlab.perf import contended
    values = [r.summary.get(key) for r in runs if r.summary.get(key) is not None]
    if not values:
        return {name: None, f"{name}_spread": None, f"{name}_other_load": None, f"{name}_contended": False}
    med = statistics.median(values)
    between = (max(values) - min(values)) / 2 / med if len(values) > 1 and med > 0 else 0.0
    own = [r.summary.get(f"{key}_spread") for r in runs if r.summary.get(f"{key}_spread") is not None]
    loads = [r.summary.get(f"{key}_other_load") for r in runs if r.summary.get(f"{key}_other_load") is not None]
    load = max(loads) if loads else None
    return {name: med, f"{name}_spread": max([between, *own]), f"{name}_other_load": load,
            f"{name}_contended": contended(load)}


def speed_note(rows: list[dict], runs: list[Run]) -> str | None:
    """One line when the speed columns cannot be compared, saying why; None when they can."""
    from llmlab.perf import CONTENDED
    why = []
    busy = [r["group"] for r in rows if r.get("train_tokens_per_s_contended") or r.get("decode_tokens_per_s_contended")]
    if busy:
        why.append(f"{len(busy)} of {len(rows)} groups were timed while other work used more than "
                   f"{CONTENDED:.0%} of the CPU (marked *)")
    for key, what in (("device", "devices"), ("world_size", "process counts"), ("precision", "precisions"),
                      ("decode_setting", "decode settings")):
        seen = {json.dumps(r.summary.get(key), sort_keys=True) for r in runs if key in r.summary}
        if len(seen) > 1:
            why.append(f"the runs differ in {what}")
    if not why:
        return None
    return "Speed columns are not comparable: " + "; ".join(why) + "."


def pick_baseline(groups: list[Group], baseline: str | int | None) -> Group:
    if baseline is None:
        return groups[0]
    if isinstance(baseline, int) and not isinstance(baseline, bool):
        if 0 <= baseline < len(groups):
            return groups[baseline]
    else:
        for g in groups:
            if g.label == str(baseline):
                return g
        matches = [g for g in groups if str(baseline) in g.label]
        if len(matches) == 1:
            return matches[0]
    labels = ", ".join(f"{i}: {g.label}" for i, g in enumerate(groups))
    raise UserError(f"baseline: '{baseline}' names no single group; allowed: {labels}")


def compare(group: Group, base: Group) -> dict:
    """Paired by seed: final val loss of ``group`` minus the baseline's."""
    mine, theirs = group.by_seed(), base.by_seed()
    seeds = [s for s in mine if s in theirs and mine[s].summary.get("val_loss") is not None
             and theirs[s].summary.get("val_loss") is not None]
    a = [mine[s].summary["val_loss"] for s in seeds]
    b = [theirs[s].summary["val_loss"] for s in seeds]
    diffs = [x - y for x, y in zip(a, b)]
    ci = mean_ci(diffs) if diffs else None
    enough = len(seeds) >= MIN_SEEDS_FOR_TESTS
    return {"group": group.label, "baseline": base.label, "pairs": len(seeds),
            "diff_mean": ci.mean if ci else None, "diff_ci95": ci.half_width if ci else None,
            "better": sum(d < 0 for d in diffs), "worse": sum(d > 0 for d in diffs),
            "t_test_p": paired_t_test(a, b) if enough else None, "sign_test_p": sign_test(a, b) if enough else None}


def markdown(report: dict, figure: str | None, scaling_figure: str | None = None) -> str:
    def table(cols, rows):
        lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
        return lines + ["| " + " | ".join(c.replace("|", "\\|") for c in row) + " |" for row in rows]

    matched = report["matched_tokens"]
    out = ["# llmlab report", "",
           f"Runs grouped by their overrides minus `seed`. Val loss: final validation loss, mean ± 95% CI "
           f"(Student t over seeds). Matched tokens: {fmt_num(matched)} (the most every run reached).", ""]
    if report.get("lr_choices"):
        out += ["`select=best_lr`: in each cell, the runs of the learning rate with the lowest mean final validation "
                "loss are kept (a single shared learning rate favours the variant it happens to suit):", ""]
        out += [f"- {c['cell']}: optim.lr={c['lr']} (val loss {c['val_loss']:.4f}; tried "
                + ", ".join(f"{lr}: {v}" for lr, v in c["tried"].items())
                + (f"; the {c['at_end']} tried" if c.get("at_end") else "") + ")" for c in report["lr_choices"]]
        out += [""]
    out += table(COLUMNS, table_rows(report))
    out += ["", "Speeds: median over timings and seeds ± half their interquartile range (or half the range "
            "between seeds, whichever is larger); * marks a figure timed while other work used the CPU."]
    for line in notes(report):
        out += ["", f"**{line}**"]
    out += ["", f"## Against the baseline: {report['baseline']}", "",
            f"Paired by seed; Δ < 0 means lower loss than the baseline. p-values need at least "
            f"{MIN_SEEDS_FOR_TESTS} seeds.", ""]
    out += table(COMPARE_COLUMNS, compare_rows(report)) if report["comparisons"] else ["(one group only)"]
    if report.get("unfinished"):
        out += ["", "## Jobs that did not finish", ""]
        out += [f"- `{name}`: {why}" for name, why in report["unfinished"].items()]
    if figure:
        out += ["", f"![validation loss curves]({figure})"]
    if report.get("scaling"):
        out += md.markdown(report["scaling"], scaling_figure)
    return "\n".join(out) + "\n"


def curves(runs: list[Run], others: list[list[str]] = ()) -> dict[str, dict]:
    """Per group: the mean val curve over seeds and its min-max band, on the tokens all its runs share."""
    out = {}
    for g in group_runs(runs, others):
        with_curves = [r for r in g.runs if r.curve]
        if not with_curves:
            continue
        end = min(r.curve[-1][0] for r in with_curves)
        xs = sorted({t for r in with_curves for t, _ in r.curve if t <= end})
        ys = np.array([[math.nan if (y := interpolate(r.curve, x)) is None else y for x in xs] for r in with_curves])
        out[g.label] = {"x": xs, "mean": np.nanmean(ys, 0), "lo": np.nanmin(ys, 0), "hi": np.nanmax(ys, 0)}
    return out


WIDE = 240  # columns for tables printed into a log file or a pipe


def write_report(dirs: list[str | Path], baseline, out: Path, unfinished: dict[Path, str] | None = None,
                 select: str = "all", min_steps: int = 0, surface: str = "chinchilla", size: str = "params",
                 drift: str = "lab") -> dict:
    """Find the finished runs under ``dirs``, write report.md, report.json and report.png to
    ``out``, print the tables; return the report. ``llmlab report`` and the end of a train
    sweep both come here; a sweep passes its jobs that did not finish (directory -> why),
    which the files list after the tables."""
    from rich.console import Console
    from rich.table import Table

    from llmlab import console
    from llmlab.eval.plots import curves_plot

    runs, choices, drop = de.apply_select(find_runs(dirs), select)
    others = [read_overrides(path) for path in unfinished or {}]
    result = build_report(runs, baseline, others)
    if choices is not None:
        result["lr_choices"] = choices
    if unfinished:
        result["unfinished"] = {path.name: why for path, why in unfinished.items()}
    own_dir(out, "out")
    scaling = se.scaling_section(runs, drop, min_steps=min_steps, form=surface, size=size, drift=drift)
    scaled = None
    if scaling is not None:
        result["scaling"] = se.public(scaling)
        scaled = "scaling.png" if md.figure(scaling, out / "scaling.png") else None
    figure = None
    per_group = curves(runs, others)
    if per_group:
        curves_plot(per_group, out / "report.png", "training tokens", "validation loss",
                    "validation loss: mean over seeds, band = min..max")
        figure = "report.png"
    atomic_write_text(out / "report.md", markdown(result, figure, scaled))
    atomic_write_text(out / "report.json", json.dumps(result, indent=2))

    matched = "n/a" if result["matched_tokens"] is None else f"{result['matched_tokens']:,.0f}"
    # a terminal folds the tables to fit; a log file gets them whole (rich would assume 80 columns)
    show = console.out if console.out.is_terminal else Console(width=WIDE, highlight=False, markup=False,
                                                               quiet=console.out.quiet)

    def table(title: str, columns: tuple[str, ...], rows: list[list[str]]) -> Table:
        t = Table(title=title, title_justify="left")
        for col in columns:
            t.add_column(col, justify="left" if col == "group" else "right", overflow="fold",
                         **({"min_width": 20} if col == "group" else {}))
        for row in rows:
            t.add_row(*row)
        return t

    for c in choices or []:
        show.print(f"select=best_lr: {c['cell']}: optim.lr={c['lr']} (val loss {c['val_loss']:.4f}"
                   + (f"; the {c['at_end']} tried" if c.get("at_end") else "") + ")", highlight=False)
    show.print(table(f"{plural(len(runs), 'run')} in {plural(len(result['groups']), 'group')} "
                     f"(val loss: mean ± 95% CI over seeds; matched tokens {matched})", COLUMNS, table_rows(result)))
    for line in notes(result):
        show.print(line, style="yellow")
    if result["comparisons"]:
        show.print(table(f"paired by seed against {result['baseline']}", COMPARE_COLUMNS, compare_rows(result)))
    if scaling is not None:
        for line in md.scaling_lines(result["scaling"]):
            show.print(line, highlight=False)
    console.out.print(f"report: {out / 'report.md'}" + (f", {out / 'report.png'}" if figure else "")
                      + (f", {out / 'scaling.png'}" if scaled else ""))
    return result
