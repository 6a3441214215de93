"""Scaling fits: which variant wins at which compute budget.

A sweep over budgets (``train.max_flops``) and sizes (``model.*``) gives each variant final
losses L at (N, D), N the non-embedding parameters and D the training tokens. Over all of a
variant's runs, Chinchilla's parametric surface (their third approach)

    L(N, D) = E + A * N^-alpha + B * D^-beta

is fitted by variable projection: for fixed (alpha, beta) the rest is a non-negative linear
least-squares problem (scipy's NNLS), so (alpha, beta) are searched on a grid and refined by
Nelder-Mead from the best grid point, which avoids the local minima of a joint fit.

The additive surface assumes size and tokens act apart. At small scale they do not (the runs
of bench.isoflop: fitted without the largest budget, it under-predicted that budget's best
loss in all ten of its variant-studies, by 2 to 6%). The other form offered is Kaplan et al.'s
(2020, eq. 1.5) with an irreducible term, the same five parameters with the same meaning at
the limits (D -> inf: E + A N^-alpha; N -> inf: E + B D^-beta):

    L(N, D) = E + (A^(1/beta) * N^(-alpha/beta) + B^(1/beta) * D^-1)^beta

fitted the same way, over (alpha, beta) and the mix of the two terms (rho below), with (E, a
scale) linear.

Uncertainty comes from a bootstrap over seeds (each cell of the design draws its seeds with
replacement), or over the residuals when every cell has one seed.

The compute-optimal size for a budget C minimises L(N, C / F(N)), where F(N) is the training
FLOPs per token, a power law k * N^gamma fitted to the runs' model cards (so C is counted in
the FLOPs that ``train.max_flops`` counts); with F = 6N this is Chinchilla's closed form.

A second, independent route to the compute-optimal loss is the frontier: the lowest loss run
at each budget, against the budget, fitted by a power law in C with no floor (Kaplan et al.
2020's L(C_min) = (C_c / C)^gamma; a line in log-log). It assumes no floor is within reach of
the budgets, where the surface assumes the additive form: the hold-out check asks both to
predict the largest budget, so the runs say which assumption holds.

Beside it, Chinchilla's second approach as a cross-check: at each budget a parabola in log N
through the losses, whose vertex is that budget's optimum. It is biased when the sizes are
not centred on the optimum or when alpha != beta (Czech et al. 2026, "Problems with
Chinchilla Approach 2"), so a grid whose optimum lies off its centre is flagged.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np

EXPONENTS = (0.02, 2.0)  # the search range of alpha and beta
GRID = 40  # grid points per exponent for a fit
FORMS = ("chinchilla", "kaplan")  # the surface's form (see the module's docstring)
# Kaplan's form: rho, the log of the token term's weight against the size term's at the runs'
# geometric mean, is searched in this range (a fit at its end has one term only)
MIX = (-12.0, 12.0)
MIX_GRID = 25
BOOT_GRID = 12  # a coarser grid for each bootstrap replicate
# ... refined to a coarser tolerance: with few points the surface is flat along some direction,
# and Nelder-Mead at the main fit's 1e-6 spent its 2,000 iterations on most replicates (20 s
# of a 6-run sweep's report), for exponents that differ below the interval's own width
BOOT_XATOL, BOOT_MAXITER = 1e-4, 300
# ... and Nelder-Mead stops there: it ends when its simplex is within xatol AND its losses agree
# within fatol, and an absolute 1e-16 kept it shrinking to ~1e-10 (110 evaluations a replicate);
# losses that agree to 1e-7 of their size end it at 52, the exponents within 5e-5 of an exact fit
BOOT_FRTOL = 1e-7
BOOTSTRAPS = 200
CENTRE = (0.25, 0.75)  # an optimum outside this share of the size grid's log span is off-centre
LEVEL = 0.95


@dataclass(frozen=True)
class Surface:
    e: float
    a: float
    alpha: float
    b: float
    beta: float
    rmse: float
    form: str = "chinchilla"  # or "kaplan" (FORMS)
    mix_at_end: bool = False  # kaplan: the terms' mix (rho) at an end of its search

    def loss(self, n, d):
        n, d = np.asarray(n, dtype=float), np.asarray(d, dtype=float)
        if self.form == "kaplan":
            if self.a <= 0 or self.b <= 0:  # one term: the two forms agree
                return self.e + self.a * np.power(n, -self.alpha) + self.b * np.power(d, -self.beta)
            # in logs: A^(1/beta) and B^(1/beta) overflow a float where beta is small
            size = (math.log(self.a) - self.alpha * np.log(n)) / self.beta
            tokens = math.log(self.b) / self.beta - np.log(d)
            return self.e + np.exp(self.beta * np.logaddexp(size, tokens))
        return self.e + self.a * np.power(n, -self.alpha) + self.b * np.power(d, -self.beta)


def _project(alpha: float, beta: float, ln: np.ndarray, ld: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
    """The best non-negative (E, A', B') for fixed exponents, on sizes and tokens scaled to 1
    at their geometric means (``ln``, ``ld``: their logs); and the sum of squared residuals."""
    from scipy.optimize import nnls

    x = np.column_stack([np.ones_like(y), np.exp(-alpha * ln), np.exp(-beta * ld)])
    coef, rnorm = nnls(x, y)
    return coef, float(rnorm) ** 2


def _grid_sse(exps: np.ndarray, ln: np.ndarray, ld: np.ndarray, y: np.ndarray) -> np.ndarray:
    """`_project`'s sum of squared residuals at every (alpha, beta) of ``exps`` x ``exps``, by
    exact NNLS for three coefficients: the least-squares solution on each face of the
    non-negative orthant (each subset of the columns), the lowest residual among the faces
    whose solution is non-negative. Vectorised over the grid through the normal equations."""
    u = np.exp(-exps[:, None] * ln[None, :])  # (G, runs): N^-alpha for each alpha
    v = np.exp(-exps[:, None] * ld[None, :])  # D^-beta for each beta
    shape = (len(exps), len(exps))
    g = np.empty(shape + (3, 3))
    g[..., 0, 0] = len(y)
    g[..., 0, 1] = g[..., 1, 0] = u.sum(1)[:, None]
    g[..., 0, 2] = g[..., 2, 0] = v.sum(1)[None, :]
    g[..., 1, 1] = (u * u).sum(1)[:, None]
    g[..., 2, 2] = (v * v).sum(1)[None, :]
    g[..., 1, 2] = g[..., 2, 1] = u @ v.T
    h = np.empty(shape + (3,))
    h[..., 0], h[..., 1], h[..., 2] = y.sum(), (u @ y)[:, None], (v @ y)[None, :]
    yy = float(y @ y)
    best = np.full(shape, yy)  # the empty face: all coefficients 0
    with np.errstate(divide="ignore", invalid="ignore"):
        for face in ([0], [1], [2], [0, 1], [0, 2], [1, 2], [0, 1, 2]):
            gf, hf = g[..., face, :][..., :, face], h[..., face]
            coef = np.linalg.solve(gf, hf[..., None])[..., 0] if len(face) > 1 else hf / gf[..., 0]
            sse = yy - (coef * hf).sum(-1)
            ok = np.all(coef >= 0, axis=-1) & np.isfinite(sse)
            best = np.where(ok & (sse < best), sse, best)
    return np.maximum(best, 0.0)


def fit_surface(n: Sequence[float], d: Sequence[float], loss: Sequence[float], grid: int = GRID,
                xatol: float = 1e-6, maxiter: int = 2000, frtol: float = 0.0, form: str = "chinchilla") -> Surface:
    """Least-squares fit of L = E + A N^-alpha + B D^-beta (E, A, B >= 0) by variable
    projection, or of Kaplan's form (``form="kaplan"``, the module's docstring). Needs at least
    two sizes, two token counts and five points. ``grid``, ``xatol``, ``maxiter`` and
    ``frtol``: the exponents' search grid and Nelder-Mead's refinement, which ends when its
    simplex is within ``xatol`` and its sums of squares agree within ``frtol`` of their size
    (0: to the last digits)."""
    from scipy.optimize import minimize

    if form not in FORMS:
        raise ValueError(f"form: unknown {form!r}; allowed: {', '.join(FORMS)}")
    n, d, y = (np.asarray(v, dtype=float) for v in (n, d, loss))
    if len(y) < 5 or len(np.unique(n)) < 2 or len(np.unique(d)) < 2:
        raise ValueError("a surface needs at least 5 runs over at least 2 sizes and 2 token counts")
    n0, d0 = np.exp(np.log(n).mean()), np.exp(np.log(d).mean())
    ln, ld = np.log(n / n0), np.log(d / d0)
    if form == "kaplan":
        return _fit_kaplan(ln, ld, y, n0, d0, grid, xatol, maxiter, frtol)
    exps = np.linspace(*EXPONENTS, grid)
    # the grid at once through the normal equations, then its few best points again by NNLS
    # itself (the normal equations lose digits where an exponent is near 0)
    rough = _grid_sse(exps, ln, ld, y)
    candidates = [np.unravel_index(k, rough.shape) for k in np.argsort(rough, axis=None)[:3]]
    value, i, j = min((_project(exps[i], exps[j], ln, ld, y)[1], i, j) for i, j in candidates)
    best = np.array([exps[i], exps[j]])
    refined = minimize(lambda p: _project(p[0], p[1], ln, ld, y)[1], best, method="Nelder-Mead",
                       bounds=[EXPONENTS, EXPONENTS],
                       options={"xatol": xatol, "fatol": max(frtol * value, 1e-16), "maxiter": maxiter})
    if refined.fun < value:
        best, value = refined.x, refined.fun
    alpha, beta = (float(v) for v in best)
    (e, a, b), _ = _project(alpha, beta, ln, ld, y)
    return Surface(float(e), float(a * n0 ** alpha), alpha, float(b * d0 ** beta), beta, float(np.sqrt(value / len(y))))


def _kaplan_term(alpha, beta, rho, ln: np.ndarray, ld: np.ndarray) -> np.ndarray:
    """Kaplan's form without its scale: (N'^(-alpha/beta) + e^rho / D')^beta on sizes and
    tokens scaled to 1 at their geometric means; broadcasts over the parameters' shapes."""
    return np.exp(beta * np.logaddexp(-(alpha / beta) * ln, rho - ld))


