import json

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from routeopt.router_training.policy.knob import (
    Knob,
    Member,
    OperatingPoint,
    fallback_order,
    point_choice,
    row_decision,
)
from routeopt.router_training.policy.routing import PolicyDecision, RoutingPolicy, choose

PROMPTS = [
    f"Task: {s} the input. difficulty: {d}. Input: stone river"
    for s in ("reverse", "sort", "add")
    for d in range(1, 6)
]


def test_decision_contract(trained):
    policy = trained.policy
    d = policy.decide(PROMPTS[0], suite="reverse")
    assert isinstance(d, PolicyDecision) and d.model in policy.candidates
    assert sorted((d.model, *d.fallbacks)) == sorted(policy.candidates)
    assert set(d.pass_probabilities) == set(policy.candidates) == set(d.expected_cost_usd)
    assert all(0 <= p <= 1 for p in d.pass_probabilities.values())
    assert all(c >= 0 for c in d.expected_cost_usd.values())
    with pytest.raises(Exception):
        d.model = "other"  # frozen


def test_save_load_round_trip_without_pickle(trained, tmp_path):
    """Format 3: policy.json is JSON, the arrays and vectors safetensors containers (raw
    little-endian numbers under a JSON header); the loaded policy decides to the bit as the
    trained one (its weights were float32 from the start)."""
    from routeopt.router_training.policy.tensors import loads

    policy = trained.policy
    files = policy.save(tmp_path)
    assert (
        sorted(files)
        == sorted(p.name for p in tmp_path.iterdir())
        == ["arrays.safetensors", "conformance.safetensors", "policy.json"]
    )
    assert json.loads((tmp_path / "policy.json").read_text())["format_version"] == 3
    arrays, meta = loads((tmp_path / "arrays.safetensors").read_bytes(), "arrays")
    assert meta == {"format": "routeopt.arrays/3"} and arrays["scorer.weights"].dtype == np.float32
    again = RoutingPolicy.load(tmp_path)
    suites = ["reverse", "sort", None] * 5
    assert policy.decide_batch(PROMPTS, suites) == again.decide_batch(PROMPTS, suites)
    assert again.describe()["candidates"] == policy.candidates
    json.dumps(again.describe())


def test_self_check_twice_on_one_policy_is_ok_both_times(trained, tmp_path):
    """A loaded policy's state is its declared fields: the self-check keeps its report, so a
    second call (a status page, a reload) gives the same answer instead of "no vectors"."""
    trained.policy.save(tmp_path)
    policy = RoutingPolicy.load(tmp_path)
    assert policy.format_version == 3 and policy.vectors is not None
    first = policy.self_check()
    second = policy.self_check()
    assert first.ok and second.ok and second == first
    assert policy.vectors is None  # the bytes are released once checked
    fresh = RoutingPolicy.load(tmp_path, vectors=False)
    assert fresh.vectors is None and fresh.self_check().ok is False  # nothing loaded: nothing passes
    built = trained.policy
    assert built.format_version is None and built.self_check().ok  # built in memory: nothing to check


def test_safetensors_files_load_with_the_reference_library(trained, tmp_path):
    safetensors = pytest.importorskip("safetensors.numpy")
    trained.policy.save(tmp_path)
    from routeopt.router_training.policy.tensors import loads

    for name in ("arrays.safetensors", "conformance.safetensors"):
        ours, _ = loads((tmp_path / name).read_bytes(), name)
        theirs = safetensors.load_file(str(tmp_path / name))
        assert set(ours) == set(theirs)
        assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def test_load_rejects_broken_folder(tmp_path):
    with pytest.raises(ValueError, match="not a readable routing policy"):
        RoutingPolicy.load(tmp_path)


def test_load_rejects_unknown_format_version(trained, tmp_path):
    trained.policy.save(tmp_path)
    head = json.loads((tmp_path / "policy.json").read_text())
    head["format_version"] = 99
    (tmp_path / "policy.json").write_text(json.dumps(head))
    with pytest.raises(ValueError, match="format_version"):
        RoutingPolicy.load(tmp_path)


@settings(max_examples=40, deadline=None)
@given(st.floats(0, 1.2), st.floats(0, 1.2))
@example(1.0, 1.125)  # the top once left out the reference, which passed more than any hull point
def test_higher_target_never_lowers_the_promised_pass_rate(trained, a, b):
    """A higher target is served by a point certified for at least as much, that passed at least
    as often on calibration data (the top, past every certified target, passed most often)."""
    lo, hi = sorted((a, b))
    p_lo, p_hi = trained.policy.point_for(lo), trained.policy.point_for(hi)
    assert p_hi.pass_rate >= p_lo.pass_rate - 1e-12
    if p_hi is not trained.policy.knob.top:
        assert p_hi.certified >= p_lo.certified and p_hi.cost >= p_lo.cost


