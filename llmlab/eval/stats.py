"""Small-sample statistics for comparing runs over seeds: Student-t intervals, the paired
t-test and the exact sign test, from scipy.stats, with the edge cases a report meets (one
seed, identical runs) answered instead of returned as NaN."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence


@dataclass
class Interval:
    mean: float
    half_width: float | None  # None with one value: no spread to estimate
    n: int


def mean_ci(values: Sequence[float], level: float = 0.95) -> Interval:
    """Mean with a Student-t confidence interval over seeds."""
    from scipy import stats

    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return Interval(mean, None, n)
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    return Interval(mean, float(stats.t.ppf(0.5 + level / 2, n - 1)) * sd / math.sqrt(n), n)


def paired_t_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value of the paired t-test that mean(a - b) = 0; None below 2 pairs; with
    no spread in the differences, 0 if they are not all zero, else 1."""
    from scipy import stats

    diffs = [x - y for x, y in zip(a, b)]
    if len(diffs) < 2:
        return None
    if len(set(diffs)) == 1:
        return 0.0 if diffs[0] != 0 else 1.0
    return float(stats.ttest_rel(a[:len(diffs)], b[:len(diffs)]).pvalue)


def sign_test(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided exact sign-test p-value over the non-tied pairs."""
    from scipy import stats

    wins = sum(x < y for x, y in zip(a, b))
    losses = sum(x > y for x, y in zip(a, b))
    if wins + losses == 0:
        return None
    return float(stats.binomtest(wins, wins + losses, 0.5).pvalue)
