"""The scaling section of `llmlab report`: a sweep with a budget axis (``train.max_flops``) and
a size axis (``model.*`` settings) gets, per variant (the other overrides), the fitted loss
surface, the compute-optimal size, tokens and loss at each budget, the IsoFLOP cross-check,
the budgets where two variants' optimal-loss curves cross, and ``scaling.png``. The fits are
in `llmlab.eval.scaling`; ``select=best_lr`` (each cell's best ``optim.lr``) is here too.
"""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np

from llmlab.errors import ConfigError, UserError
from llmlab.eval import calibration as cal
from llmlab.eval import scaling as sc
from llmlab.eval.runs import Run, some_of
from llmlab.names import compact_override, parse_flops

BUDGET_KEY = "train.max_flops"
LR_KEY = "optim.lr"
BELOW, ABOVE = 10.0, 100.0  # crossings are looked for from budget_min / BELOW to budget_max * ABOVE


def override_key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _value(run: Run, key: str) -> str | None:
    return next((o.split("=", 1)[1] for o in reversed(run.label_overrides) if override_key(o) == key), None)


def is_size_key(key: str) -> bool:
    return key.startswith("model.")


# -- select=best_lr -------------------------------------------------------------------------

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


# -- the analysis ----------------------------------------------------------------------------

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
    by the overrides that differ between variants."""
    def rest(r: Run) -> tuple:
        return tuple(sorted(o for o in r.label_overrides
                            if not (is_size_key(override_key(o)) or override_key(o) == BUDGET_KEY or override_key(o) in drop)))
    keys = [rest(r) for r in runs]
    shared = set.intersection(*(set(k) for k in keys)) if keys else set()
    out: dict[str, list[Run]] = {}
    for r, k in zip(runs, keys):
        out.setdefault(" ".join(o for o in k if o not in shared) or "all runs", []).append(r)
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


def _placed(summary: dict, size: str = "params") -> bool:
    """Whether a run says where it sits on the surface: its size N and its tokens D."""
    return bool(size_of(summary, size) and summary.get("tokens"))


def cells_of(runs: list[Run], size: str = "params") -> list[sc.Cell]:
    """The runs as design cells: one per (size, budget, tokens), holding each seed's loss; N as
    ``size`` measures it."""
    by: dict[tuple, list[Run]] = {}
    for r in runs:
        s = r.summary
        if s.get("val_loss") is None or not _placed(s, size):
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
        out.append(sc.Cell(float(n), float(d), fpt * float(d), fpt, budget, tuple(float(r.summary["val_loss"]) for r in rs)))
    return out


def analyse(cells: list[sc.Cell], budgets: list[float], reps: int, form: str = "chinchilla") -> dict:
    """One variant: surface (of ``form``, `scaling.FORMS`), bootstrap, optimum per budget,
    IsoFLOP per budget."""
    sizes = sorted({c.n for c in cells})
    if len(sizes) < 2 or len({c.budget for c in cells}) < 2 or sum(len(c.losses) for c in cells) < 5:
        return {"why": "a fit needs at least 2 sizes, 2 budgets and 5 finished runs"}
    n, d, y = sc.runs_of(cells)
    fit = sc.fit_surface(n, d, y, form=form)
    boots, kind = sc.bootstrap(cells, fit, reps)
    flops = sc.FlopsPerToken.fit([c.n for c in cells], [c.fpt for c in cells])
    bounds = (sizes[0] / 100, sizes[-1] * 100)
    per_budget = []
    for budget in budgets:
        opt = sc.optimum(fit, flops, budget, bounds)
        reps_opt = [sc.optimum(b, flops, budget, bounds) for b in boots]
        here = [c for c in cells if np.isclose(c.budget, budget)]
        iso = sc.isoflop([c.n for c in here], [float(np.mean(c.losses)) for c in here]) if here else None
        grid = sorted({c.n for c in here})
        position = sc.grid_position(float(opt["n"]), grid) if len(grid) > 1 else None
        # the best size run at an end of the grid: the runs did not bracket their optimum
        best_at_end = sc.grid_end(grid, min(here, key=lambda c: float(np.mean(c.losses))).n) if here else None
        per_budget.append({
            "budget": budget, "n_opt": float(opt["n"]), "d_opt": float(opt["d"]), "loss_opt": float(opt["loss"]),
            "at_edge": bool(opt["at_edge"]),
            "n_opt_ci": sc.interval([float(o["n"]) for o in reps_opt]),
            "d_opt_ci": sc.interval([float(o["d"]) for o in reps_opt]),
            "loss_opt_ci": sc.interval([float(o["loss"]) for o in reps_opt]),
            "sizes": grid, "optimum_position": position, "off_centre": sc.off_centre(position),
            "isoflop": iso, "best_at_end": best_at_end,
            "isoflop_off_centre": best_at_end is not None or (iso is not None and (sc.off_centre(iso["position"]) or
                                                                                   sc.off_centre(position))),
        })
    return {"surface": sc.surface_dict(fit), "flops_per_token": {"k": flops.k, "gamma": flops.gamma},
            "ci": {k: sc.interval([getattr(b, k) for b in boots]) for k in ("e", "a", "alpha", "b", "beta")},
            "bootstrap": {"replicates": len(boots), "over": kind}, "points": len(y), "cells": len(cells),
            "per_budget": per_budget, "bounds": bounds, "_fit": fit, "_boots": boots, "_flops": flops,
            "_cells": cells}


def curve(v: dict, boot: sc.Surface | None = None):
    fit = boot or v["_fit"]
    return lambda c: sc.optimum(fit, v["_flops"], c, v["bounds"])["loss"]


def crossings(found: dict[str, dict], measured: tuple[float, float]) -> list[dict]:
    lo, hi = measured[0] / BELOW, measured[1] * ABOVE
    out = []
    for (na, a), (nb, b) in itertools.combinations([(k, v) for k, v in found.items() if "surface" in v], 2):
        at = sc.crossing(curve(a), curve(b), lo, hi)
        reps = [sc.crossing(curve(a, x), curve(b, y), lo, hi) for x, y in zip(a["_boots"], b["_boots"])]
        first_lower = curve(a)(np.array([measured[1]]))[0] < curve(b)(np.array([measured[1]]))[0]
        out.append(crossing_entry(na, nb, at, reps, first_lower, measured))
    return out


def crossing_entry(first: str, second: str, at: float | None, replicates: list[float | None], first_lower: bool,
                   measured: tuple[float, float]) -> dict:
    """Where two variants' curves cross (None: not in the searched range), with the interval
    and share of the bootstrap replicates that cross, and which is lower at the largest budget."""
    hits = [r for r in replicates if r is not None]
    return {"first": first, "second": second, "budget": at, "ci": sc.interval(hits) if hits else None,
            "share_of_replicates": len(hits) / len(replicates) if replicates else None,
            "extrapolated": at is not None and not measured[0] <= at <= measured[1],
            "lower_at_largest_budget": first if first_lower else second}


def holdout(label: str, cells: list[sc.Cell], budgets: list[float], reps: int, form: str = "chinchilla") -> dict | None:
    """The fit's own check: fitted on every budget but the largest, its prediction of the
    largest budget's best loss (the lowest over the sizes run there), with a 95% prediction
    interval (the bootstrap's fits plus the seed noise of a mean over as many seeds as the
    observed cell has), beside the best loss observed there. None with fewer than 3 budgets."""
    if len(budgets) < 3 or (split := _below_and_at(cells, budgets[-1])) is None:
        return None
    train, held = split
    top = budgets[-1]
    fit, best, (n, d), at_held = _prediction(train, held, form)
    observed = float(np.mean(best.losses))
    tn, td, _ = sc.runs_of(train)
    # a parametric bootstrap: runs drawn about the fit with the runs' own noise (Student t, as
    # the spread is itself estimated from few runs), refitted; plus the noise of the observed mean
    rng = np.random.default_rng(1)
    sd, dof = seed_sd(train, fit)
    draws = []
    for _ in range(reps):
        try:
            b = sc.boot_fit(tn, td, fit.loss(tn, td) + sd * rng.standard_t(dof, len(tn)), form)
        except ValueError:
            continue
        draws.append(float(np.min(b.loss(n, d))) + sd / math.sqrt(len(best.losses)) * float(rng.standard_t(dof)))
    ci = sc.interval(draws)
    inside = ci is not None and ci[0] <= observed <= ci[1]
    predicted = float(np.min(at_held))
    # the compute-optimal size: the surface's, which every run informs (a law through each
    # budget's best of three sizes would follow their noise)
    predicted_size, grid = float(n[int(np.argmin(at_held))]), sorted(float(x) for x in n)
    return {"variant": label, "budget": top, "fitted_on": budgets[:-1], "predicted": predicted, "interval": ci,
            "observed": observed, "error": observed / predicted - 1, "within_interval": inside,
            "observed_size": best.n, "predicted_size": predicted_size,
            "size_steps": cal.size_steps(predicted_size, best.n, grid), "surface": sc.surface_dict(fit)}


def frontier_holdout(cells: list[sc.Cell], budgets: list[float], reps: int) -> dict | None:
    """The frontier's own check, beside the surface's: the lowest loss at each budget but the
    largest, fitted by a power law in C (`scaling.Frontier`, no floor), predicts the largest
    budget's best loss. Its 95% prediction interval: the runs redrawn with their budget's seed
    noise (each budget's best cell chosen anew) plus the noise of the observed mean
    (``seed_interval``), widened by the law's own error (``interval``, `calibration.law_error`:
    its leave-one-budget-out errors, for their number and for how far the held-out budget lies
    past the fitted ones). None with fewer than 3 budgets. (The frontier says nothing of sizes:
    the compute-optimal size at the held-out budget is the surface's, `holdout`.)"""
    if len(budgets) < 3 or (split := _below_and_at(cells, budgets[-1])) is None:
        return None
    train, held = split
    top = budgets[-1]
    try:
        fit, best = sc.frontier_of(train)
    except ValueError as e:
        return {"why": str(e)}
    predicted = float(fit.loss(top))
    chosen = min(held, key=lambda c: float(np.mean(c.losses)))
    observed = float(np.mean(chosen.losses))
    noise = _frontier_noise(train, fit, best)
    draws = []
    if noise is not None:
        rng = np.random.default_rng(2)
        last = noise[max(noise)]  # the observed mean's noise: the nearest budget's
        for _ in range(reps):
            means = [float(np.mean(np.asarray(c.losses) + noise[c.budget][0] * rng.standard_t(noise[c.budget][1],
                                                                                                len(c.losses))))
                     for c in train]
            try:
                again, _ = sc.frontier_of(train, means)
            except ValueError:  # in this draw fewer budgets bracket their optimum
                continue
            draws.append(float(again.loss(top)) + last[0] / math.sqrt(len(chosen.losses)) * float(rng.standard_t(last[1])))
    seed_ci = sc.interval(draws)
    fitted = sorted(best)
    lobo = cal.lobo_errors(fitted, [float(np.mean(train[best[b]].losses)) for b in fitted],
                           lambda b, losses: sc.fit_frontier(b, losses).loss)
    law = cal.law_error(lobo, top)
    ci = cal.calibrated(predicted, seed_ci, law)
    return {"predicted": predicted, "interval": ci, "seed_interval": seed_ci, "misspecification": law,
            "lobo": lobo, "lobo_rms": cal.misspecification(lobo), "reach": cal.reach(fitted, top),
            "observed": observed, "error": observed / predicted - 1,
            "within_interval": ci is not None and ci[0] <= observed <= ci[1], "gamma": fit.gamma, "c_c": fit.c_c,
            "fitted_on": fitted}


def decisions(held: list[dict]) -> list[dict]:
    """For each pair of variants with a frontier hold-out: their predicted order at the held-out
    budget, whether the gap's 95% interval excludes 0, and whether the observed order agrees
    (`calibration.order`)."""
    front = [(h["variant"], h["frontier"]) for h in held if h.get("frontier") and "why" not in h["frontier"]]
    out = []
    for (na, a), (nb, b) in itertools.combinations(front, 2):
        o = cal.order(a, b)
        if o is not None:
            out.append({"first": na, "second": nb, **o})
    return out


def _frontier_noise(train: list[sc.Cell], fit: sc.Frontier,
                    best: dict[float, int]) -> dict[float, tuple[float, int]] | None:
    """One run's loss noise at each budget, for the frontier's interval: the spread over seeds
    pooled within that budget's cells (it shrinks as budgets grow: one spread pooled over every
    budget would give the largest budgets the smallest ones' noise); a budget whose cells have
    one seed each takes the spread pooled over all; with one seed everywhere, the frontier's
    residuals. None where they leave no degree of freedom."""
    every = pooled_seed_sd(train)
    if every is None:
        dof = len(best) - 2
        if dof < 1:
            return None
        residuals = [float(np.mean(train[i].losses)) - float(fit.loss(b)) for b, i in best.items()]
        every = (float(np.sqrt(np.sum(np.square(residuals)) / dof)), dof)
    return {b: pooled_seed_sd([c for c in train if c.budget == b]) or every for b in {c.budget for c in train}}


def frontier_section(all_cells: dict[str, list[sc.Cell]], measured: tuple[float, float], reps: int) -> dict:
    """Each variant's frontier fitted on all its budgets (with a bootstrap interval on gamma),
    and where two variants' frontiers cross."""
    fits: dict[str, dict] = {}
    for label, cells in all_cells.items():
        try:
            fit, best = sc.frontier_of(cells)
        except ValueError as e:
            fits[label] = {"why": str(e)}
            continue
        boots = sc.frontier_bootstrap(cells, reps)
        fits[label] = {"gamma": fit.gamma, "log_g": fit.log_g, "c_c": fit.c_c, "gamma_ci": sc.interval([b.gamma for b in boots]),
                       "best": [{"budget": b, "n": cells[i].n, "loss": float(np.mean(cells[i].losses))}
                                for b, i in sorted(best.items())],
                       "not_bracketed": sorted(b for b in {c.budget for c in cells}
                                               if not any(np.isclose(b, x) for x in best)),
                       "_fit": fit, "_boots": boots}
    out = []
    lo, hi = measured[0] / BELOW, measured[1] * ABOVE

    def searched(at: float | None) -> float | None:  # the range the surfaces' crossings are searched in
        return at if at is not None and lo <= at <= hi else None

    for (na, a), (nb, b) in itertools.combinations([(k, v) for k, v in fits.items() if "_fit" in v], 2):
        reps = [searched(sc.frontier_crossing(x, y)) for x, y in zip(a["_boots"], b["_boots"])]
        first_lower = bool(a["_fit"].loss(measured[1]) < b["_fit"].loss(measured[1]))
        out.append(crossing_entry(na, nb, searched(sc.frontier_crossing(a["_fit"], b["_fit"])), reps, first_lower,
                                  measured))
    return {"variants": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in fits.items()},
            "crossings": out}