@settings(max_examples=60)
@given(st.integers(1, 8), st.integers(2, 5), st.integers(0, 10**6), st.sampled_from(["lambda", "threshold"]))
def test_choose_is_monotone_per_request(n, k, seed, rule):
    rng = np.random.default_rng(seed)
    P, C = rng.random((n, k)), rng.random((n, k))
    grid = np.linspace(0, 1.01, 30) if rule == "threshold" else np.geomspace(1e-3, 1e3, 30)[::-1]
    rows = np.arange(n)
    chosen = [P[rows, choose(P, C, rule, t)[:, 0]] for t in grid]  # cheap -> quality order
    for before, after in zip(chosen, chosen[1:]):
        assert np.all(after >= before - 1e-12)


@settings(max_examples=200)
@given(
    st.integers(1, 12),
    st.integers(2, 6),
    st.integers(0, 10**6),
    st.sampled_from([(0, 1), (0, 2), (2, 3), (3, 0), (1, 1)]),
    st.sampled_from([0.0, 0.25, 0.7, 1.0]),
    st.booleans(),
    st.sampled_from(["none", "grid", "score"]),
)
def test_the_knob_decides_a_batch_as_it_decides_each_row_alone(n, k, seed, members, weight, masked, tied):
    """`point_choice` and `fallback_order` give every row of a batch (the arrays' path) the bits
    they give it alone (a gateway's decision: one row, in Python's floats), mixed points, ties
    and budget masks included; so does `row_decision`, wherever it answers."""
    rng = np.random.default_rng(seed)
    if tied == "grid":
        P, C = rng.integers(0, 4, (n, k)) / 4, rng.integers(1, 4, (n, k)) / 100  # ties on purpose
    elif tied == "score":  # p - 3 c ties exactly (dyadic numbers) between different costs
        C = rng.integers(1, 4, (n, k)) / 64
        P = rng.integers(0, 2, (n, k)) / 4 + 3.0 * C
    else:
        P, C = rng.random((n, k)), rng.random((n, k)) / 50
    allowed = rng.random((n, k)) < 0.5 if masked else None
    if allowed is not None:
        allowed[np.arange(n), rng.integers(0, k, n)] = True
    knob_members = [
        Member("lambda", 3.0),
        Member("lambda", 30.0),
        Member("single", k - 1),
        Member("threshold", 0.5),
    ]
    point = OperatingPoint(members[0], members[1], weight, 0.5, 0.5, 0.0)
    knob = Knob(knob_members, [point], point, 0.9)
    units = rng.random(n)
    pick, prop = point_choice(knob, point, P, C, lambda i: float(units[i]), allowed)
    order = fallback_order(knob, point, P, C, allowed)
    for i in range(n):
        row = None if allowed is None else allowed[i : i + 1]
        one, one_prop = point_choice(knob, point, P[i : i + 1], C[i : i + 1], lambda _: float(units[i]), row)
        assert one.tolist() == [pick[i]] and one_prop.tobytes() == prop[i : i + 1].tobytes()
        assert fallback_order(knob, point, P[i : i + 1], C[i : i + 1], row).tolist() == [order[i].tolist()]
        if allowed is not None:
            assert allowed[i, pick[i]]
        # RoutingPolicy.decide's path: choice, probability and order at once, in floats
        mask = None if allowed is None else allowed[i].tolist()
        alone = row_decision(knob, point, P[i].tolist(), C[i].tolist(), lambda: float(units[i]), mask)
        uses_threshold = "threshold" in (knob_members[members[0]].rule, knob_members[members[1]].rule)
        assert (alone is None) == uses_threshold
        if alone is not None:
            assert alone[0] == pick[i] and alone[2] == order[i].tolist()
            assert np.array([alone[1]]).tobytes() == prop[i : i + 1].tobytes()


def test_extreme_targets_pick_cheapest_and_most_likely(trained):
    policy = trained.policy
    cheap = policy.decide_batch(PROMPTS, quality_target=0.0)
    for d in cheap:
        assert d.expected_cost_usd[d.model] == min(d.expected_cost_usd.values())
    best = policy.decide_batch(PROMPTS, quality_target=10.0)
    for d in best:
        assert d.pass_probabilities[d.model] >= max(d.pass_probabilities.values()) - 0.05


