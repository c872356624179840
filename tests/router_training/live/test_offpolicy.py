"""Off-policy estimators: exact on-policy, unbiased under the logging distribution, bounded."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.live import offpolicy as ope

rewards01 = st.lists(st.floats(0, 1), min_size=2, max_size=40)


@given(rewards01)
def test_on_policy_every_estimator_is_the_mean(r: list[float]) -> None:
    r = np.array(r)
    w = np.ones_like(r)
    for est in ope.all_estimates(r, w, np.zeros_like(r), np.zeros_like(r)).values():
        assert est.value == pytest.approx(r.mean())
        assert est.ess == pytest.approx(len(r))
        assert est.low <= est.value <= est.high


@given(st.data())
def test_snips_stays_within_the_rewards(data) -> None:
    n = data.draw(st.integers(2, 30))
    r = np.array(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)))
    w = np.array(data.draw(st.lists(st.floats(0, 50), min_size=n, max_size=n)))
    est = ope.snips(r, w)
    if w.sum() > 0:
        assert r.min() - 1e-9 <= est.value <= r.max() + 1e-9
        assert 1 - 1e-9 <= est.ess <= n + 1e-9
    else:
        assert math.isnan(est.value)


@given(
    st.lists(st.floats(0, 1), min_size=3, max_size=3),
    st.lists(st.floats(0, 1), min_size=3, max_size=3),
    st.floats(0.05, 1.0),
    st.integers(0, 2),
)
@settings(max_examples=60)
def test_ips_and_dr_are_unbiased_over_the_logging_distribution(y, g, rate, target) -> None:
    """Enumerate every action the logging policy could take (epsilon-greedy over 3 models, greedy
    on model 0): the probability-weighted mean of IPS and DR equals the target's true reward,
    whatever the reward model g."""
    mu = np.full(3, rate / 3)
    mu[0] += 1 - rate
    y, g = np.array(y), np.array(g)
    ips_mean = sum(mu[a] * ope.ips_terms([y[a]], [(a == target) / mu[a]])[0] for a in range(3))
    dr_mean = sum(
        mu[a] * ope.dr_terms([y[a]], [(a == target) / mu[a]], [g[a]], [g[target]])[0] for a in range(3)
    )
    assert ips_mean == pytest.approx(y[target])
    assert dr_mean == pytest.approx(y[target])


def test_dr_with_a_perfect_reward_model_has_no_variance() -> None:
    rng = np.random.default_rng(0)
    y = rng.random((50, 4))
    logged = rng.integers(0, 4, 50)
    target = rng.integers(0, 4, 50)
    rows = np.arange(50)
    w = (logged == target) / 0.3
    est = ope.doubly_robust(y[rows, logged], w, y[rows, logged], y[rows, target])
    assert est.value == pytest.approx(y[rows, target].mean())
    assert est.se == pytest.approx(y[rows, target].std(ddof=1) / math.sqrt(50))


def test_intervals_cover_the_truth_at_about_the_nominal_rate() -> None:
    """Simulated epsilon-greedy logs of a 3-model problem: the DR interval covers the target's
    true value in about 95% of 400 repetitions, although its reward model is biased; the same
    estimator without the inverse propensities does not."""
    rng = np.random.default_rng(1)
    n, rate = 400, 0.3
    p_true = rng.random((n, 3))
    target = rng.integers(0, 3, n)
    truth = p_true[np.arange(n), target].mean()
    covered = naive_covered = 0
    for _ in range(400):
        explore = rng.random(n) < rate
        a = np.where(explore, rng.integers(0, 3, n), 0)
        mu = np.where(a == 0, 1 - rate + rate / 3, rate / 3)
        r = (rng.random(n) < p_true[np.arange(n), a]).astype(float)
        g = np.clip(0.5 * p_true + 0.35 + rng.normal(0, 0.1, p_true.shape), 0, 1)
        w = (a == target) / mu
        est = ope.doubly_robust(r, w, g[np.arange(n), a], g[np.arange(n), target])
        covered += est.covers(truth)
        naive = ope.doubly_robust(r, (a == target).astype(float), g[np.arange(n), a], g[np.arange(n), target])
        naive_covered += naive.covers(truth)
    assert 0.9 <= covered / 400 <= 0.99
    assert naive_covered / 400 < 0.8


def test_effective_sample_size_and_guards() -> None:
    assert ope.effective_sample_size([1, 1, 1, 1]) == pytest.approx(4)
    assert ope.effective_sample_size([0, 0, 5, 0]) == pytest.approx(1)
    assert ope.effective_sample_size([]) == 0.0
    assert ope.effective_sample_size([0.0, 2.2e-308]) == pytest.approx(1)  # no underflow
    assert ope.ips([], []).n == 0 and math.isnan(ope.ips([], []).value)
    with pytest.raises(ValueError, match=r"propensities must lie in \(0, 1\]"):
        ope.importance_weights([1.0, 0.0], [0.5, 0.0])
    with pytest.raises(ValueError, match="differ in length"):
        ope.ips([1.0, 0.0], [1.0])


def test_paired_difference_is_narrower_than_separate_intervals() -> None:
    rng = np.random.default_rng(2)
    base = rng.random(300)
    a, b = base + rng.normal(0, 0.01, 300), base + 0.05 + rng.normal(0, 0.01, 300)
    diff = ope.paired_difference(b, a)
    assert diff.value == pytest.approx(0.05, abs=0.01)
    sep = math.hypot(ope.mean_estimate(a).se, ope.mean_estimate(b).se)
    assert diff.se < sep / 5 and diff.low > 0


@pytest.mark.parametrize("bounds", [(0.0, 1.0), None])
def test_bounds_clip_the_interval_only(bounds) -> None:
    est = ope.mean_estimate([0.0, 0.0, 1.0], bounds=bounds)
    assert est.value == pytest.approx(1 / 3)
    if bounds:
        assert est.low == 0.0 and est.high <= 1.0
    else:
        assert est.low < 0


def test_all_combinations_small_exact() -> None:
    """IPS averaged over every joint draw of two logged requests equals the truth exactly."""
    mu = np.array([0.8, 0.1, 0.1])
    y = np.array([[1.0, 0.0, 1.0], [0.0, 1.0, 1.0]])
    target = [2, 1]
    expect = (y[0, 2] + y[1, 1]) / 2
    total = 0.0
    for a0, a1 in itertools.product(range(3), repeat=2):
        prob = mu[a0] * mu[a1]
        w = [(a0 == target[0]) / mu[a0], (a1 == target[1]) / mu[a1]]
        total += prob * ope.ips([y[0, a0], y[1, a1]], w).value
    assert total == pytest.approx(expect)


def test_a_reward_model_floor_keeps_lucky_intervals_honest() -> None:
    """Few explored requests can make the sample variance 0; the model's predicted variance
    then sets the standard error (and a larger sample variance still wins)."""
    g = np.full(100, 0.5)
    flat = ope.doubly_robust(
        np.full(100, 0.5), np.zeros(100), g, g, model_variance=ope.dr_model_variance(g, np.full(100, 0.04))
    )
    assert flat.se == pytest.approx(math.sqrt(0.25 / 0.04 / 100))
    assert ope.doubly_robust(np.full(100, 0.5), np.zeros(100), g, g).se == 0.0
    noisy = np.r_[np.zeros(50), np.ones(50)] * 40
    wide = ope.doubly_robust(noisy, np.ones(100), np.zeros(100), np.zeros(100), model_variance=np.zeros(100))
    assert wide.se == pytest.approx(noisy.std(ddof=1) / 10)
    assert ope.dr_model_variance([0.5, 0.5], [0.0, 0.5]).tolist() == [0.25, 0.5]
    diff = ope.paired_difference(
        np.ones(100), np.ones(100), model_variance=np.full(100, 4.0), baseline_diff=np.zeros(100)
    )
    assert diff.value == 0 and diff.se == pytest.approx(0.2)