def _below_and_at(cells: list[sc.Cell], top: float) -> tuple[list[sc.Cell], list[sc.Cell]] | None:
    """The cells below budget ``top`` (to fit on) and at it (to predict), or None where those
    below are too few for a fit (2 sizes and 5 runs) or none is at it."""
    train = [c for c in cells if c.budget < top and not np.isclose(c.budget, top)]
    held = [c for c in cells if np.isclose(c.budget, top)]
    if not held or len({c.n for c in train}) < 2 or sum(len(c.losses) for c in train) < 5:
        return None
    return train, held


def _prediction(train: list[sc.Cell], held: list[sc.Cell], form: str):
    """A surface of ``form`` fitted on ``train``; the held cell with the best observed loss; the
    held cells' sizes and tokens; and the fit's loss at each (its minimum: the predicted best)."""
    fit = sc.fit_surface(*sc.runs_of(train), form=form)
    best = min(held, key=lambda c: float(np.mean(c.losses)))
    n, d = np.array([c.n for c in held]), np.array([c.d for c in held])
    return fit, best, (n, d), fit.loss(n, d)


def choose_form(cells: list[sc.Cell], budgets: list[float]) -> dict:
    """``surface=auto``: the form (`scaling.FORMS`) whose fit on every budget but the two
    largest predicts the second largest budget's best loss closest. The largest budget, which
    `holdout` keeps for its own check, plays no part in the choice. With fewer than 4 budgets
    there is no such nested check: the additive form, as on a tie."""
    if len(budgets) < 4:
        return {"form": sc.FORMS[0], "why": "fewer than 4 budgets: no nested hold-out"}
    *inner, top = budgets[:-1]
    if (split := _below_and_at(cells, top)) is None:
        return {"form": sc.FORMS[0], "why": f"too few runs below {top:.3g} FLOPs for a nested hold-out"}
    train, held = split
    errors = {}
    for form in sc.FORMS:
        _, best, _, at_held = _prediction(train, held, form)
        errors[form] = float(np.mean(best.losses)) / float(np.min(at_held)) - 1
    return {"form": min(sc.FORMS, key=lambda f: abs(errors[f])), "fitted_on": inner, "budget": top, "errors": errors}