def test_bad_target_is_an_error(trained):
    with pytest.raises(ValueError):
        trained.policy.decide("x", quality_target=float("nan"))


@pytest.mark.parametrize("target", [None, 0.0, 0.8, 1.0, 2.0])
def test_decide_matches_decide_batch(trained, target):
    suites = ["add", "sort", None, "unknown"] * 4
    prompts = (PROMPTS * 2)[: len(suites)]
    batch = trained.policy.decide_batch(prompts, suites, target)
    single = [trained.policy.decide(p, s, target) for p, s in zip(prompts, suites)]
    assert batch == single


def _as_format_1(policy, folder, table):
    """Write a policy the way format 1 stored it: a rule and its table."""
    from tests.router_training.legacy import save_format_1

    save_format_1(policy, folder, table)


def test_format_1_policies_still_load_and_route_as_they_did(tmp_path):
    """A policy published before the knob (format 1: rule + table of lambda -> expected pass rate)
    loads, and each target picks the cheapest table entry whose pass rate reaches its floor."""
    from routeopt.router_training.train import Design, train_router
    from tests.router_training.conftest import demo_frame

    policy = train_router(
        demo_frame(n_items=40),
        holdout_fraction=0.0,
        design=Design(topics=0, candidate_text=0.0, char_ngrams=4),
    ).policy
    ref = policy.reference_pass_rate
    table = [[1e6, 0.3], [300.0, 0.5 * ref], [30.0, 0.8 * ref], [0.0, 0.97 * ref]]
    _as_format_1(policy, tmp_path, table)
    old = RoutingPolicy.load(tmp_path)
    assert [m.param for m in old.knob.members] == [1e6, 300.0, 30.0, 0.0]
    for target, want in ((0.0, 1e6), (0.5, 300.0), (0.79, 30.0), (0.9, 0.0), (2.0, 0.0)):
        point = old.point_for(target)
        assert old.knob.members[point.a].param == want and point.weight == 1.0
        d = old.decide(PROMPTS[3], "reverse", quality_target=target)
        P, C = old.predict([PROMPTS[3]], ["reverse"])
        assert d.model == old.candidates[choose(P, C, "lambda", want)[0, 0]] and d.propensity == 1.0
    again = tmp_path / "again"
    old.save(again)  # written back in the current format; its weights become float32
    assert json.loads((again / "policy.json").read_text())["format_version"] == 3
    new = RoutingPolicy.load(again)
    assert [d.model for d in new.decide_batch(PROMPTS, None, 0.8)] == [
        d.model for d in old.decide_batch(PROMPTS, None, 0.8)
    ]
    assert new.self_check().ok


def test_format_2_policies_still_load_and_decide_as_they_did(trained, tmp_path):
    """A format 2 policy (JSON arrays) loads, decides like the policy it was written from (its
    weights rounded to 7 decimals), and reports that it has no conformance vectors."""
    from tests.router_training.legacy import save_format_2

    save_format_2(trained.policy, tmp_path)
    old = RoutingPolicy.load(tmp_path)
    suites = ["reverse", "sort", None] * 5
    assert [d.model for d in old.decide_batch(PROMPTS, suites)] == [
        d.model for d in trained.policy.decide_batch(PROMPTS, suites)
    ]
    report = old.self_check()
    assert report.ok and report.requests == 0 and "format 2" in report.summary()


def test_a_policy_naming_a_missing_member_does_not_load(trained, tmp_path):
    trained.policy.save(tmp_path)
    head = json.loads((tmp_path / "policy.json").read_text())
    head["knob"]["members"].append(["single", 99])
    (tmp_path / "policy.json").write_text(json.dumps(head))
    with pytest.raises(ValueError, match="candidate 99"):
        RoutingPolicy.load(tmp_path)


def test_hostile_requests_decide_and_non_strings_are_clear_errors(trained):
    policy = trained.policy
    for prompt in ["", "\x00", "\ud800", "abc\udfff", "a" * (1 << 20), "😀" * 5000, "İ" * 9000]:
        for suite in (None, "", "no-such-suite", "add"):
            d = policy.decide(prompt, suite)
            assert d.model in policy.candidates and 0 < d.propensity <= 1
    with pytest.raises(TypeError, match="prompt must be a string"):
        policy.decide(None)
    with pytest.raises(TypeError, match="prompt must be a string"):
        policy.decide(b"bytes")
    with pytest.raises(TypeError, match="suite must be a string"):
        policy.decide("x", 3)
