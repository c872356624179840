"""Live latency (spec 8.4): the bounded, windowed estimate, and when a decision moves."""

from __future__ import annotations

import math

import pytest

from routeopt.router_training.policy.live import LiveLatency, LiveSettings, live_shift, nearest_rank_p95


def test_nearest_rank_p95() -> None:
    assert nearest_rank_p95([5.0]) == 5.0
    assert nearest_rank_p95(list(range(1, 21))) == 19  # ceil(0.95 * 20) = 19th smallest
    assert nearest_rank_p95(list(range(1, 101))) == 95
    assert nearest_rank_p95(list(range(100, 0, -1))) == 95  # order of arrival does not matter
    assert nearest_rank_p95(list(range(1, 22))) == 20  # ceil(19.95) = 20


def test_the_estimate_needs_enough_recent_observations_and_forgets_old_ones() -> None:
    live = LiveLatency(LiveSettings(window_s=10, max_observations=50, min_observations=5))
    for t in range(4):
        live.observe("a", float(t), ttft_s=1.0)
    assert live.p95("a", "ttft", 4.0) is None  # four: too few
    live.observe("a", 4.0, ttft_s=9.0, latency_s=12.0)
    assert live.p95("a", "ttft", 4.0) == 9.0
    assert live.p95("a", "latency", 4.0) is None  # one latency observation
    assert live.p95("a", "ttft", 13.5) is None  # t <= now - window is gone: only t = 4 is left
    assert live.p95("b", "ttft", 4.0) is None


def test_at_most_max_observations_are_kept() -> None:
    live = LiveLatency(LiveSettings(window_s=1000, max_observations=20, min_observations=20))
    for t in range(20):
        live.observe("a", float(t), ttft_s=10.0)
    for t in range(20, 40):
        live.observe("a", float(t), ttft_s=1.0)
    assert live.p95("a", "ttft", 40.0) == 1.0  # the slow ones were pushed out


def test_over_lists_the_models_over_the_budget_in_the_order_given() -> None:
    live = LiveLatency(LiveSettings(min_observations=1))
    live.observe("b", 0.0, ttft_s=2.0)
    live.observe("a", 0.0, ttft_s=0.5)
    live.observe("c", 0.0, ttft_s=3.0)
    assert live.over(["a", "b", "c", "d"], "ttft", 1.0, 1.0) == ["b", "c"]
    assert live.snapshot(1.0)["a"] == {"ttft": 0.5, "latency": None}


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"ttft_s": -1.0}, "ttft_s must be a non-negative number"),
        ({"latency_s": math.nan}, "latency_s must be"),
        ({"ttft_s": True}, "ttft_s must be"),
        ({"ttft_s": "1"}, "ttft_s must be"),
    ],
)
def test_bad_observations_are_clear_errors(kw, match) -> None:
    with pytest.raises(ValueError, match=match):
        LiveLatency().observe("a", 0.0, **kw)
    with pytest.raises(ValueError, match="needs ttft_s or latency_s"):
        LiveLatency().observe("a", 0.0)
    with pytest.raises(ValueError, match="observation time"):
        LiveLatency().observe("a", math.inf, ttft_s=1.0)
    with pytest.raises(ValueError, match="window_s"):
        LiveSettings(window_s=0)
    with pytest.raises(ValueError, match="min_observations"):
        LiveSettings(max_observations=5, min_observations=6)


def test_a_decision_moves_only_to_a_fallback_within_the_budget_and_as_likely_to_pass() -> None:
    p = {"cheap": 0.6, "mid": 0.8, "big": 0.9, "slow": 0.95}
    pred = {"cheap": 0.5, "mid": 0.7, "big": 0.9, "slow": 2.0}
    fallbacks = ("cheap", "slow", "big")
    assert live_shift("mid", fallbacks, p, pred, 1.0, []) is None  # nothing over
    assert live_shift("mid", fallbacks, p, pred, 1.0, ["cheap"]) is None  # mid itself is fine
    # cheap is less likely to pass, slow is predicted over the budget: big
    assert live_shift("mid", fallbacks, p, pred, 1.0, ["mid"]) == ("big", ("mid", "cheap", "slow"))
    assert live_shift("mid", fallbacks, p, pred, 1.0, ["mid", "big"]) is None  # nowhere to go