def pooled_seed_sd(cells: list[sc.Cell]) -> tuple[float, int] | None:
    """The pooled standard deviation of one run's loss over seeds within cells, and its degrees
    of freedom; None where every cell has one seed."""
    spread = [(len(c.losses) - 1, float(np.var(c.losses, ddof=1))) for c in cells if len(c.losses) > 1]
    if not spread:
        return None
    dof = sum(k for k, _ in spread)
    return math.sqrt(sum(k * v for k, v in spread) / dof), dof


def seed_sd(cells: list[sc.Cell], fit: sc.Surface) -> tuple[float, int]:
    """One run's loss noise and its degrees of freedom: the pooled standard deviation over
    seeds within cells, or, with one seed per cell, the fit's residuals' (less its five
    parameters)."""
    if (pooled := pooled_seed_sd(cells)) is not None:
        return pooled
    n, d, y = sc.runs_of(cells)
    residuals = y - fit.loss(n, d)
    dof = max(1, len(residuals) - 5)
    return float(np.sqrt(np.sum(residuals ** 2) / dof)), dof


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


# A run of fewer steps than this is said to be short: there a larger model is held back by its
# few steps (bench.isoflop's GPU studies: a d 160 model at 335 steps lost 0.8 nats to a d 64
# one at 3,700), which L(N, D) does not model; there the fit without such runs missed its
# hold-out by 1.6% instead of 4.6% (mha).
SHORT_RUN = 1000


