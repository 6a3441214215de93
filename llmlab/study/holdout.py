"""The study's own check: fitted without its largest budget, each route predicts that budget's
best loss with a 95% prediction interval, beside the loss observed there. The surface
(`holdout`, its form chosen per variant by a nested hold-out in `choose_form`) also predicts
the compute-optimal size; the frontier (`frontier_holdout`) is the route the decisions lead
with, its interval calibrated (`llmlab.study.calibration`). `decisions` says, for each pair of
variants, which is lower at the held-out budget and whether that order is decided.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from llmlab.study import calibration as cal
from llmlab.study import frontier as fr
from llmlab.study import surface as su


def holdout(label: str, cells: list[su.Cell], budgets: list[float], reps: int, form: str = "chinchilla") -> dict | None:
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
    tn, td, _ = su.runs_of(train)
    # a parametric bootstrap: runs drawn about the fit with the runs' own noise (Student t, as
    # the spread is itself estimated from few runs), refitted; plus the noise of the observed mean
    rng = np.random.default_rng(1)
    sd, dof = seed_sd(train, fit)
    draws = []
    for _ in range(reps):
        try:
            b = su.boot_fit(tn, td, fit.loss(tn, td) + sd * rng.standard_t(dof, len(tn)), form)
        except ValueError:
            continue
        draws.append(float(np.min(b.loss(n, d))) + sd / math.sqrt(len(best.losses)) * float(rng.standard_t(dof)))
    ci = su.interval(draws)
    inside = ci is not None and ci[0] <= observed <= ci[1]
    predicted = float(np.min(at_held))
    # the compute-optimal size: the surface's, which every run informs (a law through each
    # budget's best of three sizes would follow their noise)
    predicted_size, grid = float(n[int(np.argmin(at_held))]), sorted(float(x) for x in n)
    return {"variant": label, "budget": top, "fitted_on": budgets[:-1], "predicted": predicted, "interval": ci,
            "observed": observed, "error": observed / predicted - 1, "within_interval": inside,
            "observed_size": best.n, "predicted_size": predicted_size,
            "size_steps": cal.size_steps(predicted_size, best.n, grid), "surface": su.surface_dict(fit)}


def frontier_holdout(cells: list[su.Cell], budgets: list[float], reps: int,
                     drift: cal.Drift | None = None) -> dict | None:
    """The frontier's own check, beside the surface's: the lowest loss at each budget but the
    largest, fitted by a power law in C (`scaling.Frontier`, no floor), predicts the largest
    budget's best loss. Its 95% prediction interval: the runs redrawn with their budget's seed
    noise (each budget's best cell chosen anew) plus the noise of the observed mean
    (``seed_interval``), widened by the law's own error (``interval``, `calibration.law_error`:
    its leave-one-budget-out errors, for their number and for how far the held-out budget lies
    past the fitted ones). Given a ``drift`` (`calibration.Drift`, the lab's ladder of past
    studies), the prediction is the line moved by it and the interval the seed interval moved
    with it and widened by its spread (`calibration.drifted`); the line's own figures stay as
    ``line`` and ``lobo_interval``. None with fewer than 3 budgets. (The frontier says nothing
    of sizes: the compute-optimal size at the held-out budget is the surface's, `holdout`.)"""
    if len(budgets) < 3 or (split := _below_and_at(cells, budgets[-1])) is None:
        return None
    train, held = split
    top = budgets[-1]
    try:
        fit, best = fr.frontier_of(train)
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
                again, _ = fr.frontier_of(train, means)
            except ValueError:  # in this draw fewer budgets bracket their optimum
                continue
            draws.append(float(again.loss(top)) + last[0] / math.sqrt(len(chosen.losses)) * float(rng.standard_t(last[1])))
    seed_ci = su.interval(draws)
    fitted = sorted(best)
    lobo = cal.lobo_errors(fitted, [float(np.mean(train[best[b]].losses)) for b in fitted],
                           lambda b, losses: fr.fit_frontier(b, losses).loss)
    law = cal.law_error(lobo, top)
    line, lobo_ci = predicted, cal.calibrated(predicted, seed_ci, law)
    distance = math.log(top / fitted[-1])
    ci, moved = lobo_ci, None
    if drift is not None:
        predicted, ci, seed_ci = cal.drifted(line, seed_ci, drift, distance)
        moved = {**drift.as_dict(), "distance": distance, "shift": drift.shift(distance)}
    return {"predicted": predicted, "interval": ci, "seed_interval": seed_ci, "misspecification": law,
            "lobo": lobo, "lobo_rms": cal.misspecification(lobo), "reach": cal.reach(fitted, top),
            "line": line, "lobo_interval": lobo_ci, "drift": moved, "distance": distance,
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


def _frontier_noise(train: list[su.Cell], fit: fr.Frontier,
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


def _below_and_at(cells: list[su.Cell], top: float) -> tuple[list[su.Cell], list[su.Cell]] | None:
    """The cells below budget ``top`` (to fit on) and at it (to predict), or None where those
    below are too few for a fit (2 sizes and 5 runs) or none is at it."""
    train = [c for c in cells if c.budget < top and not np.isclose(c.budget, top)]
    held = [c for c in cells if np.isclose(c.budget, top)]
    if not held or len({c.n for c in train}) < 2 or sum(len(c.losses) for c in train) < 5:
        return None
    return train, held


def _prediction(train: list[su.Cell], held: list[su.Cell], form: str):
    """A surface of ``form`` fitted on ``train``; the held cell with the best observed loss; the
    held cells' sizes and tokens; and the fit's loss at each (its minimum: the predicted best)."""
    fit = su.fit_surface(*su.runs_of(train), form=form)
    best = min(held, key=lambda c: float(np.mean(c.losses)))
    n, d = np.array([c.n for c in held]), np.array([c.d for c in held])
    return fit, best, (n, d), fit.loss(n, d)


def choose_form(cells: list[su.Cell], budgets: list[float]) -> dict:
    """``surface=auto``: the form (`scaling.FORMS`) whose fit on every budget but the two
    largest predicts the second largest budget's best loss closest. The largest budget, which
    `holdout` keeps for its own check, plays no part in the choice. With fewer than 4 budgets
    there is no such nested check: the additive form, as on a tie."""
    if len(budgets) < 4:
        return {"form": su.FORMS[0], "why": "fewer than 4 budgets: no nested hold-out"}
    *inner, top = budgets[:-1]
    if (split := _below_and_at(cells, top)) is None:
        return {"form": su.FORMS[0], "why": f"too few runs below {top:.3g} FLOPs for a nested hold-out"}
    train, held = split
    errors = {}
    for form in su.FORMS:
        _, best, _, at_held = _prediction(train, held, form)
        errors[form] = float(np.mean(best.losses)) / float(np.min(at_held)) - 1
    return {"form": min(su.FORMS, key=lambda f: abs(errors[f])), "fitted_on": inner, "budget": top, "errors": errors}


def pooled_seed_sd(cells: list[su.Cell]) -> tuple[float, int] | None:
    """The pooled standard deviation of one run's loss over seeds within cells, and its degrees
    of freedom; None where every cell has one seed."""
    spread = [(len(c.losses) - 1, float(np.var(c.losses, ddof=1))) for c in cells if len(c.losses) > 1]
    if not spread:
        return None
    dof = sum(k for k, _ in spread)
    return math.sqrt(sum(k * v for k, v in spread) / dof), dof


def seed_sd(cells: list[su.Cell], fit: su.Surface) -> tuple[float, int]:
    """One run's loss noise and its degrees of freedom: the pooled standard deviation over
    seeds within cells, or, with one seed per cell, the fit's residuals' (less its five
    parameters)."""
    if (pooled := pooled_seed_sd(cells)) is not None:
        return pooled
    n, d, y = su.runs_of(cells)
    residuals = y - fit.loss(n, d)
    dof = max(1, len(residuals) - 5)
    return float(np.sqrt(np.sum(residuals ** 2) / dof)), dof
