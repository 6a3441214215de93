"""A study's design, read from its runs: which overrides are the size and budget axes, which
runs make one variant (its other overrides), the design's cells (size, tokens, budget and the
seeds' losses), ``select=best_lr`` (each cell's best ``optim.lr``), and the next grid of sizes
a study should run at each budget.
"""

from __future__ import annotations

import math

import numpy as np

from llmlab.errors import ConfigError, UserError
from llmlab.eval.runs import Run
from llmlab.names import compact_override, parse_flops
from llmlab.study import surface as su


BUDGET_KEY = "train.max_flops"


LR_KEY = "optim.lr"


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _value(run: Run, key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in reversed(run.label_overrides) if override_key(o) == key), None)


def is_size_key(key: str) -> bool:
    return key.startswith("model.")


def select_best_lr(runs: list[Run]) -> tuple[list[Run], list[dict]]:
    """Keep, in each cell (the overrides minus ``seed`` and ``optim.lr``), the runs of the
    learning rate with the lowest mean final validation loss over its seeds. A choice's
    ``at_end`` says where it is the smallest or the largest rate that cell tried (its best rate
    may lie past it), None where tried rates lie on both sides."""
    if not any(_value(r, LR_KEY) is not None for r in runs):
        raise UserError(f"select: best_lr needs runs with an {LR_KEY} axis (llmlab train -m {LR_KEY}=1e-3,3e-3 ...); "
                        "these runs have none; allowed: all, best_lr")
    cells: dict[tuple, dict[str, list[Run]]] = {}
    for r in runs:
        cell = tuple(sorted(o for o in r.label_overrides if override_key(o) != LR_KEY))
        cells.setdefault(cell, {}).setdefault(_value(r, LR_KEY) or "default", []).append(r)
    shared = set.intersection(*(set(c) for c in cells)) if cells else set()
    kept, choices = [], []
    for cell, by_lr in cells.items():
        means = {lr: float(np.mean(losses)) for lr, rs in by_lr.items()
                 if (losses := [r.summary["val_loss"] for r in rs if r.summary.get("val_loss") is not None])}
        if not means:
            continue
        best = min(means, key=means.get)
        kept += by_lr[best]
        order = sorted(means, key=float_or)
        at_end = None if len(order) < 2 or order[0] != best != order[-1] else "smallest" if best == order[0] else "largest"
        choices.append({"cell": " ".join(o for o in cell if o not in shared) or "all runs", "lr": best, "val_loss": means[best],
                        "tried": {lr: round(means[lr], 4) for lr in order}, "at_end": at_end})
    return kept, choices


def apply_select(runs: list[Run], select: str) -> tuple[list[Run], list[dict] | None, set[str]]:
    """A report's ``select``: the runs it keeps, its choices (None for ``all``), and the keys the
    scaling section leaves out of the variants' labels."""
    if select == "best_lr":
        kept, choices = select_best_lr(runs)
        return kept, choices, {LR_KEY}
    return runs, None, set()


def lr_edge_note(choices: list[dict]) -> str | None:
    """One line naming the cells whose best rate is an end of the rates they tried, or None."""
    edge = [c for c in choices if c.get("at_end")]
    if not edge:
        return None
    return (f"select=best_lr: {len(edge)} of {len(choices)} cells chose the smallest or the largest rate they tried, "
            "so their best rate may lie past it and their loss is an upper bound: "
            + "; ".join(f"{c['cell']} ({c['at_end']}, optim.lr={c['lr']})" for c in edge) + ".")


def float_or(text: str) -> float:
    try:
        return float(text)
    except ValueError:
        return math.inf


def axes(runs: list[Run]) -> tuple[list[str], bool]:
    """The size keys that vary over the runs, and whether the budget does."""
    values: dict[str, set] = {}
    for r in runs:
        for o in r.label_overrides:
            values.setdefault(override_key(o), set()).add(o.split("=", 1)[-1])
    sizes = [k for k, v in values.items() if is_size_key(k) and len(v) > 1]
    return sizes, len(values.get(BUDGET_KEY, ())) > 1


def variants(runs: list[Run], drop: set[str]) -> dict[str, list[Run]]:
    """Runs by variant: their overrides minus the size and budget axes (and ``drop``), labelled
    by the overrides that differ between variants; the variant that sets none of them (the
    others' baseline) is "defaults", and a lone variant "all runs"."""
    def rest(r: Run) -> tuple:
        return tuple(sorted(o for o in r.label_overrides
                            if not (is_size_key(override_key(o)) or override_key(o) == BUDGET_KEY or override_key(o) in drop)))
    keys = [rest(r) for r in runs]
    shared = set.intersection(*(set(k) for k in keys)) if keys else set()
    out: dict[str, list[Run]] = {}
    plain = "all runs" if len(set(keys)) == 1 else "defaults"
    for r, k in zip(runs, keys):
        out.setdefault(" ".join(o for o in k if o not in shared) or plain, []).append(r)
    return out


# what N measures (``llmlab report scaling.size=...``): the non-embedding parameters, or the
# training FLOPs per token over 6 (Pearce & Song 2024; DeepSeek LLM 2024's M), which counts the
# attention and the head a parameter count leaves out
SIZE_MEASURES = ("params", "flops")


def size_of(summary: dict, size: str = "params") -> float | None:
    """A run's size N as ``size`` measures it (`SIZE_MEASURES`); None where it does not say."""
    value = summary.get("params_non_embedding") if size == "params" else (
        summary["flops_per_token"] / 6 if summary.get("flops_per_token") else None)
    return float(value) if value else None