def _steps(run: Run) -> int | None:
    steps = run.summary.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def scaling_section(runs: list[Run], drop: set[str] = frozenset(), reps: int | None = None,
                    at_budgets: list[float] | None = None, points: int = 3, min_steps: int = 0,
                    form: str = "chinchilla", size: str = "params") -> dict | None:
    """The section's data, or None when the runs have no budget axis and size axis. The
    optimum and the next grid (``points`` sizes a budget) are worked out at the measured
    budgets, or at ``at_budgets``; ``reps`` bootstrap replicates (`scaling.BOOTSTRAPS`). Runs
    of fewer than ``min_steps`` steps are left out of the fit (a run that does not say its
    steps is kept). ``form``: the surface's (`scaling.FORMS`), or ``auto`` (`choose_form`, per
    variant). ``size``: what N measures (`SIZE_MEASURES`)."""
    reps = reps or sc.BOOTSTRAPS
    sizes, has_budget = axes(runs)
    if not sizes or not has_budget:
        return None
    fitted = [r for r in runs if (n := _steps(r)) is None or n >= min_steps]
    unknown = sum(1 for r in runs if _steps(r) is None) if min_steps else 0  # kept, and said
    short = sum(1 for r in fitted if (n := _steps(r)) is not None and n < SHORT_RUN)
    # a run with a loss but no size or tokens (an older or hand-edited summary.json) cannot be placed
    unplaced = [str(r.path) for r in fitted if r.summary.get("val_loss") is not None and not _placed(r.summary, size)]
    by_variant = variants(fitted, drop)
    all_cells = {label: cells_of(rs, size) for label, rs in by_variant.items()}
    budgets = sorted({c.budget for cells in all_cells.values() for c in cells})
    chosen = {label: choose_form(cells, budgets) if form == "auto" else {"form": form}
              for label, cells in all_cells.items()}
    found = {label: analyse(cells, sorted(at_budgets or budgets), reps, chosen[label]["form"])
             for label, cells in all_cells.items()}
    measured = (min(budgets), max(budgets)) if budgets else (math.nan, math.nan)
    held = [{**h, "frontier": frontier_holdout(cells, budgets, reps)} for label, cells in all_cells.items()
            if (h := holdout(label, cells, budgets, reps, chosen[label]["form"])) is not None]
    grids = {label: next_grid(by_variant[label], v, sizes, points, size) for label, v in found.items()}
    return {"size_keys": sizes, "budget_key": BUDGET_KEY, "budgets": budgets, "measured": measured, "form": form,
            "size": size,
            "chosen": {label: c for label, c in chosen.items() if form == "auto"},
            "runs": len(runs), "min_steps": min_steps, "left_out": len(runs) - len(fitted), "short": short,
            "steps_unknown": unknown, "unplaced": unplaced,
            "search": (measured[0] / BELOW, measured[1] * ABOVE), "variants": found,
            "crossings": crossings(found, measured) if budgets else [], "holdout": held, "decisions": decisions(held),
            "frontier": frontier_section(all_cells, measured, reps) if budgets else {"variants": {}, "crossings": []},
            "next_grid": {label: g for label, g in grids.items() if g}}