def _two_column(f: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The least-squares y ~ E + s f with E, s >= 0, vectorised over ``f``'s leading axes (the
    runs on the last): E, s and the sum of squared residuals. The unconstrained solution where
    both are non-negative, else the better of the two faces (E alone, s alone)."""
    m = y.size
    fm, ym = f.mean(-1), y.mean()
    sff = (f * f).sum(-1) - m * fm * fm
    sfy = f @ y - m * fm * ym
    yy = float(y @ y)
    with np.errstate(divide="ignore", invalid="ignore"):
        s_full = np.where(sff > 0, sfy / sff, 0.0)
        e_full = ym - s_full * fm
        s_only = np.maximum((f @ y) / (f * f).sum(-1), 0.0)
    def sse(e, s):
        return yy - 2 * e * m * ym - 2 * s * (f @ y) + m * e * e + 2 * e * s * m * fm + s * s * (f * f).sum(-1)
    full = np.where((s_full >= 0) & (e_full >= 0), sse(e_full, s_full), np.inf)
    e_face = sse(np.maximum(ym, 0.0), 0.0) + np.zeros_like(fm)
    s_face = sse(0.0, s_only)
    best = np.argmin(np.stack([full, e_face, s_face]), axis=0)
    e = np.choose(best, [e_full, np.maximum(ym, 0.0) + np.zeros_like(fm), np.zeros_like(fm)])
    s = np.choose(best, [s_full, np.zeros_like(fm), s_only])
    return e, s, np.maximum(np.choose(best, [full, e_face, s_face]), 0.0)


def _fit_kaplan(ln: np.ndarray, ld: np.ndarray, y: np.ndarray, n0: float, d0: float, grid: int,
                xatol: float, maxiter: int, frtol: float) -> Surface:
    """`fit_surface` for Kaplan's form: L = E + s (N'^(-alpha/beta) + e^rho / D')^beta, with
    (E, s) linear for fixed (alpha, beta, rho): a grid over the three, then Nelder-Mead."""
    from scipy.optimize import minimize

    exps = np.linspace(*EXPONENTS, grid)
    mixes = np.linspace(*MIX, MIX_GRID if grid >= GRID else max(9, MIX_GRID // 2))
    a, b, r = np.meshgrid(exps, exps, mixes, indexing="ij")
    f = _kaplan_term(a[..., None], b[..., None], r[..., None], ln, ld)
    rough = _two_column(f, y)[2]
    ym = float(y.mean())
    e_alone = float(((y - ym) ** 2).sum())  # E alone, at the mean

    def objective(p):  # `_two_column` for one point, in scalars (Nelder-Mead calls it hundreds of times)
        f = _kaplan_term(p[0], p[1], p[2], ln, ld)
        fy, ff, fm = float(f @ y), float(f @ f), float(f.mean())
        sff = ff - len(y) * fm * fm
        s = (fy - len(y) * fm * ym) / sff if sff > 0 else 0.0
        if s >= 0 and ym - s * fm >= 0:
            r = y - (ym - s * fm) - s * f
            return float(r @ r)
        r = y - max(fy / ff, 0.0) * f
        return min(e_alone, float(r @ r))

    candidates = [np.unravel_index(k, rough.shape) for k in np.argsort(rough, axis=None)[:3]]
    value, best = min((objective(p), p) for p in (np.array([exps[i], exps[j], mixes[k]]) for i, j, k in candidates))
    # the sum of squares is flat along the mix where one term dominates: to 1e-10 of its size,
    # not to the last digit (which took Nelder-Mead its 2,000 iterations, 5 s a fit)
    refined = minimize(objective, best, method="Nelder-Mead", bounds=[EXPONENTS, EXPONENTS, MIX],
                       options={"xatol": xatol, "fatol": max(frtol, 1e-10) * value, "maxiter": maxiter})
    if refined.fun < value:
        best, value = refined.x, refined.fun
    alpha, beta, rho = (float(v) for v in best)
    e, s, _ = (float(v) for v in _two_column(_kaplan_term(alpha, beta, rho, ln, ld), y))
    at_end = bool(np.isclose(rho, MIX[0], atol=1e-3) or np.isclose(rho, MIX[1], atol=1e-3))
    return Surface(e, float(s * n0 ** alpha), alpha, float(s * math.exp(rho * beta) * d0 ** beta), beta,
                   float(np.sqrt(value / len(y))), "kaplan", at_end)


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


@dataclass(frozen=True)
class Cell:
    """One point of the design (a size at a budget) with its runs, one loss per seed."""

    n: float
    d: float
    c: float
    fpt: float
    budget: float
    losses: tuple[float, ...]


def runs_of(cells: Sequence[Cell]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The cells as one row per run: sizes, tokens and losses."""
    return (np.array([c.n for c in cells for _ in c.losses], dtype=float),
            np.array([c.d for c in cells for _ in c.losses], dtype=float),
            np.array([v for c in cells for v in c.losses], dtype=float))


