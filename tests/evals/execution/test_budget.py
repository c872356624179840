"""Spend caps: reserve before a call, settle after, never exceed a cap, record what was skipped."""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.evals.config import BudgetSettings, Candidate, ConfigError, load_config
from routeopt.evals.execution.budget import (
    Budget,
    BudgetExhausted,
    budget_for_run,
    estimate_call_cost,
    gpu_provisional_cost,
    prompt_token_upper_bound,
    spent_in_run,
)
from routeopt.evals.providers.base import GenerationSettings, Message, Request
from routeopt.evals.storage.store import Outcome, Store


def _api(name: str = "api", inp: float = 2.0, out: float = 8.0) -> Candidate:
    return Candidate(
        name=name, provider="openai", model="m", input_price_per_mtok=inp, output_price_per_mtok=out
    )


def _req(text: str = "hello", max_tokens: int = 100) -> Request:
    return Request((Message("user", text),), GenerationSettings(max_tokens=max_tokens))


def test_estimate_is_max_tokens_at_output_price_plus_prompt_at_input_price():
    req = _req("héllo", max_tokens=1000)
    tokens_in = prompt_token_upper_bound(req)
    assert tokens_in >= len("héllo".encode())  # at most one token per byte, plus framing
    assert estimate_call_cost(_api(), req) == pytest.approx((tokens_in * 2.0 + 1000 * 8.0) / 1e6)


def test_estimate_of_gpu_priced_call_is_the_whole_timeout_alone_on_the_gpu():
    c = Candidate(name="g", provider="local", model="x", gpu_hour_usd=3.6, timeout_s=10, utilization=0.5)
    assert estimate_call_cost(c, _req()) == pytest.approx(3.6 / 3600 * 10 / 0.5)
    assert gpu_provisional_cost(c, 2.0) == pytest.approx(3.6 / 3600 * 2.0 / 0.5)
    assert gpu_provisional_cost(_api(), 2.0) is None


def test_reserve_refuses_only_what_could_exceed_the_cap():
    b = Budget(run_usd=1.0)
    r1 = b.try_reserve("a", 0.6)
    assert r1 is not None and b.reserved() == pytest.approx(0.6)
    # 0.6 in flight + 0.6 > 1.0, but 0.6 alone fits: wait rather than refuse
    assert b.try_reserve("a", 0.6) is None
    b.settle(r1, 0.5)
    assert b.spent("a") == pytest.approx(0.5) and b.reserved() == 0
    with pytest.raises(BudgetExhausted, match=r"capped at \$1 .* spent \$0.5"):
        b.try_reserve("a", 0.6)
    assert b.refused == {"a": 1}
    assert b.try_reserve("b", 0.5) is not None  # exactly reaching the cap is allowed


def test_per_candidate_cap_leaves_other_candidates_running():
    b = Budget(per_candidate_usd={"dear": 0.1})
    b.settle(b.try_reserve("dear", 0.1), 0.1)
    with pytest.raises(BudgetExhausted) as info:
        b.try_reserve("dear", 0.01)
    assert info.value.scope == "candidate"
    assert b.try_reserve("cheap", 100.0) is not None
    assert b.remaining("dear") == pytest.approx(0.0)
    assert b.remaining() == float("inf")


def test_settling_twice_is_an_error_and_resumed_spend_counts():
    b = Budget(run_usd=1.0, spent={"a": 0.95})
    with pytest.raises(BudgetExhausted):
        b.try_reserve("a", 0.1)
    r = b.try_reserve("b", 0.05)
    b.settle(r, None)
    with pytest.raises(ValueError, match="already settled"):
        b.settle(r, 0.0)
    assert b.snapshot()["spent_usd"] == pytest.approx(0.95)


def test_invalid_caps_and_estimates_are_rejected():
    with pytest.raises(ValueError, match="run_usd"):
        Budget(run_usd=-1)
    with pytest.raises(ValueError, match="finite"):
        Budget(run_usd=1).try_reserve("a", float("nan"))


def test_blocking_reserve_wakes_when_another_thread_settles():
    b = Budget(run_usd=1.0)
    first = b.reserve("a", 0.8)
    got: list = []
    t = threading.Thread(target=lambda: got.append(b.reserve("a", 0.5, timeout=5)))
    t.start()
    t.join(0.1)
    assert t.is_alive() and not got  # waiting: 0.8 in flight crowds the cap
    b.settle(first, 0.2)
    t.join(5)
    assert got and got[0].amount == 0.5


@settings(max_examples=40, deadline=None)
@given(
    cap=st.floats(0.0, 5.0),
    calls=st.lists(st.tuples(st.floats(0.0, 1.0), st.floats(0.0, 1.0)), max_size=40),
)
def test_spend_never_exceeds_the_cap_when_calls_cost_at_most_their_estimate(cap, calls):
    b = Budget(run_usd=cap)
    for estimate, fraction in calls:
        try:
            r = b.try_reserve("a", estimate)
        except BudgetExhausted:
            continue
        assert r is not None  # sequential: nothing is ever in flight here
        b.settle(r, estimate * fraction)
        assert b.spent() <= cap + 1e-12