def public(section: dict) -> dict:
    """The section without the objects the figure and the crossings used (for report.json)."""
    return {**section, "variants": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")}
                                     for k, v in section["variants"].items()}}


# -- rendering -------------------------------------------------------------------------------

def _g(v, digits=3) -> str:
    return "n/a" if v is None else f"{v:.{digits}g}"


def _ci(ci, digits=3) -> str:
    return "" if ci is None else f" [{_g(ci[0], digits)}, {_g(ci[1], digits)}]"


# the surface of each form (`scaling.FORMS`), as the report writes it
FORMULA = {"chinchilla": "L(N, D) = E + A·N^-α + B·D^-β",
           "auto": "of the form each variant's nested hold-out chose (`surface=auto`, below)",
           "kaplan": "L(N, D) = E + ((A·N^-α)^(1/β) + (B·D^-β)^(1/β))^β (Kaplan et al. 2020's form, `surface=kaplan`: "
                     "size and tokens interact; with much data it is E + A·N^-α, with a large model E + B·D^-β)"}


def formula_line(s: dict) -> str:
    """A fitted surface in one line, in its own form."""
    if s.get("form") == "kaplan":
        return (f"L = {s['e']:.3f} + (({s['a']:.3g}/N^{s['alpha']:.3f})^(1/{s['beta']:.3f}) + "
                f"({s['b']:.3g}/D^{s['beta']:.3f})^(1/{s['beta']:.3f}))^{s['beta']:.3f}")
    return f"L = {s['e']:.3f} + {s['a']:.3g}/N^{s['alpha']:.3f} + {s['b']:.3g}/D^{s['beta']:.3f}"


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


def markdown(section: dict, figure: str | None) -> list[str]:
    names = variant_names(list(section["variants"]))
    named = [f"`{n}`: `{label}`" for label, n in names.items() if n != label]
    head = ["", "## Scaling: which variant wins at which budget", "",
            *([f"Variants by what sets them apart: {'; '.join(named)} (report.json keeps every override).", ""]
              if named else [])]
    return head + rename(_markdown(section, figure), names)