def bootstrap(cells: Sequence[Cell], fit: Surface, reps: int = BOOTSTRAPS, seed: int = 0) -> tuple[list[Surface], str]:
    """Surfaces refitted to resampled data: each cell's seeds drawn with replacement; where
    every cell has one seed, the fit's residuals drawn with replacement instead."""
    rng = np.random.default_rng(seed)
    n, d, y = runs_of(cells)
    one_seed = all(len(c.losses) == 1 for c in cells)
    residuals = y - fit.loss(n, d)
    out = []
    for _ in range(reps):
        if one_seed:
            sample = fit.loss(n, d) + rng.choice(residuals, len(y))
        else:
            sample = np.array([v for c in cells for v in rng.choice(c.losses, len(c.losses))])
        try:
            out.append(boot_fit(n, d, sample, fit.form))
        except ValueError:
            continue
    return out, ("residuals (one seed per cell)" if one_seed else "seeds within each cell")


def boot_fit(n: np.ndarray, d: np.ndarray, sample: np.ndarray, form: str = "chinchilla") -> Surface:
    """`fit_surface` as each bootstrap replicate runs it (a coarser grid and tolerance)."""
    return fit_surface(n, d, sample, grid=BOOT_GRID, xatol=BOOT_XATOL, maxiter=BOOT_MAXITER, frtol=BOOT_FRTOL,
                       form=form)


