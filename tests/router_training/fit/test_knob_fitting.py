"""The quality knob: safe ends, mixes of single candidates, certification, the promise on new data."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.evaluation.bench import scoring_data
from routeopt.router_training.fit.data import routing_data
from routeopt.router_training.fit.knob_fitting import (
    DEFAULT_CONFIDENCE,
    Calibration,
    build_knob,
    certified_targets,
    hull_vertices,
    selection_half,
)
from routeopt.router_training.policy.routing import Knob, Member, OperatingPoint, member_choice
from routeopt.router_training.train import Design, train_router

CODE = "def parse the list return python function loop index".split()
MATH = "integer sum prime equation solve divide number total".split()


def flat_fleet(n: int, seed: int) -> pd.DataFrame:
    """Three candidates whose pass rates do not depend on the prompt at all: nothing to route on,
    so the honest knob is the zero router (mixes of single candidates)."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        prompt = " ".join(rng.choice(CODE + MATH, size=8))
        for name, rate, cost in (("cheap", 0.5, 1e-4), ("mid", 0.75, 1e-3), ("dear", 0.9, 1e-2)):
            rows.append(
                {
                    "request_id": f"q{seed}-{i}",
                    "suite": "all",
                    "prompt": prompt,
                    "model": name,
                    "score": float(rng.random() < rate),
                    "cost_usd": cost,
                }
            )
    return pd.DataFrame(rows)