def _markdown(section: dict, figure: str | None) -> list[str]:
    out = [f"Budget axis `{section['budget_key']}`, size axis {', '.join(f'`{k}`' for k in section['size_keys'])}. "
           f"Surface {FORMULA[section.get('form', 'chinchilla')]} fitted per variant by variable projection, with **N the "
           + ("non-embedding parameters" if section.get("size", "params") == "params" else
              "training FLOPs per token / 6 (`scaling.size=flops`: attention and the head counted)")
           + " and D the training tokens**; C is training FLOPs by the model card "
           "(FLOPs/token × tokens, the count `train.max_flops` uses). Brackets: 95% bootstrap intervals.", ""]
    out += chosen_markdown(section.get("chosen") or {})
    if section.get("left_out"):
        out += [f"Left out of the fit: {section['left_out']} of the {section['runs']} runs, those of fewer than "
                f"{section['min_steps']:,} steps (`min_steps={section['min_steps']}`).", ""]
    if section.get("unplaced"):
        gone = section["unplaced"]
        out += [f"Left out of the fit: {len(gone)} run{'s' if len(gone) > 1 else ''} whose summary.json does not say "
                f"`params_non_embedding` and `tokens`: {some_of(gone)}.", ""]
    if section.get("steps_unknown"):
        out += [f"{section['steps_unknown']} of the runs do not say their steps (no whole number at `steps` in "
                "summary.json), so `min_steps` cannot judge them: they are fitted.", ""]
    if section.get("short"):
        out += [f"{section['short']} of the runs fitted have fewer than {SHORT_RUN:,} steps. In so short a run a larger "
                "model is held back by its few steps, which the surface does not model, and a fit on them can "
                "mislead (see the hold-out check); "
                f"`min_steps={SHORT_RUN}` fits without them.", ""]
    out += ["| variant | runs | E | A | α | B | β | rmse | bootstrap |", "|" + " --- |" * 9]
    for label, v in section["variants"].items():
        if "surface" not in v:
            out.append(f"| {label} | | {v['why']} | | | | | | |")
            continue
        s, ci = v["surface"], v["ci"]
        out.append(f"| {label} | {v['points']} | " + " | ".join(
            f"{_g(s[k])}{_ci(ci[k])}" for k in ("e", "a", "alpha", "b", "beta"))
            + f" | {s['rmse']:.4f} | {v['bootstrap']['replicates']} over {v['bootstrap']['over']} |")
    for label, v in section["variants"].items():
        if v.get("surface", {}).get("at_bounds"):
            out += ["", f"**⚠ {label}: {', '.join(v['surface']['at_bounds'])}: on a bound of the fit, so the runs do "
                    "not pin it down (too few sizes or budgets, or sizes past the point where size still helps); "
                    "the optimum and crossings below lean on that bound.**"]
    out += ["", "Compute-optimal size, tokens and loss at each measured budget (from the surface), and the IsoFLOP "
            "parabola's vertex at that budget as a cross-check:", "",
            "| variant | budget (FLOPs) | N* | D* | L* | IsoFLOP N* | grid |", "|" + " --- |" * 7]
    flagged = False
    for label, v in section["variants"].items():
        for b in v.get("per_budget", []):
            iso = b["isoflop"]
            iso_text = "n/a (< 3 sizes)" if iso is None else (iso["why"] or _g(iso["n"]))
            grid = ("off-centre ⚠" + (f" (best: the {b['best_at_end']} size)" if b.get("best_at_end") else "")
                    if b["isoflop_off_centre"] else "centred")
            flagged |= b["isoflop_off_centre"]
            out.append(f"| {label} | {b['budget']:.3g} | {_g(b['n_opt'])}{_ci(b['n_opt_ci'])}"
                       f"{' (at the search edge)' if b['at_edge'] else ''} | {_g(b['d_opt'])}{_ci(b['d_opt_ci'])} | "
                       f"{b['loss_opt']:.4f}{_ci(b['loss_opt_ci'], 4)} | {iso_text} | {grid} |")
    if flagged:
        out += ["", "**⚠ off-centre: the optimum lies outside the middle half of the sizes' log span at that budget, "
                "or the best size run there is the smallest or the largest. There the IsoFLOP parabola's vertex is "
                "biased (Czech et al. 2026); widen the sizes toward N* and trust the surface's N* over the parabola's.**"]
    out += ["", f"Crossings of the optimal-loss curves L*(C), searched from {section['search'][0]:.3g} to "
            f"{section['search'][1]:.3g} FLOPs; the measured budgets span {section['measured'][0]:.3g} to "
            f"{section['measured'][1]:.3g}, and a crossing beyond them is an extrapolation of the fits.", ""]
    out += [crossing_line(c, f"{c['first']} vs {c['second']}") for c in section["crossings"]]
    if not section["crossings"]:
        out.append("- (one variant only)")
    out += frontier_markdown(section.get("frontier") or {})
    out += holdout_markdown(section.get("holdout") or [])
    grids = section.get("next_grid") or {}
    if grids:
        out += ["", "Next grid: sizes that centre each budget's grid on this fit's N* (spaced as the grid that was run):",
                "", "```"]
        out += [g.get("command") or f"# {label}: {g['why']}" for label, gs in grids.items() for g in gs]
        out += ["```"]
    if figure:
        out += ["", f"![loss vs compute]({figure})"]
    return out


def chosen_markdown(chosen: dict[str, dict]) -> list[str]:
    """``surface=auto``'s choice per variant, with the nested hold-out's errors behind it."""
    if not chosen:
        return []
    out = ["Form per variant (`surface=auto`): each form fitted without the two largest budgets predicts the second "
           "largest budget's best loss; the closer one is the variant's surface (the largest budget, kept for the "
           "hold-out check, plays no part).", "",
           "| variant | fitted on | predicted budget | " + " | ".join(f"{f}: error" for f in sc.FORMS) + " | form |",
           "|" + " --- |" * (4 + len(sc.FORMS))]
    for label, c in chosen.items():
        if "errors" not in c:
            out.append(f"| {label} | | | " + " | " * (len(sc.FORMS) - 1) + f" | {c['form']} ({c['why']}) |")
            continue
        out.append(f"| {label} | {', '.join(f'{b:.3g}' for b in c['fitted_on'])} | {c['budget']:.3g} | "
                   + " | ".join(f"{c['errors'][f]:+.2%}" for f in sc.FORMS) + f" | **{c['form']}** |")
    return out + [""]


