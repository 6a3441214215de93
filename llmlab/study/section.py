"""The scaling section of `llmlab report`: a sweep with a budget axis (``train.max_flops``) and
a size axis (``model.*`` settings) gets, per variant (the other overrides), the fitted loss
surface, the compute-optimal size, tokens and loss at each budget, the IsoFLOP cross-check,
the budgets where two variants' optimal-loss curves cross, and ``scaling.png``. The fits are
in `llmlab.study.surface`, `optimum` and `frontier`; the hold-out in `holdout`; the words
and the figure in `markdown`.

"""

from __future__ import annotations

import itertools
import math

import numpy as np

from llmlab.eval.runs import Run
from llmlab.study import calibration as cal
from llmlab.study import frontier as fr
from llmlab.study import optimum as op
from llmlab.study import surface as su
from llmlab.study.design import BUDGET_KEY, axes, cells_of, next_grid, placed, variants
from llmlab.study.holdout import choose_form, decisions, frontier_holdout, holdout


BELOW, ABOVE = 10.0, 100.0  # crossings are looked for from budget_min / BELOW to budget_max * ABOVE


def analyse(cells: list[su.Cell], budgets: list[float], reps: int, form: str = "chinchilla") -> dict:
    """One variant: surface (of ``form``, `scaling.FORMS`), bootstrap, optimum per budget,
    IsoFLOP per budget."""
    sizes = sorted({c.n for c in cells})
    if len(sizes) < 2 or len({c.budget for c in cells}) < 2 or sum(len(c.losses) for c in cells) < 5:
        return {"why": "a fit needs at least 2 sizes, 2 budgets and 5 finished runs"}
    n, d, y = su.runs_of(cells)
    fit = su.fit_surface(n, d, y, form=form)
    boots, kind = su.bootstrap(cells, fit, reps)
    flops = op.FlopsPerToken.fit([c.n for c in cells], [c.fpt for c in cells])
    bounds = (sizes[0] / 100, sizes[-1] * 100)
    per_budget = []
    for budget in budgets:
        opt = op.optimum(fit, flops, budget, bounds)
        reps_opt = [op.optimum(b, flops, budget, bounds) for b in boots]
        here = [c for c in cells if np.isclose(c.budget, budget)]
        iso = op.isoflop([c.n for c in here], [float(np.mean(c.losses)) for c in here]) if here else None
        grid = sorted({c.n for c in here})
        position = op.grid_position(float(opt["n"]), grid) if len(grid) > 1 else None
        # the best size run at an end of the grid: the runs did not bracket their optimum
        best_at_end = fr.grid_end(grid, min(here, key=lambda c: float(np.mean(c.losses))).n) if here else None
        per_budget.append({
            "budget": budget, "n_opt": float(opt["n"]), "d_opt": float(opt["d"]), "loss_opt": float(opt["loss"]),
            "at_edge": bool(opt["at_edge"]),
            "n_opt_ci": su.interval([float(o["n"]) for o in reps_opt]),
            "d_opt_ci": su.interval([float(o["d"]) for o in reps_opt]),
            "loss_opt_ci": su.interval([float(o["loss"]) for o in reps_opt]),
            "sizes": grid, "optimum_position": position, "off_centre": op.off_centre(position),
            "isoflop": iso, "best_at_end": best_at_end,
            "isoflop_off_centre": best_at_end is not None or (iso is not None and (op.off_centre(iso["position"]) or
                                                                                   op.off_centre(position))),
        })
    return {"surface": su.surface_dict(fit), "flops_per_token": {"k": flops.k, "gamma": flops.gamma},
            "ci": {k: su.interval([getattr(b, k) for b in boots]) for k in ("e", "a", "alpha", "b", "beta")},
            "bootstrap": {"replicates": len(boots), "over": kind}, "points": len(y), "cells": len(cells),
            "per_budget": per_budget, "bounds": bounds, "_fit": fit, "_boots": boots, "_flops": flops,
            "_cells": cells}


def curve(v: dict, boot: su.Surface | None = None):
    fit = boot or v["_fit"]
    return lambda c: op.optimum(fit, v["_flops"], c, v["bounds"])["loss"]


def crossings(found: dict[str, dict], measured: tuple[float, float]) -> list[dict]:
    lo, hi = measured[0] / BELOW, measured[1] * ABOVE
    out = []
    for (na, a), (nb, b) in itertools.combinations([(k, v) for k, v in found.items() if "surface" in v], 2):
        at = op.crossing(curve(a), curve(b), lo, hi)
        reps = [op.crossing(curve(a, x), curve(b, y), lo, hi) for x, y in zip(a["_boots"], b["_boots"])]
        first_lower = curve(a)(np.array([measured[1]]))[0] < curve(b)(np.array([measured[1]]))[0]
        out.append(crossing_entry(na, nb, at, reps, first_lower, measured))
    return out


