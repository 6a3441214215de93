"""Small-sample statistics for comparing runs over seeds: Student-t intervals and tests, the
sign test, and the chi-square tail used by distribution tests.

The special functions are the regularised incomplete beta and gamma functions, evaluated by
their continued fractions (Press et al., Numerical Recipes, sections 6.2 and 6.4), so no
scipy is needed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

_EPS = 1e-15
_TINY = 1e-300


def _betacf(a: float, b: float, x: float) -> float:
    """Continued fraction of the incomplete beta function (modified Lentz)."""
    c, d = 1.0, 1.0 - (a + b) * x / (a + 1.0)
    d = 1.0 / (d if abs(d) > _TINY else _TINY)
    h = d
    for m in range(1, 500):
        m2 = 2 * m
        for num in (m * (b - m) * x / ((a + m2 - 1) * (a + m2)), -(a + m) * (a + b + m) * x / ((a + m2) * (a + m2 + 1))):
            d = 1.0 + num * d
            d = 1.0 / (d if abs(d) > _TINY else _TINY)
            c = 1.0 + num / c
            c = c if abs(c) > _TINY else _TINY
            h *= d * c
        if abs(d * c - 1.0) < _EPS:
            break
    return h


def betainc(a: float, b: float, x: float) -> float:
    """Regularised incomplete beta I_x(a, b)."""
    if x <= 0:
        return 0.0
    if x >= 1:
        return 1.0
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x < (a + 1) / (a + b + 2):
        return front * _betacf(a, b, x) / a
    return 1.0 - front * _betacf(b, a, 1 - x) / b


def gammaincc(a: float, x: float) -> float:
    """Regularised upper incomplete gamma Q(a, x)."""
    if x <= 0:
        return 1.0
    lead = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1:  # series for P(a, x)
        term = total = 1.0 / a
        n = a
        for _ in range(1000):
            n += 1
            term *= x / n
            total += term
            if abs(term) < abs(total) * _EPS:
                break
        return 1.0 - total * math.exp(lead)
    b = x + 1 - a  # continued fraction for Q(a, x)
    c, d = 1 / _TINY, 1 / b
    h = d
    for i in range(1, 1000):
        an = -i * (i - a)
        b += 2
        d = an * d + b
        d = 1 / (d if abs(d) > _TINY else _TINY)
        c = b + an / c
        c = c if abs(c) > _TINY else _TINY
        h *= d * c
        if abs(d * c - 1) < _EPS:
            break
    return math.exp(lead) * h


def t_sf(t: float, df: float) -> float:
    """P(T > t) for Student's t with ``df`` degrees of freedom."""
    tail = 0.5 * betainc(df / 2, 0.5, df / (df + t * t))
    return tail if t > 0 else 1 - tail


def t_quantile(p: float, df: float) -> float:
    """The t with P(T <= t) = p, by bisection on the tail."""
    lo, hi = -1e6, 1e6
    for _ in range(200):
        mid = (lo + hi) / 2
        if 1 - t_sf(mid, df) < p:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@dataclass
class Interval:
    mean: float
    half_width: float | None  # None with one value: no spread to estimate
    n: int


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with a Student-t confidence interval over seeds."""
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, t_quantile(0.5 + level / 2, n - 1) * sd / math.sqrt(n), n)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test that mean(a - b) = 0; None below 2 pairs."""
    diffs = [x - y for x, y in zip(a, b)]
    n = len(diffs)
    if n < 2:
        return None
    mean = sum(diffs) / n
    sd = math.sqrt(sum((d - mean) ** 2 for d in diffs) / (n - 1))
    if sd == 0:
        return 0.0 if mean != 0 else 1.0
    return min(1.0, 2 * t_sf(abs(mean / (sd / math.sqrt(n))), n - 1))


def sign_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided exact sign-test p-value over the non-tied pairs."""
    wins = sum(x < y for x, y in zip(a, b))
    losses = sum(x > y for x, y in zip(a, b))
    n = wins + losses
    if n == 0:
        return None
    k = min(wins, losses)
    return min(1.0, 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2 ** n)