def interval(values, level: float = LEVEL) -> tuple[float, float] | None:
    values = np.asarray([v for v in np.ravel(values) if np.isfinite(v)])
    if len(values) < 2:
        return None
    q = (1 - level) / 2
    return float(np.quantile(values, q)), float(np.quantile(values, 1 - q))


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


def at_bounds(s: Surface) -> list[str]:
    """The fitted values that sit on a bound of the search (an exponent at an end of
    ``EXPONENTS``, a coefficient at 0, Kaplan's mix at an end of ``MIX``): there the runs do not pin the value down, and what
    follows from it (N*, D*, the crossing) leans on the bound."""
    ends = [f"{name} = {v:g} (the search's {'lower' if np.isclose(v, EXPONENTS[0], rtol=1e-3) else 'upper'} end)"
            for name, v in (("α", s.alpha), ("β", s.beta))
            if np.isclose(v, EXPONENTS[0], rtol=1e-3) or np.isclose(v, EXPONENTS[1], rtol=1e-3)]
    mix = [f"the mix of the size and token terms (ρ) at an end of its search {MIX}, so one term alone"] if s.mix_at_end else []
    return ends + [f"{name} = 0" for name, v in (("E", s.e), ("A", s.a), ("B", s.b)) if v <= 0] + mix


def surface_dict(s: Surface) -> dict:
    return {**asdict(s), "at_bounds": at_bounds(s)}


# -- the frontier: the best loss per budget, a power law in C ----------------------------------

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
