"""The statistics against published table values and hand-worked cases."""

import math

import pytest

from llmlab.eval.stats import mean_ci, paired_t_test, sign_test


@pytest.mark.parametrize("values, t", [([1.0, 2.0], 12.7062), ([1.0, 2.0, 3.0], 4.3027), ([1.0, 2.0, 3.0, 4.0, 5.0], 2.7764)])
def test_mean_ci_uses_the_t_table(values, t):
    n = len(values)
    mean = sum(values) / n
    sd = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
    ci = mean_ci(values)
    assert ci.mean == pytest.approx(mean) and ci.n == n
    assert ci.half_width == pytest.approx(t * sd / math.sqrt(n), rel=1e-4)
    assert mean_ci([5.0]).half_width is None


def test_paired_t_and_sign_tests():
    # differences 0.1, 0.3, 0.2, 0.5: mean 0.275, sd 0.1708, t = 3.220 with 3 df -> p = 0.0486
    assert paired_t_test([1.1, 2.3, 3.2, 4.5], [1, 2, 3, 4]) == pytest.approx(0.0486, abs=5e-4)
    assert paired_t_test([1.5, 2.5], [1, 2]) == 0.0  # the same nonzero difference every time
    assert paired_t_test([1, 2], [1, 2]) == 1.0 and paired_t_test([1], [2]) is None
    assert sign_test([1, 2, 3], [2, 3, 4]) == pytest.approx(0.25)  # 3 of 3 one way: 2 / 8
    assert sign_test([1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 0]) == pytest.approx(2 * 7 / 64)
    assert sign_test([1, 2], [1, 2]) is None  # every pair tied
