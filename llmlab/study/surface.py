"""The loss surface L(N, D) of a variant's runs: which form, how it is fitted, how sure.

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
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Sequence

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