def crossing_entry(first: str, second: str, at: float | None, replicates: list[float | None], first_lower: bool,
                   measured: tuple[float, float]) -> dict:
    """Where two variants' curves cross (None: not in the searched range), with the interval
    and share of the bootstrap replicates that cross, and which is lower at the largest budget."""
    hits = [r for r in replicates if r is not None]
    return {"first": first, "second": second, "budget": at, "ci": su.interval(hits) if hits else None,
            "share_of_replicates": len(hits) / len(replicates) if replicates else None,
            "extrapolated": at is not None and not measured[0] <= at <= measured[1],
            "lower_at_largest_budget": first if first_lower else second}


def frontier_section(all_cells: dict[str, list[su.Cell]], measured: tuple[float, float], reps: int) -> dict:
    """Each variant's frontier fitted on all its budgets (with a bootstrap interval on gamma),
    and where two variants' frontiers cross."""
    fits: dict[str, dict] = {}
    for label, cells in all_cells.items():
        try:
            fit, best = fr.frontier_of(cells)
        except ValueError as e:
            fits[label] = {"why": str(e)}
            continue
        boots = fr.frontier_bootstrap(cells, reps)
        fits[label] = {"gamma": fit.gamma, "log_g": fit.log_g, "c_c": fit.c_c, "gamma_ci": su.interval([b.gamma for b in boots]),
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
        reps = [searched(fr.frontier_crossing(x, y)) for x, y in zip(a["_boots"], b["_boots"])]
        first_lower = bool(a["_fit"].loss(measured[1]) < b["_fit"].loss(measured[1]))
        out.append(crossing_entry(na, nb, searched(fr.frontier_crossing(a["_fit"], b["_fit"])), reps, first_lower,
                                  measured))
    return {"variants": {k: {kk: vv for kk, vv in v.items() if not kk.startswith("_")} for k, v in fits.items()},
            "crossings": out}


# A run of fewer steps than this is said to be short: there a larger model is held back by its
# few steps (bench.isoflop's GPU studies: a d 160 model at 335 steps lost 0.8 nats to a d 64
# one at 3,700), which L(N, D) does not model; there the fit without such runs missed its
# hold-out by 1.6% instead of 4.6% (mha).
DRIFTS = ("lab", "none")  # the frontier hold-out moved by calibration.LAB_DRIFT, or the line alone
SHORT_RUN = 1000


def _steps(run: Run) -> int | None:
    steps = run.summary.get("steps")
    return steps if isinstance(steps, int) and not isinstance(steps, bool) else None


def scaling_section(runs: list[Run], drop: set[str] = frozenset(), reps: int | None = None,
                    at_budgets: list[float] | None = None, points: int = 3, min_steps: int = 0,
                    form: str = "chinchilla", size: str = "params", drift: str = "lab") -> dict | None:
    """The section's data, or None when the runs have no budget axis and size axis. The
    optimum and the next grid (``points`` sizes a budget) are worked out at the measured
    budgets, or at ``at_budgets``; ``reps`` bootstrap replicates (`surface.BOOTSTRAPS`). Runs
    of fewer than ``min_steps`` steps are left out of the fit (a run that does not say its
    steps is kept). ``form``: the surface's (`scaling.FORMS`), or ``auto`` (`choose_form`, per
    variant). ``size``: what N measures (`SIZE_MEASURES`). ``drift``: how the frontier's hold-out
    extrapolates (`DRIFTS`)."""
    reps = reps or su.BOOTSTRAPS
    sizes, has_budget = axes(runs)
    if not sizes or not has_budget:
        return None
    fitted = [r for r in runs if (n := _steps(r)) is None or n >= min_steps]
    unknown = sum(1 for r in runs if _steps(r) is None) if min_steps else 0  # kept, and said
    short = sum(1 for r in fitted if (n := _steps(r)) is not None and n < SHORT_RUN)
    # a run with a loss but no size or tokens (an older or hand-edited summary.json) cannot be placed
    unplaced = [str(r.path) for r in fitted if r.summary.get("val_loss") is not None and not placed(r.summary, size)]
    by_variant = variants(fitted, drop)
    all_cells = {label: cells_of(rs, size) for label, rs in by_variant.items()}
    budgets = sorted({c.budget for cells in all_cells.values() for c in cells})
    chosen = {label: choose_form(cells, budgets) if form == "auto" else {"form": form}
              for label, cells in all_cells.items()}
    found = {label: analyse(cells, sorted(at_budgets or budgets), reps, chosen[label]["form"])
             for label, cells in all_cells.items()}
    measured = (min(budgets), max(budgets)) if budgets else (math.nan, math.nan)
    moved = cal.LAB_DRIFT if drift == "lab" else None
    held = [{**h, "frontier": frontier_holdout(cells, budgets, reps, moved)} for label, cells in all_cells.items()
            if (h := holdout(label, cells, budgets, reps, chosen[label]["form"])) is not None]
    grids = {label: next_grid(by_variant[label], v, sizes, points, size) for label, v in found.items()}
    return {"size_keys": sizes, "budget_key": BUDGET_KEY, "budgets": budgets, "measured": measured, "form": form,
            "size": size, "drift": moved.as_dict() if moved else None,
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
