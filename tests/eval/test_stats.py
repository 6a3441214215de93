"""The statistics against published table values."""

import math

import pytest

from llmlab.eval.stats import gammaincc, mean_ci, paired_t_test, sign_test, t_quantile, t_sf


@pytest.mark.parametrize("df, t", [(1, 12.7062), (2, 4.3027), (4, 2.7764), (9, 2.2622), (30, 2.0423)])
def test_t_quantiles_match_the_table(df, t):
    assert t_quantile(0.975, df) == pytest.approx(t, abs=1e-4)


@pytest.mark.parametrize("x, df, p", [(3.8415, 1, 0.05), (18.307, 10, 0.05), (66.619, 35, 0.001), (10.0, 10, 0.4405)])
def test_chi2_tail_matches_the_table(x, df, p):
    assert gammaincc(df / 2, x / 2) == pytest.approx(p, abs=2e-4)  # the chi-square survival function


def test_t_tail_is_symmetric_and_matches_the_normal_for_many_df():
    assert t_sf(0.0, 7) == pytest.approx(0.5)
    assert t_sf(-1.3, 7) == pytest.approx(1 - t_sf(1.3, 7))
    assert t_sf(1.96, 10_000) == pytest.approx(0.025, abs=2e-4)


def test_mean_ci_paired_t_and_sign_tests():
    ci = mean_ci([1.0, 2.0, 3.0])
    assert ci.mean == 2.0 and ci.half_width == pytest.approx(4.3027 * 1.0 / math.sqrt(3), rel=1e-4)
    assert mean_ci([5.0]).half_width is None
    # differences 0.1, 0.3, 0.2, 0.5: mean 0.275, sd 0.1708, t = 3.220 with 3 df -> p = 0.0486
    assert paired_t_test([1.1, 2.3, 3.2, 4.5], [1, 2, 3, 4]) == pytest.approx(0.0486, abs=5e-4)
    assert sign_test([1, 2, 3], [2, 3, 4]) == pytest.approx(0.25)  # 3 of 3 one way: 2 / 8
    assert sign_test([1, 2, 3, 4, 5, 6], [2, 3, 4, 5, 6, 0]) == pytest.approx(2 * 7 / 64)
