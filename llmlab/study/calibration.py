"""What a study can stand behind at a budget it never saw: prediction intervals that allow for
a law that does not quite hold, and the decisions taken from them.

A prediction interval built from seed noise alone (a bootstrap over the runs) assumes the
fitted law is the true one. `calibrated` adds the law's own error, measured on the study's own
fitted budgets before the held-out budget is looked at: the root mean square of its
leave-one-budget-out errors (each fitted budget predicted by the law fitted to the others), in
logs and in quadrature with each side of the seed interval. Two things make that raw figure
too small, and `law_error` corrects both:

- it rests on a few errors (two to four): its 95% point is Student's t with as many degrees of
  freedom, not the normal's 1.96 (`small_sample`);
- a left-out budget lies one budget step from the others, and the held-out budget lies further:
  an error in the law's slope grows with the distance, so the error is scaled by how many steps
  (the fitted budgets' median spacing, in logs) the held-out budget lies past the largest fitted
  one, when that is more than one (`reach`).

With two fitted budgets there is nothing to leave out: the interval stays the seed interval,
and says so.

Both corrections widen the interval but leave its centre on the fitted line, and on this lab's
studies the line is biased: past the fitted budgets the loss falls faster than the line says
(the local exponent still rises across every budget a CPU reaches), so every held-out loss but
a few came out below its prediction. `Drift` is the route that removes that bias: the lab's own
ladder of past studies, each one's held-out error against its fitted line per unit of ln C it
extrapolated, gives a mean (the correction: the exponent past the fitted budgets is steeper by
that much) and a spread (a 95% half-width by Student's t over the studies, growing with the
distance extrapolated). The prediction is the line moved by the mean, the interval its seed
interval moved with it and widened by the spread in quadrature; the spread measures the law's
error directly, at the distance it matters, so the leave-one-budget-out term is not added
again. `LAB_DRIFT` is that ladder's figure over every committed study
(`python -m bench.holdout_forms` measures it, leaving each family of studies out in turn to
score the route); a study far from its budgets, its models or its recipe sets
``scaling.drift=none`` and gets the line with its leave-one-budget-out interval.

The decisions (`order`, `size_steps`): which variant is predicted lower at the held-out budget
and whether the interval of the gap excludes 0 (a decided order), and where the predicted
compute-optimal size falls on the held-out budget's grid of sizes, in grid steps from the size
observed best.

"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np


Z95 = 1.959964  # the two-sided 95% point of the normal


def lobo_errors(budgets: Sequence[float], losses: Sequence[float],
                fit: Callable[[list[float], list[float]], Callable[[float], float]]) -> dict[float, float]:
    """log(observed / predicted) at each budget, predicted by ``fit`` (budgets, losses -> a
    law) fitted to the other budgets; none where fewer than two others are left."""
    out = {}
    for i, b in enumerate(budgets):
        others = [j for j in range(len(budgets)) if j != i]
        if len(others) < 2:
            continue
        law = fit([budgets[j] for j in others], [losses[j] for j in others])
        out[float(b)] = math.log(float(losses[i]) / float(law(b)))
    return out


def misspecification(errors: dict[float, float]) -> float | None:
    """The root mean square of leave-one-budget-out errors (in logs); None without any."""
    return math.sqrt(float(np.mean(np.square(list(errors.values()))))) if errors else None


def small_sample(errors: dict[float, float]) -> float:
    """How much wider than the normal's the 95% point of a spread estimated from ``errors``
    alone is: Student's t with len(errors) degrees of freedom over 1.96 (1 without errors)."""
    from scipy.stats import t

    return float(t.ppf(0.975, len(errors))) / Z95 if errors else 1.0


def reach(fitted: Sequence[float], target: float) -> float:
    """How many budget steps (the fitted budgets' median spacing, in logs) ``target`` lies past
    the largest fitted budget; at least 1 (a left-out budget is one step from its neighbours)."""
    x = np.log(np.sort(np.asarray(fitted, float)))
    if len(x) < 2:
        return 1.0
    step = float(np.median(np.diff(x)))
    return max(1.0, (math.log(target) - float(x[-1])) / step) if step > 0 else 1.0


def law_error(errors: dict[float, float], target: float) -> float | None:
    """The law's error at ``target`` as a standard deviation in logs: the leave-one-budget-out
    errors' root mean square, times `small_sample` and `reach` (see the module's docstring);
    None without any error."""
    m = misspecification(errors)
    return None if m is None else m * small_sample(errors) * reach(list(errors), target)


def calibrated(predicted: float, seed_interval: tuple[float, float] | None,
               misspec: float | None) -> tuple[float, float] | None:
    """The seed interval widened by the law's error: in logs, each side's distance from the
    prediction and ``Z95 * misspec`` added in quadrature."""
    if seed_interval is None:
        return None
    if not misspec:
        return seed_interval
    lo, hi = seed_interval
    m = Z95 * misspec
    below = math.hypot(math.log(predicted / lo), m) if lo > 0 else float("inf")
    above = math.hypot(math.log(hi / predicted), m)
    return predicted * math.exp(-below), predicted * math.exp(above)


