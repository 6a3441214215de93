"""The report's tables and notes, in markdown: one row a group, one a comparison with the baseline.
"""

from __future__ import annotations


from llmlab.eval.runs import some_of
from llmlab.study.design import lr_edge_note


MIN_SEEDS_FOR_TESTS = 3


def _pm(mean, half, digits=4) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.{digits}f}" + (f" ± {half:.{digits}f}" if half is not None else "")


def fmt_num(v, fmt="{:,.0f}") -> str:
    return "n/a" if v is None else fmt.format(v)


def _p(v) -> str:
    return f"n<{MIN_SEEDS_FOR_TESTS}" if v is None else f"{v:.3g}"


COLUMNS = ("group", "seeds", "val loss (95% CI)", "val loss @ matched tokens", "params", "MFLOPs/token",
           "KV B/token", "train tok/s", "decode tok/s")


COMPARE_COLUMNS = ("group", "pairs", "Δ val loss vs baseline (95% CI)", "better / worse", "paired t p", "sign test p")


def _speed(row: dict, name: str) -> str:
    """``3,105 ±4%``, with ``*`` where it was timed under contention."""
    value = row.get(name)
    if value is None:
        return "n/a"
    spread = row.get(f"{name}_spread")
    return (f"{value:,.0f}" + (f" ±{spread:.0%}" if spread else "")
            + (" *" if row.get(f"{name}_contended") else ""))


def table_rows(report: dict) -> list[list[str]]:
    return [[r["group"] + (" †" if r.get("caveats") else "") + (" ‡" if r.get("size_differs") else ""), _seeds(r), _pm(r["val_loss_mean"], r["val_loss_ci95"]),
             _pm(r["val_loss_at_matched_mean"], r["val_loss_at_matched_ci95"]), fmt_num(r["params"]),
             fmt_num(None if r["flops_per_token"] is None else r["flops_per_token"] / 1e6, "{:,.2f}"),
             fmt_num(r["kv_cache_bytes_per_token"]), _speed(r, "train_tokens_per_s"), _speed(r, "decode_tokens_per_s")]
            for r in report["groups"]]


def _seeds(row: dict) -> str:
    """A group's runs, and how many of them the loss columns stand on where not all."""
    n, with_loss = row["seeds"], len(row["val_loss_values"])
    return str(n) if with_loss == n else f"{n} ({with_loss} with a val loss)"


def compare_rows(report: dict) -> list[list[str]]:
    return [[c["group"], str(c["pairs"]), _pm(c["diff_mean"], c["diff_ci95"]), f"{c['better']} / {c['worse']}",
             _p(c["t_test_p"]), _p(c["sign_test_p"])] for c in report["comparisons"]]


def notes(report: dict) -> list[str]:
    """What the tables cannot be taken at face value for: † caveats of a variant at its size,
    ‡ size differences, speeds that cannot be compared, and runs the loss figures leave out."""
    out = [f"† {r['group']}: {c}" for r in report["groups"] for c in r.get("caveats") or []]
    if report.get("size_note"):
        flagged = any(r.get("size_differs") for r in report["groups"])
        out.append(("‡ " if flagged else "") + report["size_note"])
    if report.get("speed_note"):
        out.append(report["speed_note"])
    if (edge := lr_edge_note(report.get("lr_choices") or [])):
        out.append(edge)
    if report.get("no_loss"):
        gone = report["no_loss"]
        out.append(f"{len(gone)} run{'s' if len(gone) > 1 else ''} without a val_loss in summary.json (no evaluation "
                   "finished, or the file was edited) left out of every loss figure, the comparisons and the scaling "
                   f"fit: {some_of(gone)}.")
    if report.get("unreadable_metrics"):
        cut = [f"{path} ({n} line{'s' if n > 1 else ''})" for path, n in report["unreadable_metrics"].items()]
        out.append("Lines of metrics.jsonl that are not a JSON record (cut short by a crash, or edited) left out of "
                   f"the validation curves: {some_of(cut)}.")
    return out


def plural(n: int, word: str) -> str:
    return f"{n} {word}" + ("" if n == 1 else "s")
