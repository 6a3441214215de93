"""Calibrated intervals and decisions at a held-out budget (`llmlab.eval.calibration`)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from llmlab.study import calibration as cal
from llmlab.study import frontier as fr


def frontier_fit(budgets, losses):
    return fr.fit_frontier(budgets, losses).loss


def test_a_law_that_holds_has_no_leave_one_out_error_and_keeps_the_seed_interval():
    budgets = [1e10, 2e10, 5e10, 1e11]
    losses = [3.0 * (b / 1e10) ** -0.1 for b in budgets]
    errors = cal.lobo_errors(budgets, losses, frontier_fit)
    assert sorted(errors) == budgets and max(abs(e) for e in errors.values()) < 1e-12
    assert cal.calibrated(2.5, (2.4, 2.6), cal.misspecification(errors)) == pytest.approx((2.4, 2.6))
    assert cal.misspecification({}) is None and cal.calibrated(2.5, (2.4, 2.6), None) == (2.4, 2.6)
    # two budgets: nothing to leave out (a line through one point is no law)
    assert cal.lobo_errors(budgets[:2], losses[:2], frontier_fit) == {}


def test_a_bending_law_widens_the_interval_by_its_own_error_in_quadrature():
    budgets = [1e10, 2e10, 5e10, 1e11]
    losses = [3.0 * (b / 1e10) ** -(0.1 + 0.02 * math.log10(b / 1e10)) for b in budgets]  # the exponent rises
    errors = cal.lobo_errors(budgets, losses, frontier_fit)
    m = cal.misspecification(errors)
    expected = math.sqrt(np.mean([e * e for e in errors.values()]))
    assert m == pytest.approx(expected) and m > 1e-3
    lo, hi = cal.calibrated(2.5, (2.4, 2.6), m)
    assert math.log(2.5 / lo) == pytest.approx(math.hypot(math.log(2.5 / 2.4), cal.Z95 * m))
    assert math.log(hi / 2.5) == pytest.approx(math.hypot(math.log(2.6 / 2.5), cal.Z95 * m))


def held(predicted, observed, half, lobo=None):
    interval = (predicted * math.exp(-half), predicted * math.exp(half))
    return {"predicted": predicted, "observed": observed, "interval": interval, "seed_interval": interval,
            "lobo": lobo or {}}


def test_an_order_is_decided_only_where_the_gaps_interval_excludes_zero():
    sd = 0.01 * cal.Z95  # each variant's 95% half-width in logs: 1.96 sd of 1%
    wide = cal.order(held(3.0, 3.01, sd), held(3.02, 3.0, sd))  # a 0.7% gap, 2.8% of combined half-width
    assert not wide["decided"] and wide["predicted_lower"] == "first" and not wide["agrees"]
    clear = cal.order(held(3.0, 3.0, sd), held(3.3, 3.31, sd))
    assert clear["decided"] and clear["agrees"] and clear["interval"][1] < 0
    assert clear["gap"] == pytest.approx(math.log(3.0 / 3.3))
    # a law that misses both variants alike costs the gap nothing; misses in opposite directions do
    same = cal.order(held(3.0, 3.0, sd, {1e10: 0.05}), held(3.3, 3.31, sd, {1e10: 0.05}))
    opposite = cal.order(held(3.0, 3.0, sd, {1e10: 0.05}), held(3.3, 3.31, sd, {1e10: -0.05}))
    assert same["interval"] == pytest.approx(clear["interval"]) and not opposite["decided"]


def test_size_steps_counts_grid_steps_in_logs():
    grid = [8.0, 16.0, 32.0, 64.0]
    assert cal.size_steps(16.5, 16.0, grid) == 0
    assert cal.size_steps(40.0, 16.0, grid) == 1  # 40 is nearer 32 than 64 in logs
    assert cal.size_steps(60.0, 8.0, grid) == 3


def test_the_laws_error_is_widened_for_its_few_errors_and_for_the_distance_past_the_fitted_budgets():
    fitted = [1e10, 2e10, 4e10]
    assert cal.reach(fitted, 1.6e11) == pytest.approx(2.0)  # two doublings past 4e10, one doubling a step
    assert cal.reach(fitted, 6e10) == 1.0 and cal.reach(fitted[:1], 1e12) == 1.0
    errors = {1e10: 0.01, 2e10: -0.02, 4e10: 0.01}
    t3 = 3.182446  # Student's t, 3 degrees of freedom, 97.5%
    assert cal.small_sample(errors) == pytest.approx(t3 / cal.Z95, rel=1e-5) and cal.small_sample({}) == 1.0
    rms = math.sqrt((0.01 ** 2 + 0.02 ** 2 + 0.01 ** 2) / 3)
    assert cal.law_error(errors, 1.6e11) == pytest.approx(rms * t3 / cal.Z95 * 2.0, rel=1e-5)
    assert cal.law_error({}, 1.6e11) is None


def test_the_gaps_law_error_grows_with_the_reach_as_each_variants_does():
    sd = 0.005 * cal.Z95
    up, down = {1e10: 0.005, 2e10: -0.005, 4e10: 0.005}, {1e10: -0.005, 2e10: 0.005, 4e10: -0.005}
    near = cal.order({**held(3.0, 3.0, sd, up), "reach": 1.0}, {**held(3.2, 3.2, sd, down), "reach": 1.0})
    far = cal.order({**held(3.0, 3.0, sd, up), "reach": 3.0}, {**held(3.2, 3.2, sd, down), "reach": 3.0})
    assert near["decided"] and not far["decided"]
    assert far["interval"][1] - far["gap"] > near["interval"][1] - near["gap"]


def test_a_drift_is_the_mean_and_spread_of_the_errors_per_unit_extrapolated():
    cases = [(-0.04, 1.386), (-0.02, 0.693), (0.01, 0.916)]
    rates = [e / d for e, d in cases]
    d = cal.drift_of(cases, (1e10, 1e12))
    assert d.rate == pytest.approx(np.mean(rates)) and d.sd == pytest.approx(np.std(rates, ddof=1))
    assert d.studies == 3 and d.budgets == (1e10, 1e12)
    from scipy.stats import t

    assert d.half_width(2.0) == pytest.approx(t.ppf(0.975, 2) * d.sd * 2.0) and d.half_width(0.0) == 0.0
    with pytest.raises(ValueError, match="at least 2 held-out studies"):
        cal.drift_of([(-0.01, 1.0), (0.02, 0.0)], (1e10, 1e12))  # a distance of 0 extrapolated nothing


def test_a_drift_moves_the_line_and_widens_its_seed_interval_in_quadrature():
    drift = cal.Drift(rate=-0.02, sd=0.01, studies=11, budgets=(1e10, 1e12))
    predicted, (lo, hi), seed = cal.drifted(3.0, (2.9, 3.1), drift, 1.5)
    assert seed == pytest.approx((2.9 * math.exp(-0.03), 3.1 * math.exp(-0.03)))
    assert predicted == pytest.approx(3.0 * math.exp(-0.03))
    m = drift.half_width(1.5)
    assert math.log(predicted / lo) == pytest.approx(math.hypot(math.log(3.0 / 2.9), m))
    assert math.log(hi / predicted) == pytest.approx(math.hypot(math.log(3.1 / 3.0), m))
    # no distance extrapolated, nothing moved or widened
    same, interval, _ = cal.drifted(3.0, (2.9, 3.1), drift, 0.0)
    assert same == pytest.approx(3.0) and interval == pytest.approx((2.9, 3.1))
    assert cal.drifted(3.0, None, drift, 1.5) == (pytest.approx(predicted), None, None)


def test_the_labs_drift_is_the_one_its_committed_studies_measure():
    """LAB_DRIFT is copied from bench/results/holdout_forms.json's summary.drift (written by
    `python -m bench.holdout_forms` over every committed study): a rerun that moves it must move
    the constant the report uses too."""
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "results" / "holdout_forms.json"
    if not path.is_file():
        pytest.skip("no bench/results here")
    measured = json.loads(path.read_text())["summary"]["drift"]
    lab = cal.LAB_DRIFT
    assert (lab.rate, lab.sd) == pytest.approx((measured["rate"], measured["sd"]), abs=5e-6)
    assert lab.studies == measured["studies"] and lab.budgets == pytest.approx(tuple(measured["budgets"]))
