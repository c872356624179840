"""Live latency (spec 8.4): the bounded, windowed estimate, and when a decision moves."""

from __future__ import annotations

import math

import pytest

from routeopt.router_training.policy.live import LiveLatency, LiveSettings, live_move, nearest_rank_p95


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


def test_the_live_factor_judges_each_call_against_its_own_prediction() -> None:
    live = LiveLatency(LiveSettings(min_observations=4, slow_factor=1.5))
    # "a" serves short and long requests as predicted: its seconds spread, its factor is 1
    for t, (took, predicted) in enumerate([(0.2, 0.25), (3.0, 3.0), (0.5, 0.5), (2.0, 2.5)]):
        live.observe("a", float(t), ttft_s=took, predicted_ttft_s=predicted)
    # "b" takes twice what was predicted of each call; "c" is never given a prediction
    for t, predicted in enumerate([0.1, 0.2, 0.3, 0.4]):
        live.observe("b", float(t), ttft_s=2 * predicted, predicted_ttft_s=predicted, latency_s=9.0)
        live.observe("c", float(t), ttft_s=9.0)
    assert live.p95("a", "ttft", 4.0) == 3.0 and live.factor("a", "ttft", 4.0) == 1.0
    assert live.factor("b", "ttft", 4.0) == 2.0 and live.factor("b", "latency", 4.0) is None
    assert live.p95("c", "ttft", 4.0) == 9.0 and live.factor("c", "ttft", 4.0) is None
    assert live.slow(["c", "b", "a", "d"], "ttft", 4.0) == {"b": 2.0}
    assert live.snapshot(4.0)["b"] == {
        "ttft": 0.8,
        "latency": 9.0,
        "ttft_factor": 2.0,
        "latency_factor": None,
    }
    live.observe("b", 4.5, ttft_s=0.0, predicted_ttft_s=1.0)  # a free call counts too
    assert live.factor("b", "ttft", 5.0) == 2.0


@pytest.mark.parametrize(
    "kw, match",
    [
        ({"ttft_s": -1.0}, "ttft_s must be a non-negative number"),
        ({"latency_s": math.nan}, "latency_s must be"),
        ({"ttft_s": True}, "ttft_s must be"),
        ({"ttft_s": "1"}, "ttft_s must be"),
        ({"ttft_s": 1.0, "predicted_ttft_s": 0.0}, "predicted_ttft_s must be a positive number"),
        ({"ttft_s": 1.0, "predicted_ttft_s": -1.0}, "predicted_ttft_s must be"),
        ({"ttft_s": 1.0, "predicted_latency_s": 1.0}, "predicted_latency_s was given without latency_s"),
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
    for bad in (0.5, math.inf, True):
        with pytest.raises(ValueError, match="slow_factor"):
            LiveSettings(slow_factor=bad)


def test_a_decision_moves_only_where_its_slowed_prediction_leaves_the_mask() -> None:
    names = ("cheap", "mid", "big", "slow")
    p = {"cheap": 0.6, "mid": 0.8, "big": 0.9, "slow": 0.95}
    pred = {"cheap": 0.5, "mid": 0.7, "big": 0.9, "slow": 2.0}
    fallbacks = ("cheap", "slow", "big")
    assert live_move("mid", fallbacks, names, p, pred, 1.0, {}) is None  # nothing slow
    assert live_move("mid", fallbacks, names, p, pred, 1.0, {"cheap": 3.0}) is None  # mid itself is fine
    assert live_move("mid", fallbacks, names, p, pred, 1.0, {"mid": 1.4}) is None  # 0.98: still within
    # cheap is less likely to pass, slow is predicted past the limit: big
    assert live_move("mid", fallbacks, names, p, pred, 1.0, {"mid": 2.0}) == (
        "big",
        ("mid", "cheap", "slow"),
        ["mid"],
    )
    # the limit is the tier's mask, not the budget: a mask of 2.0 takes slow, first in order
    assert live_move("mid", fallbacks, names, p, pred, 2.0, {"mid": 3.0}) == (
        "slow",
        ("mid", "cheap", "big"),
        ["mid"],
    )
    # big slowed too: nowhere to go
    assert live_move("mid", fallbacks, names, p, pred, 1.0, {"mid": 2.0, "big": 1.2}) is None
    # big slowed a little still fits; the candidates over are listed in candidate order
    move = live_move("mid", fallbacks, names, p, pred, 1.0, {"slow": 1.6, "mid": 2.0, "big": 1.1})
    assert move == ("big", ("mid", "cheap", "slow"), ["mid", "slow"])
