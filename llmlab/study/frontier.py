"""The frontier: the lowest loss run at each budget, a power law in the budget.

A second route to the compute-optimal loss, independent of the surface
(`llmlab.study.surface`), is the frontier: the lowest loss run
at each budget, against the budget, fitted by a power law in C with no floor (Kaplan et al.
2020's L(C_min) = (C_c / C)^gamma; a line in log-log). It assumes no floor is within reach of
the budgets, where the surface assumes the additive form: the hold-out check asks both to
predict the largest budget, so the runs say which assumption holds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from llmlab.study.surface import BOOTSTRAPS, Cell


@dataclass
class Frontier:
    """L*(C) = (c_c / C)^gamma, fitted in logs (``log_g`` = gamma * ln c_c) to the lowest loss
    run at each budget."""

    log_g: float
    gamma: float

    def loss(self, c):
        return np.exp(self.log_g - self.gamma * np.log(np.asarray(c, float)))

    @property
    def c_c(self) -> float | None:
        """The budget where the law reaches a loss of 1; None where the loss does not fall with
        the budget, or where that budget is past a float's range."""
        if self.gamma <= 0 or self.log_g / self.gamma > 700:
            return None
        return math.exp(self.log_g / self.gamma)


def best_cells(cells: Sequence[Cell], means: Sequence[float] | None = None) -> dict[float, int]:
    """Per budget whose optimum the sizes bracket, the index of its cell with the lowest mean
    loss (or lowest of ``means``). A budget of fewer than 3 sizes, or whose best is its smallest
    or largest size, has not seen its optimum, so its best is no point of the frontier."""
    means = [float(np.mean(c.losses)) for c in cells] if means is None else list(means)
    by: dict[float, list[int]] = {}
    for i, c in enumerate(cells):
        by.setdefault(next((b for b in by if np.isclose(b, c.budget)), c.budget), []).append(i)
    best = {}
    for budget, members in by.items():
        sizes = sorted({cells[i].n for i in members})
        i = min(members, key=lambda j: means[j])
        if len(sizes) >= 3 and grid_end(sizes, cells[i].n) is None:
            best[budget] = i
    return best


def grid_end(sizes: Sequence[float], n: float) -> str | None:
    """"smallest" or "largest" where ``n`` is that end of a grid of 3 sizes or more (the grid
    did not bracket its optimum), else None."""
    if len(sizes) < 3:
        return None
    return "smallest" if n == min(sizes) else "largest" if n == max(sizes) else None


def fit_frontier(budgets: Sequence[float], losses: Sequence[float]) -> Frontier:
    """A line through (ln C, ln L*) by least squares. Needs two budgets or more."""
    x, y = np.log(np.asarray(budgets, float)), np.log(np.asarray(losses, float))
    if len(np.unique(x)) < 2:
        raise ValueError("a frontier needs at least 2 budgets whose sizes bracket their optimum")
    slope, intercept = np.polyfit(x, y, 1)
    return Frontier(float(intercept), float(-slope))


def frontier_of(cells: Sequence[Cell], means: Sequence[float] | None = None) -> tuple[Frontier, dict[float, int]]:
    """The frontier fitted to the cells' best loss per budget, and which cell that was."""
    means = [float(np.mean(c.losses)) for c in cells] if means is None else list(means)
    best = best_cells(cells, means)
    budgets = sorted(best)
    return fit_frontier(budgets, [means[best[b]] for b in budgets]), best


def frontier_bootstrap(cells: Sequence[Cell], reps: int = BOOTSTRAPS, seed: int = 0) -> list[Frontier]:
    """Frontiers refitted with each cell's seeds drawn with replacement (the best cell of a
    budget is chosen anew in each replicate, so its selection is part of the spread). Empty
    where every cell has one seed: nothing to resample."""
    if all(len(c.losses) == 1 for c in cells):
        return []
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(reps):
        try:
            out.append(frontier_of(cells, [float(np.mean(rng.choice(c.losses, len(c.losses)))) for c in cells])[0])
        except ValueError:  # in this draw fewer budgets bracket their optimum
            continue
    return out


def frontier_crossing(first: Frontier, second: Frontier) -> float | None:
    """The budget where two frontiers cross (two lines in log-log), or None if parallel."""
    if np.isclose(first.gamma, second.gamma, rtol=0, atol=1e-12):
        return None
    u = (first.log_g - second.log_g) / (first.gamma - second.gamma)
    return float(math.exp(u)) if abs(u) < 700 else None
