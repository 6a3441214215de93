"""Where a budget is best spent: the compute-optimal size from a surface, and the IsoFLOP cross-check.

The compute-optimal size for a budget C minimises L(N, C / F(N)), where F(N) is the training
FLOPs per token, a power law k * N^gamma fitted to the runs' model cards (so C is counted in
the FLOPs that ``train.max_flops`` counts); with F = 6N this is Chinchilla's closed form.

Beside it, Chinchilla's second approach as a cross-check: at each budget a parabola in log N
through the losses, whose vertex is that budget's optimum. It is biased when the sizes are
not centred on the optimum or when alpha != beta (Czech et al. 2026, "Problems with
Chinchilla Approach 2"), so a grid whose optimum lies off its centre is flagged.

"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from llmlab.study.surface import Surface


CENTRE = (0.25, 0.75)  # an optimum outside this share of the size grid's log span is off-centre


@dataclass(frozen=True)
class FlopsPerToken:
    """Training FLOPs per token as a function of non-embedding parameters: k * N^gamma, fitted
    to the model cards (the LM head, attention and embeddings make it other than 6N)."""

    k: float
    gamma: float

    @classmethod
    def fit(cls, n: Sequence[float], fpt: Sequence[float]) -> "FlopsPerToken":
        ln, lf = np.log(np.asarray(n, float)), np.log(np.asarray(fpt, float))
        if len(np.unique(ln)) < 2:
            return cls(float(np.exp(lf.mean() - ln.mean())), 1.0)
        gamma, logk = np.polyfit(ln, lf, 1)
        return cls(float(np.exp(logk)), float(gamma))

    def __call__(self, n):
        return self.k * np.power(n, self.gamma)


def optimum(s: Surface, f: FlopsPerToken, budget, bounds: tuple[float, float]) -> dict:
    """The compute-optimal non-embedding size, tokens and loss at ``budget`` FLOPs (arrays
    for an array of budgets), from dL/dN = 0 along D = C / F(N):
    N^(alpha + gamma beta) = alpha A (C/k)^beta / (gamma beta B). Clipped to ``bounds``; ``at_edge``
    says where the clip decided it (the surface has no optimum inside them)."""
    c = np.asarray(budget, dtype=float)
    lo, hi = bounds
    if s.a <= 0:  # size does not help: the smallest
        n = np.full_like(c, lo)
    elif s.b <= 0:  # tokens do not help: the largest
        n = np.full_like(c, hi)
    elif s.form == "kaplan":  # the inside, a N^-(alpha/beta) + b k N^gamma / C, at its minimum (in logs)
        p = s.alpha / s.beta
        log_ratio = (math.log(s.a) - math.log(s.b)) / s.beta  # log(a / b), a = A^(1/beta), b = B^(1/beta)
        n = np.exp((math.log(p) + log_ratio + np.log(c) - math.log(f.gamma * f.k)) / (p + f.gamma))
    else:
        power = s.alpha + f.gamma * s.beta
        n = (s.alpha * s.a * (c / f.k) ** s.beta / (f.gamma * s.beta * s.b)) ** (1.0 / power)
    clipped = np.clip(n, lo, hi)
    d = c / f(clipped)
    return {"n": clipped, "d": d, "loss": s.loss(clipped, d), "at_edge": ~np.isclose(clipped, n, rtol=1e-9)}


def isoflop(sizes: Sequence[float], losses: Sequence[float]) -> dict | None:
    """Chinchilla's second approach at one budget: a parabola in log N through the (mean)
    losses of at least three sizes. Its vertex, and where it lies in the grid's log span (0 at
    the smallest size, 1 at the largest)."""
    x, y = np.log(np.asarray(sizes, float)), np.asarray(losses, float)
    if len(np.unique(x)) < 3:
        return None
    curve, slope, _ = np.polyfit(x, y, 2)
    if curve <= 0:
        return {"n": None, "loss": None, "position": None, "why": "the losses are not convex in log N: no vertex"}
    u = -slope / (2 * curve)
    return {"n": float(np.exp(u)), "loss": float(np.polyval(np.polyfit(x, y, 2), u)),
            "position": float((u - x.min()) / (x.max() - x.min())), "why": None}


def grid_position(n_opt: float, sizes: Sequence[float]) -> float:
    x = np.log(np.asarray(sizes, float))
    return float((np.log(n_opt) - x.min()) / (x.max() - x.min()))


def off_centre(position: float | None) -> bool:
    return position is not None and not CENTRE[0] <= position <= CENTRE[1]


def crossing(first: Callable, second: Callable, lo: float, hi: float, points: int = 200) -> float | None:
    """The lowest budget in [lo, hi] where two loss-vs-compute curves cross, or None."""
    from scipy.optimize import brentq

    u = np.linspace(np.log(lo), np.log(hi), points)
    diff = first(np.exp(u)) - second(np.exp(u))
    change = np.nonzero(np.sign(diff[:-1]) * np.sign(diff[1:]) < 0)[0]
    if len(change) == 0:
        return None
    k = change[0]
    return float(np.exp(brentq(lambda v: float(first(np.exp(v)) - second(np.exp(v))), u[k], u[k + 1])))
