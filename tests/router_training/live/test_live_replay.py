"""The loop closed on a known traffic: replayed through the gateway under the champion with
exploration, true outcomes fed back, and a second policy scored off-policy against its true value.

The traffic's outcome is known for every model (a self-made fleet here; RouterBench's test split
when ../shared is there), so the second policy's true pass rate and cost come straight from the
data. Coverage over many seeds is measured by benchmarks/ope_coverage.py, not here.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from tests.artifacts.policies import make_policy, synthetic_frame
from tests.benchmarks import load

tr = load("traffic_replay")


@pytest.fixture(scope="module")
def pair():
    champion = make_policy(0)
    return champion, replace(champion, quality_target=0.8)


@pytest.fixture(scope="module")
def fleet():
    return tr.fleet_from_frame(synthetic_frame(7, n_items=300))


def within(est, truth: float, z: float = 3.29) -> bool:
    """Whether the truth is within the estimate's 99.9% normal interval: nine such checks per
    run fail together by chance about 1% of the time, whatever the policies (the 95% intervals'
    coverage over many seeds is benchmarks/ope_coverage.py's job)."""
    return abs(est.value - truth) <= z * est.se


@pytest.mark.parametrize("mode", tr.MODES)
def test_second_policy_estimated_within_its_interval(tmp_path, pair, fleet, mode) -> None:
    champion, second = pair
    true_pass, true_cost = tr.truth(second, fleet)
    registry = tr.publish_pair(tmp_path, champion, second)
    path = tr.replay(registry, fleet, tmp_path, mode=mode, seed=3, rate=0.2, reps=2)
    est = tr.estimate(path, second, 2, mode)
    assert est.n_evaluated == 600 and est.n_unknown == 0
    assert set(est.basis) == {"text": {"text"}, "shadow": {"shadow"}, "canary": {"shadow", "logged"}}[mode]
    assert 0.3 < est.agreement < 0.95  # the two policies differ: this is off-policy
    for name in ("ips", "snips", "dr"):
        assert within(est.pass_rate[name], true_pass), (name, est.pass_rate[name], true_pass)
    for name in ("ips", "dr"):
        assert within(est.cost[name], true_cost), (name, est.cost[name], true_cost)
    dr = est.pass_rate["dr"]
    assert dr.high - dr.low < 0.25 and 10 < dr.ess < 600


def test_feedback_missing_at_random_still_covers(tmp_path, pair, fleet) -> None:
    champion, second = pair
    true_pass, _ = tr.truth(second, fleet)
    registry = tr.publish_pair(tmp_path, champion, second)
    path = tr.replay(registry, fleet, tmp_path, mode="shadow", seed=5, rate=0.2, reps=2, feedback_share=0.6)
    est = tr.estimate(path, second, 2, "shadow")
    assert 300 < est.n_evaluated < 450 and est.n_logged == 600
    assert within(est.pass_rate["dr"], true_pass)


@pytest.mark.slow
def test_routerbench_test_split_replay(tmp_path) -> None:
    if not (tr.ROUTERBENCH / "test.parquet").exists():
        pytest.skip(f"{tr.ROUTERBENCH}: RouterBench is not present beside the repo")
    train, fleet, _ = tr.load_data("routerbench")
    champion, second = tr.train_pair(train)
    true_pass, true_cost = tr.truth(second, fleet)
    registry = tr.publish_pair(tmp_path, champion, second)
    for mode in tr.MODES:
        path = tr.replay(registry, fleet, tmp_path, mode=mode, seed=0, rate=0.1, reps=3)
        est = tr.estimate(path, second, 2, mode)
        assert est.pass_rate["dr"].covers(true_pass), (mode, est.pass_rate["dr"], true_pass)
        assert est.cost["dr"].covers(true_cost), (mode, est.cost["dr"], true_cost)