def test_threads_racing_for_one_cap_never_overspend():
    b = Budget(run_usd=10.0, per_candidate_usd={"c0": 2.0})
    refused = [0]
    lock = threading.Lock()

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        name = f"c{seed % 3}"
        for _ in range(300):
            est = rng.uniform(0.0, 0.2)
            try:
                r = b.reserve(name, est, timeout=10)
            except BudgetExhausted:
                with lock:
                    refused[0] += 1
                continue
            b.settle(r, est * rng.random())
            assert b.spent() <= 10.0 + 1e-9 and b.spent("c0") <= 2.0 + 1e-9

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused[0] > 0 and b.reserved() == 0
    assert b.spent() <= 10.0 + 1e-9 and b.spent("c0") <= 2.0 + 1e-9


def _outcome(item: str, **kw) -> Outcome:
    return Outcome(run_id="r", suite="s", suite_version="v", item_id=item, candidate="api", **kw)


async def test_concurrent_reservations_wait_for_settlements_then_stop_at_the_cap():
    budget = Budget(run_usd=0.35)
    sent: list[int] = []

    async def call(i: int) -> bool:
        try:
            res = await budget.areserve("api", 0.1)
        except BudgetExhausted:
            return False
        sent.append(i)
        await asyncio.sleep(0.01)
        budget.settle(res, 0.1)
        return True

    results = await asyncio.gather(*(call(i) for i in range(6)))
    assert sum(results) == 3 and len(sent) == 3  # three fit; the others waited, then were refused
    assert budget.spent() == pytest.approx(0.3) and budget.reserved() == 0 and budget.refused == {"api": 3}


def test_budget_for_run_and_resume_spend(tmp_path: Path):
    assert budget_for_run(BudgetSettings()) is None
    with Store(tmp_path / "db.duckdb") as store:
        store.write_outcomes(
            [
                _outcome("a", cost_usd=0.25, judge_candidate="judge", judge_cost_usd=0.125),
                _outcome("b", cost_usd=None),
                _outcome("c", cost_usd=0.5, cached=True),
                _outcome("d", cost_usd=0.0625, error_kind="truncated_stream"),
            ]
        )
        spent = spent_in_run(store, "r")
    # a failed call's cost counts; a cached answer was not paid; the judge's calls are its own
    assert spent == {"api": pytest.approx(0.3125), "judge": pytest.approx(0.125)}
    b = budget_for_run(BudgetSettings(run_usd=1.0, per_candidate_usd={"api": 0.4}), spent)
    assert b is not None and b.remaining("api") == pytest.approx(0.0875)
    assert b.remaining() == pytest.approx(1.0 - 0.3125 - 0.125)


def test_config_rejects_caps_for_unknown_candidates(tmp_path: Path):
    cfg = tmp_path / "routeopt.yaml"
    cfg.write_text(
        "candidates:\n"
        "  - {name: a, provider: openai, model: m, input_price_per_mtok: 1, output_price_per_mtok: 1}\n"
        "budget: {run_usd: 5, per_candidate_usd: {b: 1}}\n"
    )
    with pytest.raises(ConfigError, match=r"budget\.per_candidate_usd names unknown candidates \['b'\]"):
        load_config(cfg)
    cfg.write_text(cfg.read_text().replace("{b: 1}", "{a: -1}"))
    with pytest.raises(ConfigError, match=r"budget.per_candidate_usd.*>= 0"):
        load_config(cfg)


def test_split_shares_what_remains_between_tasks_in_other_processes():
    import pickle

    b = Budget(run_usd=1.0, per_candidate_usd={"a": 0.4}, spent={"a": 0.1, "b": 0.1})
    shares = b.split([("s1", "a"), ("s2", "a"), ("s1", "b"), ("s2", "b")])
    assert shares[("s1", "a")].run_usd == pytest.approx(0.2)
    assert shares[("s1", "a")].per_candidate_usd == {"a": pytest.approx(0.15)}
    assert shares[("s1", "b")].per_candidate_usd == {}
    assert sum(x.run_usd for x in shares.values()) == pytest.approx(1.0 - 0.2)
    copy = pickle.loads(pickle.dumps(shares[("s2", "a")]))
    r = copy.try_reserve("a", 0.1)
    copy.settle(r, 0.1)
    with pytest.raises(BudgetExhausted):
        copy.try_reserve("a", 0.06)
    assert shares[("s2", "a")].spent() == 0.0  # the copy is independent
    assert Budget(per_candidate_usd={"a": 1.0}).split([("s", "a")])[("s", "a")].run_usd is None
    # a judge, capped but evaluated by no pair, is called from every pair: each gets a share
    judged = Budget(per_candidate_usd={"judge": 0.4}).split([("s1", "a"), ("s2", "b")])
    assert all(x.per_candidate_usd == {"judge": pytest.approx(0.2)} for x in judged.values())
