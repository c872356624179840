"""Shifted test sets, density-ratio weights toward a traffic sample, and the shift monitor."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.fit.covariate import Sketch, density_ratio, effective_sample_size
from routeopt.router_training.fit.data import RoutingData
from routeopt.router_training.live.shift_monitor import (
    Logged,
    chi2_homogeneity,
    detect_shift,
    holm,
    reference_sketch,
    total_variation,
)
from routeopt.router_training.evaluation.shifts import keep_probability, shifted, suite_order_score

SUITES = ["a", "b", "c"]


def _sketch(n: int, seed: int, hard_share: float = 0.5, suite_p=(1 / 3, 1 / 3, 1 / 3)) -> Sketch:
    """Requests whose text features say 'hard' (two noisy coordinates); longer when hard."""
    rng = np.random.default_rng(seed)
    hard = rng.random(n) < hard_share
    suites = list(rng.choice(SUITES, size=n, p=list(suite_p)))
    chars = np.where(hard, rng.normal(400, 60, n), rng.normal(200, 40, n)).clip(10)
    X = np.column_stack([hard + rng.normal(0, 0.5, n), rng.normal(0, 1, n)])
    return Sketch(suites, chars, X)


def _logged(
    n: int, seed: int, hard_share: float = 0.5, suite_p=(1 / 3, 1 / 3, 1 / 3), target: float = 0.95
) -> Logged:
    """Logged decisions: hard requests are routed to the strong model more often."""
    sk = _sketch(n, seed, hard_share, suite_p)
    rng = np.random.default_rng(seed + 1)
    hard = sk.X[:, 0] > 0.5
    routed = np.where(rng.random(n) < np.where(hard, 0.8, 0.2), "strong", "weak").tolist()
    return Logged(sk.suites, sk.chars, [target] * n, routed)


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-5, 5), min_size=1, max_size=60), st.floats(0.1, 1.0), st.floats(0.0, 3.0))
def test_keep_probability_has_the_asked_mean_and_rises_with_the_score(score, fraction, beta):
    p = keep_probability(np.array(score), fraction, beta)
    assert np.all((p >= 0) & (p <= 1))
    assert p.mean() == pytest.approx(fraction, abs=1e-6)
    order = np.argsort(score, kind="stable")
    assert np.all(np.diff(p[order]) >= -1e-12)


def test_shifts_keep_harder_longer_or_remixed_requests():
    rng = np.random.default_rng(0)
    n = 3000
    suites = list(rng.choice(SUITES, size=n))
    prompts = ["w " * int(k) for k in rng.integers(5, 200, n)]
    test = RoutingData([str(i) for i in range(n)], prompts, suites, ["m"], np.zeros((n, 1)), np.zeros((n, 1)))
    hardness = rng.random(n)
    hard = shifted("hard", test, hardness)
    assert 0.45 < len(hard.keep) / n < 0.55 and hardness[hard.keep].mean() > hardness.mean() + 0.1
    long = shifted("long", test)
    assert np.mean([len(prompts[i]) for i in long.keep]) > 1.2 * np.mean([len(p) for p in prompts])
    mix = shifted("suites", test)
    order = suite_order_score(suites)
    top = np.array(suites, dtype=object)[order == order.max()][0]
    assert np.mean(np.array(suites)[mix.keep] == top) > 0.5  # the top-ranked suite now dominates
    one = RoutingData(test.request_ids, prompts, ["s"] * n, ["m"], test.Y, test.C)
    assert shifted("suites", one) is None
    assert shifted("hard", test, hardness).keep.tolist() == hard.keep.tolist()  # seeded


def test_density_ratio_recovers_a_tilt_and_is_one_without_shift():
    cal = _sketch(4000, 1)
    same = density_ratio(cal, _sketch(2000, 2), SUITES)
    assert same.ess > 0.9 * len(cal) and same.auc < 0.56
    toward = density_ratio(cal, _sketch(2000, 3, hard_share=0.8), SUITES)
    hard = cal.chars > 300  # 400 +- 60 characters when hard, 200 +- 40 otherwise
    # true ratio: 0.8 / 0.5 on hard requests, 0.2 / 0.5 on easy ones
    assert np.mean(toward.w[hard]) == pytest.approx(1.6, rel=0.15)
    assert np.mean(toward.w[~hard]) == pytest.approx(0.4, rel=0.25)
    assert toward.ess < 0.85 * len(cal) and toward.auc > 0.6
    assert effective_sample_size(np.ones(10)) == 10 and effective_sample_size(np.r_[1.0, np.zeros(9)]) == 1
    capped = density_ratio(cal, _sketch(500, 4, hard_share=0.999), SUITES, max_weight=1.5)
    assert capped.w.max() <= 1.5 + 1e-6 and capped.w.mean() == pytest.approx(1.0) and capped.clipped > 0


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(0, 1), min_size=1, max_size=30))
def test_holm_adjusts_upward_and_keeps_the_order(p):
    adj = holm(p)
    assert np.all(adj >= np.array(p) - 1e-12) and np.all(adj <= 1)
    order = np.argsort(p, kind="stable")
    assert np.all(np.diff(adj[order]) >= -1e-12)


def test_chi2_and_total_variation_on_counts():
    assert chi2_homogeneity([100, 100], [100, 100]) == pytest.approx(1.0)
    assert chi2_homogeneity([500, 500], [300, 700]) < 1e-10
    assert chi2_homogeneity([5, 0], [7, 0]) == 1.0  # one bin left
    assert total_variation([1, 1], [1, 1]) == 0 and total_variation([1, 0], [0, 1]) == 1


def test_the_monitor_flags_a_shift_names_what_moved_and_stays_quiet_otherwise():
    cal = _logged(3000, 5)
    ref = reference_sketch(cal.suites, cal.chars, {0.95: cal.routed, 0.8: cal.routed})
    quiet = [detect_shift(ref, _logged(2000, 100 + s)).shifted for s in range(20)]
    assert sum(quiet) <= 1
    harder = detect_shift(ref, _logged(2000, 6, hard_share=0.8))
    assert harder.shifted and harder.p_value < 0.01
    moved = {f.feature for f in harder.moved()}
    assert moved == {"route@0.95", "log_chars"}
    remix = detect_shift(ref, _logged(2000, 7, suite_p=(0.6, 0.2, 0.2)))
    assert [f.feature for f in remix.moved()] == ["suite"]
    assert remix.suites_moved[0]["suite"] == "a" and remix.suites_moved[0]["live"] > 0.5
    assert "suite (TV" in remix.summary_line() and "; suites a 3" in remix.summary_line()
    elsewhere = detect_shift(ref, _logged(2000, 8, target=0.5))  # no reference routing at 0.5
    assert [f.feature for f in elsewhere.features] == ["suite", "log_chars"]
    few = _logged(30, 9, hard_share=1.0)
    assert "route@0.95" not in {f.feature for f in detect_shift(ref, few).features}  # fewer than 50
    assert not detect_shift(ref, Logged([], np.empty(0))).features


def test_repeats_of_a_few_prompts_are_not_a_shift_and_a_real_one_still_is():
    """A log that sends 250 prompts of the certified distribution 2,000 times (with their
    hashes) is quiet; without the hashes the repeats look like 2,000 draws and any finite
    sample of prompts alarms. A real shift in the same repeated form is still flagged."""
    cal = _logged(3000, 5)
    ref = reference_sketch(cal.suites, cal.chars, {0.95: cal.routed})
    rng = np.random.default_rng(0)

    def repeated(pool: Logged, with_keys: bool) -> Logged:
        idx = rng.integers(0, len(pool), 2000)
        return Logged(
            [pool.suites[i] for i in idx],
            pool.chars[idx],
            [0.95] * 2000,
            [pool.routed[i] for i in idx],
            [f"h{i}" for i in idx] if with_keys else None,
        )

    alarms = {True: 0, False: 0}
    for s in range(20):
        pool = _logged(250, 200 + s)
        for keys in (True, False):
            alarms[keys] += detect_shift(ref, repeated(pool, keys)).shifted
    assert alarms[True] <= 1 and alarms[False] >= 5
    harder = repeated(_logged(250, 300, hard_share=0.9), True)
    assert harder.distinct() <= 250 and detect_shift(ref, harder).shifted
