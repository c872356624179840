import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from router_training.policy import Decision, RoutingPolicy, choose

PROMPTS = [f"Task: {s} the input. difficulty: {d}. Input: stone river" for s in ("reverse", "sort", "add")
           for d in range(1, 6)]


def test_decision_contract(trained):
    policy = trained.policy
    d = policy.decide(PROMPTS[0], suite="reverse")
    assert isinstance(d, Decision) and d.model in policy.candidates
    assert sorted((d.model, *d.fallbacks)) == sorted(policy.candidates)
    assert set(d.pass_probabilities) == set(policy.candidates) == set(d.expected_cost_usd)
    assert all(0 <= p <= 1 for p in d.pass_probabilities.values())
    assert all(c >= 0 for c in d.expected_cost_usd.values())
    with pytest.raises(Exception):
        d.model = "other"  # frozen


def test_save_load_round_trip_without_pickle(trained, tmp_path):
    policy = trained.policy
    files = policy.save(tmp_path)
    assert sorted(files) == sorted(p.name for p in tmp_path.iterdir())
    for name in files:
        json.loads((tmp_path / name).read_text())  # JSON only, no pickle
    again = RoutingPolicy.load(tmp_path)
    suites = ["reverse", "sort", None] * 5
    a = policy.decide_batch(PROMPTS, suites)
    b = again.decide_batch(PROMPTS, suites)
    assert [x.model for x in a] == [x.model for x in b]
    for x, y in zip(a, b):
        assert np.allclose(list(x.pass_probabilities.values()), list(y.pass_probabilities.values()), atol=1e-5)
    assert again.describe()["candidates"] == policy.candidates
    json.dumps(again.describe())


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


def _expected_quality(policy, target):
    ds = policy.decide_batch(PROMPTS, None, quality_target=target)
    return sum(d.pass_probabilities[d.model] for d in ds)


@settings(max_examples=40, deadline=None)
@given(st.floats(0, 1.2), st.floats(0, 1.2))
def test_higher_target_never_lowers_expected_quality(trained, a, b):
    lo, hi = sorted((a, b))
    assert _expected_quality(trained.policy, hi) >= _expected_quality(trained.policy, lo) - 1e-9


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