def specialist_fleet(n: int, seed: int) -> pd.DataFrame:
    """One suite label for code and maths prompts; each cheap specialist is good at one kind,
    the dear generalist at both. Only the text says which kind a prompt is."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        kind = "code" if i % 2 else "math"
        prompt = " ".join(rng.choice(CODE if kind == "code" else MATH, size=10))
        skills = {
            "coder": 0.95 if kind == "code" else 0.15,
            "mathematician": 0.95 if kind == "math" else 0.15,
            "generalist": 0.9,
        }
        for name, rate in skills.items():
            rows.append(
                {
                    "request_id": f"{kind}-{seed}-{i}",
                    "suite": "all",
                    "prompt": prompt,
                    "model": name,
                    "score": float(rng.random() < rate),
                    "cost_usd": 1e-2 if name == "generalist" else 1e-3,
                }
            )
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def flat():
    policy = train_router(flat_fleet(1500, 0), holdout_fraction=0.0).policy
    return policy, scoring_data(flat_fleet(3000, 1), policy.candidates)


def _realised(policy, test, target):
    P, Cp = policy.predict(test.prompts, test.suites)
    pick, prop = policy.select(P, Cp, test.prompts, test.suites, target)
    rows = np.arange(len(test))
    return pick, prop, test.Y[rows, pick].mean(), test.C[rows, pick].mean()


def test_the_knob_reaches_the_cheapest_candidate_and_the_best_single(flat):
    policy, test = flat
    names = policy.candidates
    assert policy.reference_model == "dear"
    pick, prop, _, _ = _realised(policy, test, 0.0)
    assert {names[j] for j in pick} == {"cheap"} and np.all(prop == 1)
    pick, prop, _, _ = _realised(policy, test, 1.0)
    assert {names[j] for j in pick} == {"dear"} and np.all(prop == 1)


def test_beating_the_reference_needs_evidence_from_requests_the_hull_was_not_chosen_on():
    """Specialists beat the generalist (0.95 vs 0.9 at a tenth of the cost): the half-split
    evidence certifies target 1.0 at a fraction of the reference's cost. With nothing to route
    on, no point certifies 1.0 but the reference itself."""
    special = train_router(specialist_fleet(1500, 0), holdout_fraction=0.0).policy
    assert special.reference_model == "generalist" and special.knob.certified_up_to() > 1.0
    at_one = special.knob.point_for(1.0)
    assert at_one.certified >= 1.0 and at_one.cost < 0.5e-2  # the generalist costs 1e-2
    test = scoring_data(specialist_fleet(3000, 1), special.candidates)
    _, _, passed, cost = _realised(special, test, 1.0)
    ref = special.candidates.index("generalist")
    assert passed >= test.Y[:, ref].mean() and cost < 0.5 * test.C[:, ref].mean()

    flat_policy = train_router(flat_fleet(1500, 0), holdout_fraction=0.0).policy
    assert flat_policy.knob.certified_up_to() == 1.0
    full = train_router(flat_fleet(1500, 0), holdout_fraction=0.0, design=Design(above_one="full")).policy
    below_one = [p for p in flat_policy.knob.points if p.certified < 1.0]
    assert [p.certified for p in below_one] == [p.certified for p in full.knob.points if p.certified < 1.0]


def test_an_advantage_only_on_the_requests_the_hull_was_chosen_on_certifies_nothing_above_one():
    """Routing the requests the cheap candidate is tipped for beats the reference on all
    calibration requests, but only thanks to the half the hull is chosen on: on the other half
    it loses. That is what a member looks like when it was chosen for its luck."""
    n = 4000
    half = selection_half(n)
    tipped = np.arange(n) % 2 == 0
    y_ref = np.ones(n)
    y_alt = np.zeros(n)
    y_alt[tipped & half] = 1.0
    y_ref[tipped & half] = 0.0  # the cheap one passes where the reference fails: on this half only
    y_alt[tipped & ~half] = np.arange(n)[tipped & ~half] % 10 != 0  # 10% worse on the other half
    Y = np.column_stack([y_ref, y_alt])
    C = np.tile([1e-2, 1e-3], (n, 1))
    P = np.column_stack([np.full(n, 0.5), np.where(tipped, 0.9, 0.1)])
    cal = Calibration(P, C.copy(), Y, C)
    assert Y[:, 0].mean() > Y[:, 1].mean()  # the reference is the best single candidate
    full = build_knob(cal, 0, DEFAULT_CONFIDENCE, above_one="full")
    split = build_knob(cal, 0, DEFAULT_CONFIDENCE)
    assert full.certified_up_to() > 1.05 and full.point_for(1.0).cost < 1e-2
    assert split.certified_up_to() == 1.0
    at_one = split.point_for(1.0)
    assert (at_one.a, at_one.b, at_one.cost) == (0, 0, pytest.approx(1e-2))
    assert split.point_for(0.95).cost < 1e-2  # below 1 the hull of all requests still serves


def test_with_a_split_every_target_rests_on_requests_the_hull_was_not_chosen_on():
    """A cheap candidate that keeps the reference's passes on the selection half only: the hull
    of all requests certifies it for 0.85 (its average over both halves); chosen on one half
    and tested on the other, no point keeps more than what the other half shows."""
    n = 4000
    half = selection_half(n)
    rng = np.random.default_rng(4)
    y_ref = (rng.random(n) < 0.8).astype(float)
    y_alt = np.where(~half & (rng.random(n) < 0.3), 0.0, y_ref)  # loses 30% of passes off the half
    Y = np.column_stack([y_ref, y_alt])
    C = np.tile([1e-2, 1e-3], (n, 1))
    cal = Calibration(np.full((n, 2), 0.5), C.copy(), Y, C)
    full = build_knob(cal, 0, DEFAULT_CONFIDENCE)
    split = build_knob(cal, 0, DEFAULT_CONFIDENCE, split=0.5)
    off_half = y_alt[~half].mean() / y_ref[~half].mean()
    assert full.point_for(0.8).cost < 5e-3  # the cheap candidate, certified on its luck
    assert all(p.certified <= off_half + 1e-9 for p in split.points if p.cost < 9e-3)
    assert split.point_for(0.8).cost > full.point_for(0.8).cost


def test_between_the_ends_it_mixes_single_candidates_and_keeps_the_floor(flat):
    """With no signal in the prompt, a target between two candidates is met by mixing them per
    request (a hash picks), at about the cost of that mix and never below the floor."""
    policy, test = flat
    ref = test.Y[:, policy.candidates.index("dear")].mean()
    for target in (0.7, 0.8, 0.9, 0.95):
        pick, prop, q, c = _realised(policy, test, target)
        assert q >= target * ref - 0.02, (target, q, target * ref)
        assert len(set(pick.tolist())) <= 2
    pick, prop, q, c = _realised(policy, test, 0.9)
    assert 0 < prop.min() < 1 and len(set(pick.tolist())) == 2  # a mix, with its propensities
    point = policy.point_for(0.9)
    P, Cp = policy.predict(test.prompts, test.suites)
    a, b = (member_choice(policy.knob.members[m], P, Cp) for m in (point.a, point.b))
    split = a != b
    assert split.mean() > 0.5 and np.mean(pick[split] == a[split]) == pytest.approx(point.weight, abs=0.03)
    assert np.allclose(prop, point.weight * (pick == a) + (1 - point.weight) * (pick == b))
    again = policy.decide_batch(test.prompts[:50], test.suites[:50], 0.9)
    assert [d.model for d in again] == [policy.candidates[j] for j in pick[:50]]
    assert [d.propensity for d in again] == pytest.approx(prop[:50].tolist())


def test_the_knob_learns_text_specific_strengths_under_one_suite_label():
    """Code prompts go to the coder and maths prompts to the mathematician (the old model could
    only tell candidates apart by suite label, and there is one)."""
    policy = train_router(specialist_fleet(800, 0), holdout_fraction=0.0).policy
    test = scoring_data(specialist_fleet(400, 1), policy.candidates)
    pick, _, q, c = _realised(policy, test, 0.95)
    kinds = np.array([r.split("-")[0] for r in test.request_ids])
    names = np.array(policy.candidates)[pick]
    assert np.mean(names[kinds == "code"] == "coder") > 0.9
    assert np.mean(names[kinds == "math"] == "mathematician") > 0.9
    assert q > 0.9 and c < 2e-3


def test_certified_targets_follow_the_paired_lower_bound():
    rng = np.random.default_rng(0)
    ref = (rng.random(4000) < 0.8).astype(float)
    same = certified_targets(ref[None], ref, 0.9)[0]
    assert same == pytest.approx(1.0, abs=1e-3)  # the reference itself: any x <= 1
    worse = np.where(rng.random(4000) < 0.1, 0.0, ref)  # loses 10% of its passes
    x = certified_targets(worse[None], ref, 0.9)[0]
    assert 0.85 < x < worse.mean() / ref.mean()  # below the point estimate by the margin
    assert certified_targets(worse[None], ref, 0.99)[0] < x


def test_the_staircase_rises_in_cost_and_certified_target_and_the_manifest_says_so(flat):
    policy, _ = flat
    pts = policy.knob.points
    assert all(b.cost > a.cost and b.certified > a.certified for a, b in zip(pts, pts[1:]))
    assert policy.knob.confidence == DEFAULT_CONFIDENCE and policy.knob.certified_up_to() >= 1.0
    summary = policy.metrics["knob"]
    assert summary["confidence"] == DEFAULT_CONFIDENCE and "Learn-then-Test" in summary["method"]


def test_held_out_report_says_how_often_the_promise_held():
    result = train_router(flat_fleet(1200, 2), holdout_fraction=0.3)
    promise = result.metrics["holdout"]["promise"]
    assert promise["promised"] >= 10 and 0 <= promise["held"] <= promise["promised"]
    rows = {r["target"]: r for r in promise["targets"]}
    assert rows[1.0]["held"] and rows[1.0]["certified"] and not rows[1.1]["certified"]
    assert rows[0.9]["floor"] == pytest.approx(0.9 * promise["reference_pass_rate"])
    assert promise["contradicted"] == 0 and not rows[1.0]["contradicted"]


def test_a_promise_the_held_out_requests_refute_is_reported_as_broken():
    """Relabel the cheapest point as certified for every target: on held-out requests it is far
    below 0.9 x the reference, beyond the noise of that many requests."""
    from dataclasses import replace

    from routeopt.router_training.train import promise_report

    frame = flat_fleet(1200, 2)
    result = train_router(frame, holdout_fraction=0.3)
    policy = result.policy
    cheapest = policy.knob.points[0]
    lying = replace(
        policy,
        knob=Knob(
            policy.knob.members, [replace(cheapest, certified=2.0)], policy.knob.top, policy.knob.confidence
        ),
    )
    test = routing_data(frame).subset(
        np.flatnonzero(np.isin(routing_data(frame).request_ids, result.split["test"]))
    )
    honest, lied = promise_report(policy, test, (0.9,)), promise_report(lying, test, (0.9,))
    assert honest["contradicted"] == 0
    row = lied["targets"][0]
    assert row["certified"] and not row["held"] and row["contradicted"]
    assert row["margin"] + 3 * row["margin_se"] < 0


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 5), st.integers(0, 10**6))
def test_hull_vertices_are_the_upper_concave_hull(k, seed):
    rng = np.random.default_rng(seed)
    cost, quality = rng.random(k * 3), rng.random(k * 3)
    v = hull_vertices(cost, quality)
    assert np.all(np.diff(cost[v]) > 0) and np.all(np.diff(quality[v]) > 0)
    slopes = np.diff(quality[v]) / np.diff(cost[v])
    assert np.all(np.diff(slopes) <= 1e-9)
    for c, q in zip(cost, quality):  # every point lies on or under the hull
        if c >= cost[v[0]]:
            assert q <= np.interp(c, cost[v], quality[v]) + 1e-9


def test_build_knob_on_calibration_data_serves_every_target():
    rng = np.random.default_rng(3)
    n, k = 600, 3
    P = np.clip(rng.random((n, k)) * [0.6, 0.8, 1.0], 0.01, 0.99)
    Y = (rng.random((n, k)) < P).astype(float)
    C = np.tile([1.0, 3.0, 10.0], (n, 1))
    knob = build_knob(Calibration(P, C, Y, C), ref=2, confidence=0.9)
    assert knob.point_for(0.0).cost == min(p.cost for p in knob.points)
    for x in np.linspace(0, 1, 21):
        p = knob.point_for(x)
        assert p.certified >= x - 1e-9
    assert knob.point_for(5.0) == knob.top
    assert Knob.from_dict(knob.to_dict()).to_dict() == knob.to_dict()


def test_knob_rejects_points_that_do_not_rise():
    members = [("single", 0.0)]
    from routeopt.router_training.policy.routing import Member

    with pytest.raises(ValueError, match="rising"):
        Knob(
            [Member(*members[0])],
            [OperatingPoint(0, 0, 1.0, 0.9, 0.5, 1.0), OperatingPoint(0, 0, 1.0, 0.8, 0.6, 2.0)],
            OperatingPoint(0, 0, 1.0, -math.inf, 0.6, 2.0),
            0.9,
        )


def test_routing_data_of_a_test_file_scores_fractions(flat):
    policy, _ = flat
    frame = flat_fleet(10, 5).assign(passed=False)
    data = scoring_data(frame, policy.candidates)  # score wins over a stored 'passed' column
    assert np.allclose(np.nansum(data.Y), frame["score"].sum())
    assert len(routing_data(frame)) == 10


@settings(max_examples=200)
@given(
    n=st.integers(1, 40),
    k=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    masked=st.booleans(),
    coarse=st.booleans(),
)
def test_lambdas_scored_together_choose_as_each_lambda_alone(n, k, seed, masked, coarse):
    """`lambda_choices` (every lambda of the grid at once, a candidate's column at a time) picks,
    for each lambda, the candidate with the highest p - lambda c, ties to the cheaper, then the
    first, among the allowed ones: the member's definition, written out here per lambda."""
    from routeopt.router_training.fit.knob_fitting import lambda_grid
    from routeopt.router_training.policy.knob import lambda_choices

    rng = np.random.default_rng(seed)
    p, c = rng.random((n, k)), rng.random((n, k)) * 1e-3
    if coarse:  # ties in pass probability and in cost
        p, c = np.round(p * 2) / 2, np.round(c * 2e3) / 2e3
    allowed = rng.random((n, k)) < 0.6 if masked else None
    if allowed is not None:
        allowed[np.arange(n), rng.integers(0, k, n)] = True
    lams = lambda_grid(c)
    got = lambda_choices(lams, p, c, allowed)
    for i, lam in enumerate(lams):
        score = np.where(allowed if allowed is not None else True, p - lam * c, -np.inf)
        for row in range(n):
            top = score[row] >= score[row].max()
            want = int(np.argmin(np.where(top, c[row], np.inf)))
            assert got[i, row] == want, (lam, row)
    assert np.array_equal(member_choice(Member("lambda", float(lams[3])), p, c, allowed), got[3])
