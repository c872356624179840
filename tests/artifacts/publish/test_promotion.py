"""The nightly's promotion gate (`routeopt.artifacts.publish.promotion`): real policies scored on recorded outcomes."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from routeopt.artifacts.publish.promotion import decide_promotion, heldout, score_on
from routeopt.router_training.fit.data import routing_data
from tests.artifacts.policies import make_policy, synthetic_frame


@pytest.fixture(scope="module")
def policies():
    """The same trained policy at a high and at a zero quality target: the first routes more
    requests to dear, better candidates, the second to the cheapest."""
    base = make_policy(0)
    return dataclasses.replace(base, quality_target=1.0), dataclasses.replace(base, quality_target=0.0)


@pytest.fixture(scope="module")
def test_data():
    frame = synthetic_frame(seed=1, n_items=90)
    return heldout(frame, sorted(set(frame.request_id))[:60])


def test_score_on_reads_the_recorded_outcome_of_each_choice(policies, test_data):
    hi, _ = policies
    got = score_on(hi, test_data)
    chosen = [
        test_data.candidates.index(d.model) for d in hi.decide_batch(test_data.prompts, test_data.suites)
    ]
    rows = np.arange(len(test_data))
    assert got["n"] == len(test_data) == 60
    assert got["pass_rate"] == pytest.approx(test_data.Y[rows, chosen].mean())
    assert got["cost"] == pytest.approx(test_data.C[rows, chosen].mean())


def test_a_choice_without_an_outcome_fails_at_the_highest_cost(policies, test_data):
    """A policy is never credited for what was not measured."""
    hi, _ = policies
    picks = [d.model for d in hi.decide_batch(test_data.prompts, test_data.suites)]
    assert "large" in picks
    without = test_data.align(["small", "medium"])
    got = score_on(hi, without)
    col = {"small": 0, "medium": 1}
    passed = [0.0 if m == "large" else without.Y[i, col[m]] for i, m in enumerate(picks)]
    cost = [without.C[i].max() if m == "large" else without.C[i, col[m]] for i, m in enumerate(picks)]
    assert got["pass_rate"] == pytest.approx(np.mean(passed))
    assert got["pass_rate"] < score_on(hi, test_data)["pass_rate"]
    assert got["cost"] == pytest.approx(np.mean(cost))


def test_a_policy_that_passes_less_is_kept_out_unless_within_tolerance(policies, test_data):
    hi, lo = policies
    new, old = score_on(lo, test_data), score_on(hi, test_data)
    assert new["pass_rate"] < old["pass_rate"] and new["cost"] < old["cost"]
    refused = decide_promotion(lo, hi, test_data, tolerance=0.0)
    assert not refused.promoted
    assert refused.reason == (f"pass rate {new['pass_rate']:.3f} < champion {old['pass_rate']:.3f} - 0")
    assert (refused.new, refused.champion) == (new, old)
    gap = old["pass_rate"] - new["pass_rate"]
    allowed = decide_promotion(lo, hi, test_data, tolerance=gap + 0.01)
    assert allowed.promoted and allowed.reason.startswith("not worse than the champion")


def test_a_dearer_policy_is_kept_out_even_when_it_passes_more(policies, test_data):
    hi, lo = policies
    decision = decide_promotion(hi, lo, test_data, tolerance=0.0)
    assert not decision.promoted and decision.reason.startswith("cost ")
    assert "> champion" in decision.reason and decision.new["pass_rate"] > decision.champion["pass_rate"]


def test_first_policy_drift_and_empty_data(policies, test_data):
    hi, lo = policies
    first = decide_promotion(lo, None, test_data, tolerance=0.0)
    assert first.promoted and first.reason == "no champion yet" and first.new["n"] == 60
    blocked = decide_promotion(hi, lo, test_data, tolerance=1.0, blocking=["large/sort: pass_rate regressed"])
    assert not blocked.promoted
    assert blocked.reason == "drift blocks promotion: large/sort: pass_rate regressed"
    empty = test_data.subset(np.array([], dtype=int))
    nothing = decide_promotion(hi, lo, empty, tolerance=1.0)
    assert not nothing.promoted and nothing.reason == "no held-out items to compare on"


def test_heldout_keeps_only_the_requested_items():
    frame = synthetic_frame(seed=2, n_items=30)
    ids = sorted(set(frame.request_id))[::3]
    data = heldout(frame, ids)
    assert sorted(data.request_ids) == ids
    assert data.candidates == routing_data(frame).candidates