def placed(summary: dict, size: str = "params") -> bool:
    """Whether a run says where it sits on the surface: its size N and its tokens D."""
    return bool(size_of(summary, size) and summary.get("tokens"))


def cells_of(runs: list[Run], size: str = "params") -> list[su.Cell]:
    """The runs as design cells: one per (size, budget, tokens), holding each seed's loss; N as
    ``size`` measures it."""
    by: dict[tuple, list[Run]] = {}
    for r in runs:
        s = r.summary
        if s.get("val_loss") is None or not placed(s, size):
            continue
        text = _value(r, BUDGET_KEY)
        try:  # read as train reads it (1e15*6 too)
            budget = parse_flops(text, BUDGET_KEY) if text is not None else float(s["flops_per_token"]) * s["tokens"]
        except ConfigError as e:
            raise UserError(f"runs: {r.path}: {e}") from None
        by.setdefault((size_of(s, size), budget, s["tokens"]), []).append(r)
    out = []
    for (n, budget, d), rs in by.items():
        fpt = float(rs[0].summary["flops_per_token"])
        out.append(su.Cell(float(n), float(d), fpt * float(d), fpt, budget, tuple(float(r.summary["val_loss"]) for r in rs)))
    return out


def _size_value(run: Run, key: str) -> float | None:
    text = _value(run, key)
    try:
        return float(text) if text is not None else None
    except ValueError:
        return None


def next_grid(runs: list[Run], v: dict, size_keys: list[str], points: int = 3, size: str = "params") -> list[dict]:
    """Sizes that centre each budget's grid on the fitted optimum N*: the size setting that
    gives N* (a power law N = k * value^p fitted to the runs), times the grid's own spacing to
    either side, rounded to the runs' common step; and the `llmlab train -m` line that runs it."""
    import shlex
    from functools import reduce

    if "surface" not in v:
        return []
    if len(size_keys) != 1:
        return [{"why": f"a next grid needs one size axis; these runs sweep {', '.join(size_keys)}"}]
    key = size_keys[0]
    pairs = [(x, n) for r in runs if (x := _size_value(r, key)) and (n := size_of(r.summary, size))]
    values = sorted({x for x, _ in pairs})
    if len(values) < 2:
        return []
    p, c = np.polyfit(np.log([x for x, _ in pairs]), np.log([n for _, n in pairs]), 1)
    whole = all(float(x).is_integer() for x in values)
    step = reduce(math.gcd, [int(x) for x in values]) if whole else None
    ratio = max(1.25, float(np.exp(np.mean(np.diff(np.log(values))))))
    common = [o for o in runs[0].overrides if all(o in r.overrides for r in runs)
              and override_key(o) not in (key, BUDGET_KEY, "seed") and not override_key(o).startswith("hydra")]
    seeds = sorted({str(r.seed) for r in runs if r.seed is not None}, key=float_or)
    out = []
    for b in v["per_budget"]:
        centre = float(np.exp((math.log(b["n_opt"]) - c) / p))
        grid = [centre * ratio ** (i - (points - 1) / 2) for i in range(points)]
        if step:  # the runs' common step (a multiple the sizes may need), halved once if points would merge
            unit = step // 2 if step % 2 == 0 and len({round(g / step) for g in grid}) < points else step
            grid = sorted({max(unit, int(round(g / unit)) * unit) for g in grid})
            if len(grid) < points:  # the optimum lies below the smallest step: the nearest legal sizes
                grid = sorted(sorted((unit * k for k in range(1, 4 * points)),
                                     key=lambda x: abs(math.log(x / centre)))[:points])
        text = ",".join(f"{g:g}" for g in grid)
        words = ["llmlab", "train", "-m", *common, f"{key}={text}", compact_override(f"{BUDGET_KEY}={b['budget']!r}")]
        words += [f"seed={','.join(seeds)}"] if seeds else []
        out.append({"budget": b["budget"], "n_opt": b["n_opt"], "size_key": key, "centre": centre, "sizes": grid,
                    "command": " ".join(shlex.quote(w) for w in words)})
    return out


def variant_names(labels: list[str]) -> dict[str, str]:
    """Each variant's name by what sets it apart: the option a config group chose for it
    (``mla`` for ``model/attention=mla attention.kv_rank=d_model/2 ...``; the kind's own settings
    come with it), a plain group named with its key (``norm=post``), and any setting that is no
    kind's own; the whole label wherever two names would be the same."""
    def name(label: str) -> str:
        words = label.split()
        groups = {w.split("=", 1)[0]: w.split("=", 1)[1] for w in words if "=" in w and "." not in w.split("=", 1)[0]}
        owned = {g.rsplit("/", 1)[-1] for g in groups}  # attention.* settings belong to model/attention's choice
        kept = []
        for w in words:
            key, _, value = w.partition("=")
            if key in groups:
                kept.append(value if "/" in key else w)
            elif key.split(".", 1)[0] not in owned:
                kept.append(w)
        return " ".join(kept) or label
    names = {label: name(label) for label in labels}
    if len(set(names.values())) < len(names):
        return {label: label for label in labels}
    return names


def rename(lines: list[str], names: dict[str, str]) -> list[str]:
    """``lines`` with each variant's label replaced by its name, outside code blocks (the
    commands there keep every override)."""
    out, code = [], False
    order = sorted(names, key=len, reverse=True)  # a label inside a longer one is replaced after it
    for line in lines:
        if line.startswith("```"):
            code = not code
        if not code:
            for label in order:
                if label != names[label]:
                    line = line.replace(label, names[label])
        out.append(line)
    return out