@dataclass(frozen=True)
class Drift:
    """How far held-out losses fell below the fitted line, per unit of ln C extrapolated, over
    ``studies`` past variant-studies at ``budgets`` (the smallest fitted and the largest
    held-out FLOPs): their mean ``rate`` (in ln L per ln C; negative: the loss fell faster) and
    standard deviation ``sd``."""

    rate: float
    sd: float
    studies: int
    budgets: tuple[float, float]

    def shift(self, distance: float) -> float:
        """The correction to ln L at ``distance`` (in ln C) past the largest fitted budget."""
        return self.rate * distance

    def half_width(self, distance: float) -> float:
        """The 95% half-width, in ln L, of that correction's error: Student's t over the
        studies (one degree of freedom spent on the mean), times ``sd`` and the distance."""
        from scipy.stats import t

        return float(t.ppf(0.975, max(1, self.studies - 1))) * self.sd * distance

    def as_dict(self) -> dict:
        return {"rate": self.rate, "sd": self.sd, "studies": self.studies, "budgets": list(self.budgets)}


def drift_of(cases: Sequence[tuple[float, float]], budgets: tuple[float, float]) -> Drift:
    """The `Drift` of (error in ln L against the fitted line, distance in ln C) pairs, one per
    variant-study; needs two of them, each with a positive distance."""
    rates = [e / d for e, d in cases if d > 0]
    if len(rates) < 2:
        raise ValueError("a drift needs at least 2 held-out studies that extrapolated past their budgets")
    return Drift(float(np.mean(rates)), float(np.std(rates, ddof=1)), len(rates), budgets)


# The ladder of this lab's 26 committed variant-studies with a frontier hold-out
# (bench/results/holdout_forms.json's summary.drift; tests/study/test_calibration.py checks the
# two agree): fitted from 2.5e10 FLOPs, held out up to 5e12, 2-layer models 8 to 96 wide on a
# 512-token vocabulary (bench.isoflop's design), on a CPU and on an H100. Past the fitted budgets the loss fell
# 0.0152 further per unit of ln C than the fitted line said.
LAB_DRIFT = Drift(rate=-0.015247, sd=0.017121, studies=26, budgets=(2.5e10, 5e12))


def drifted(line: float, seed_interval: tuple[float, float] | None, drift: Drift, distance: float
            ) -> tuple[float, tuple[float, float] | None, tuple[float, float] | None]:
    """The fitted line's prediction moved by ``drift`` at ``distance`` (ln C past the largest
    fitted budget); its 95% interval: the seed interval moved with it and widened on each side
    by the drift's 95% half-width, in logs and in quadrature; and the seed interval moved."""
    shift = math.exp(drift.shift(distance))
    predicted = line * shift
    if seed_interval is None:
        return predicted, None, None
    lo, hi = seed_interval[0] * shift, seed_interval[1] * shift
    m = drift.half_width(distance)
    below = math.hypot(math.log(predicted / lo), m) if lo > 0 else float("inf")
    above = math.hypot(math.log(hi / predicted), m)
    return predicted, (predicted * math.exp(-below), predicted * math.exp(above)), (lo, hi)


def log_sd(predicted: float, interval: tuple[float, float]) -> float:
    """The standard deviation in logs that a symmetric 95% interval of this width would have."""
    lo, hi = interval
    return (math.log(hi) - math.log(lo)) / (2 * Z95) if lo > 0 else float("inf")


def order(first: dict, second: dict) -> dict | None:
    """The predicted order of two variants at the held-out budget (each a calibrated hold-out:
    ``predicted``, ``interval``, ``observed``, ``lobo``): the gap ln(L_first / L_second) with its
    95% interval (the two seed spreads in quadrature, and the law's error on the gap itself, from
    the two variants' leave-one-budget-out errors at the budgets both left out, widened as
    `law_error` widens each variant's by ``reach``), whether that
    interval excludes 0, and whether the observed order agrees. None where either has no
    interval."""
    if first.get("interval") is None or second.get("interval") is None:
        return None
    gap = math.log(first["predicted"] / second["predicted"])
    seed = math.hypot(log_sd(first["predicted"], first["seed_interval"]),
                      log_sd(second["predicted"], second["seed_interval"]))
    shared = sorted(set(first.get("lobo", {})) & set(second.get("lobo", {})))
    law = 0.0
    if shared:  # the gap's own leave-one-budget-out errors, widened as each variant's (`law_error`)
        gaps = {b: first["lobo"][b] - second["lobo"][b] for b in shared}
        law = misspecification(gaps) * small_sample(gaps) * max(first.get("reach", 1.0), second.get("reach", 1.0))
    half = Z95 * math.hypot(seed, law)
    observed = math.log(first["observed"] / second["observed"])
    decided = abs(gap) > half
    return {"gap": gap, "interval": (gap - half, gap + half), "decided": decided,
            "predicted_lower": "first" if gap < 0 else "second", "observed_gap": observed,
            "agrees": (gap < 0) == (observed < 0)}


def size_steps(predicted: float, observed: float, grid: Sequence[float]) -> int:
    """How many grid steps the grid size nearest the predicted compute-optimal size (in logs)
    lies from the size observed best."""
    grid = sorted(grid)
    near = min(range(len(grid)), key=lambda i: abs(math.log(grid[i] / predicted)))
    return abs(near - grid.index(min(grid, key=lambda g: abs(g - observed))))