def crossing_line(c: dict, pair: str) -> str:
    """One crossing (of two surfaces' L*(C), or of two frontiers) as a list item."""
    share = c["share_of_replicates"]
    if c["budget"] is None:
        return (f"- {pair}: no crossing in the searched range; lower at the largest budget: "
                f"{c['lower_at_largest_budget']}" + (f" ({share:.0%} of bootstrap replicates do cross)" if share else ""))
    return (f"- {pair}: cross at {c['budget']:.3g} FLOPs{_ci(c['ci'])} "
            + (f"({share:.0%} of bootstrap replicates cross)" if share is not None else "(no bootstrap: one seed per cell)")
            + (" — an extrapolation beyond the measured budgets" if c["extrapolated"] else ""))


def frontier_markdown(front: dict) -> list[str]:
    """The frontier per variant (`frontier_section`) and where two frontiers cross."""
    if not front.get("variants"):
        return []
    out = ["", "Frontier: the lowest loss run at each budget, fitted by L*(C) = (C_c / C)^γ, a power law with no "
           "floor (Kaplan et al. 2020's L(C_min)); brackets: 95% bootstrap over seeds.", "",
           "| variant | γ | C_c | best loss per budget (size) |", "|" + " --- |" * 4]
    for label, v in front["variants"].items():
        if "why" in v:
            out.append(f"| {label} | n/a: {v['why']} | | |")
            continue
        points = ", ".join(f"{p['budget']:.3g}: {p['loss']:.4f} ({_g(p['n'])})" for p in v["best"])
        if v.get("not_bracketed"):
            points += "; left out, their sizes do not bracket the optimum: " + ", ".join(
                f"{b:.3g}" for b in v["not_bracketed"])
        out.append(f"| {label} | {v['gamma']:.4f}{_ci(v['gamma_ci'], 3)} | {_g(v['c_c'])} | {points} |")
    if front.get("crossings"):
        out.append("")
    out += [crossing_line(c, f"frontiers of {c['first']} and {c['second']}") for c in front.get("crossings", [])]
    return out


def holdout_markdown(held: list[dict]) -> list[str]:
    if not held:
        return []
    out = ["", f"Hold-out check: each variant's surface fitted without the largest budget predicts that budget's best "
           "loss (the lowest over its sizes). Interval: 95% prediction interval (the bootstrap's fits plus the seed "
           "noise of the observed mean).", "",
           "The frontier's columns are the second route: the best loss at each smaller budget, fitted by a power "
           "law in C with no floor (above), extrapolated to the largest. Its interval also carries the law's own "
           "error: the RMS of its leave-one-budget-out errors on the smaller budgets, added in quadrature (with two "
           "fitted budgets there is none to measure, and the interval is the seeds' alone). Where the two routes "
           "disagree, the observed loss says which assumption held: the surface's floor E, or none within reach.", "",
           "| variant | held-out budget | fitted on | surface: predicted (95% PI) | error | frontier: predicted (95% PI) "
           "| error | observed |", "|" + " --- |" * 8]
    for h in held:
        f = h.get("frontier")
        front = ("n/a | n/a" if f is None else f"n/a: {f['why']} | n/a" if "why" in f
                 else f"{f['predicted']:.4f}{_ci(f['interval'], 4)} | {f['error']:+.2%}")
        out.append(f"| {h['variant']} | {h['budget']:.3g} | {', '.join(f'{b:.3g}' for b in h['fitted_on'])} | "
                   f"{h['predicted']:.4f}{_ci(h['interval'], 4)} | {h['error']:+.2%} | {front} | {h['observed']:.4f} |")
    out += decisions_markdown(held)
    for h in held:
        if not h["within_interval"]:
            out += ["", f"**⚠ hold-out miss: {h['variant']}: the best loss at {h['budget']:.3g} FLOPs was {h['observed']:.4f}, "
                    f"outside the interval{_ci(h['interval'], 4)} of the fit on the smaller budgets: the surface does "
                    "not extrapolate, so its optimum and crossings beyond the measured budgets are not to be trusted"
                    + ("" if h["surface"].get("form") == "kaplan" else
                       " (where size and tokens interact, as in short runs, `surface=kaplan` may fit)") + ".**"]
        f = h.get("frontier")
        if f is not None and "why" not in f and not f["within_interval"]:
            out += ["", f"**⚠ frontier miss: {h['variant']}: the best loss at {h['budget']:.3g} FLOPs was "
                    f"{h['observed']:.4f}, outside the interval{_ci(f['interval'], 4)} of the power law in C fitted on "
                    "the smaller budgets' best losses"
                    + (" (observed above it: a floor the smaller budgets did not show)" if f["error"] > 0 else "")
                    + ".**"]
        if h["surface"].get("at_bounds"):
            out += ["", f"**⚠ {h['variant']}: the hold-out fit has {', '.join(h['surface']['at_bounds'])}: on a bound "
                    "of the fit, so its prediction leans on that bound.**"]
    return out


def decisions_markdown(held: list[dict], pairs: list[dict] | None = None) -> list[str]:
    """What a user decides from the hold-out, said as such: which variant is lower at the
    held-out budget (decided where the gap's 95% interval excludes 0) against the observed
    order, and each variant's predicted compute-optimal size against the size observed best."""
    pairs = decisions(held) if pairs is None else pairs
    lines = []
    for d in pairs:
        lower, higher = (d["first"], d["second"]) if d["gap"] < 0 else (d["second"], d["first"])
        lo, hi = d["interval"]
        verdict = ("decided" if d["decided"] else "not decided: the interval holds 0")
        seen = "agrees" if d["agrees"] else "**the observed order is the other**"
        lines.append(f"- Order at the held-out budget: {lower} predicted lower than {higher} by "
                     f"{abs(d['gap']):.2%} (95% interval of ln L_{d['first']}/L_{d['second']}: [{lo:+.2%}, {hi:+.2%}]; "
                     f"{verdict}); observed gap {d['observed_gap']:+.2%}: {seen}.")
    for h in held:
        if h.get("size_steps") is not None:
            lines.append(f"- {h['variant']}: compute-optimal size predicted {_g(h['predicted_size'])} (the surface's "
                         f"optimum among the sizes run there), observed best {_g(h['observed_size'])}: "
                         f"{h['size_steps']} grid step{'s' if h['size_steps'] != 1 else ''} apart.")
    return ["", "Decisions at the held-out budget (the order by the frontier, the size by the surface):", "",
            *lines] if lines else []


def figure(section: dict, path: Path) -> Path | None:
    from llmlab.eval.plots import scaling_plot

    lo, hi = section["measured"][0] / 3, section["measured"][1] * 3
    budgets = np.logspace(np.log10(lo), np.log10(hi), 80)
    names = variant_names(list(section["variants"]))
    series = {}
    for label, v in section["variants"].items():
        cells = v.get("_cells") or []
        entry = {"points": ([c.c for c in cells for _ in c.losses], [x for c in cells for x in c.losses])}
        if "_fit" in v:
            entry["x"] = budgets
            entry["fit"] = curve(v)(budgets)
            if v["_boots"]:
                band = np.array([curve(v, b)(budgets) for b in v["_boots"]])
                entry["lo"], entry["hi"] = np.quantile(band, 0.025, axis=0), np.quantile(band, 0.975, axis=0)
        front = (section.get("frontier") or {}).get("variants", {}).get(label, {})
        if "gamma" in front:
            entry["x"] = budgets
            entry["frontier"] = sc.Frontier(front["log_g"], front["gamma"]).loss(budgets)
        series[names[label]] = entry
    if not any(e["points"][0] for e in series.values()):
        return None
    return scaling_plot(series, path)


def _frontier_words(f: dict | None) -> str:
    if f is None:
        return ""
    if "why" in f:
        return f"; the frontier: n/a ({f['why']})"
    return (f"; the frontier (best loss per budget, a power law in C) predicts {f['predicted']:.4f}{_ci(f['interval'], 4)} "
            f"({f['error']:+.2%}" + ("" if f["within_interval"] else ", outside its interval") + ")")


def scaling_lines(section: dict) -> list[str]:
    """The scaling section in a few lines for the terminal (report.md has the tables), each
    variant by its name (`variant_names`)."""
    return rename(_scaling_lines(section), variant_names(list(section["variants"])))


def _scaling_lines(section: dict) -> list[str]:
    out = []
    if section.get("unplaced"):
        out.append(f"scaling: left out of the fit: {len(section['unplaced'])} run(s) whose summary.json does not say "
                   "params_non_embedding and tokens (report.md names them)")
    for label, c in (section.get("chosen") or {}).items():
        out.append(f"scaling: {label}: surface=auto chose {c['form']} ("
                   + (", ".join(f"{f} {e:+.2%}" for f, e in c["errors"].items())
                      + f" at {c['budget']:.3g} FLOPs, fitted below it" if "errors" in c else c["why"]) + ")")
    for label, v in section["variants"].items():
        if "surface" not in v:
            out.append(f"scaling: {label}: {v['why']}")
            continue
        s = v["surface"]
        optima = "; ".join(f"C={b['budget']:.2g}: N*={b['n_opt']:.3g}, L*={b['loss_opt']:.3f}"
                           + (" (IsoFLOP grid off-centre)" if b["isoflop_off_centre"] else "") for b in v["per_budget"])
        out.append(f"scaling: {label}: {formula_line(s)}"
                   + (f" (on a bound: {', '.join(s['at_bounds'])})" if s.get("at_bounds") else "") + "; " + optima)
    for h in section.get("holdout") or []:
        out.append(f"scaling: {h['variant']}: fitted without {h['budget']:.3g} FLOPs, predicts its best loss "
                   f"{h['predicted']:.4f}{_ci(h['interval'], 4)}, observed {h['observed']:.4f} ({h['error']:+.2%})"
                   + ("" if h["within_interval"] else " — outside the interval") + _frontier_words(h.get("frontier")))
    for label, grids in (section.get("next_grid") or {}).items():
        for g in grids:
            out.append(f"scaling: next grid: {g.get('command') or label + ': ' + g['why']}")
    for c in section["crossings"]:
        where = ("no crossing" if c["budget"] is None else f"cross at {c['budget']:.3g} FLOPs"
                 + (" (extrapolated)" if c["extrapolated"] else ""))
        out.append(f"scaling: {c['first']} vs {c['second']}: {where}; lower at the largest budget: "
                   f"{c['lower_at_largest_budget']}")
    return out
