"""Latency budgets through the serving paths: the loader's router, the gateway's decision log,
the decision service (body, metadata and headers) and a policy that cannot serve them."""

from __future__ import annotations

import json
import logging
import math

import httpx
import pytest

from routeopt.artifacts.serving.decision_service import DecisionService, SharedObservations
from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.serving.route_request import BadRequest, route_request
from routeopt.artifacts.serving.settings import GatewaySettings
from tests.artifacts.serving.workers import two_workers
from tests.router_training.conftest import timed_frame

PROMPTS = [
    ("Task: sort the input. difficulty: 1. Input: stone river", "sort"),
    ("Task: add the input. difficulty: 4. Input: stone river apple cloud tiger", "add"),
    ("Task: reverse the input. difficulty: 2. Input: maple violet piano", "reverse"),
]


@pytest.fixture(scope="module")
def timed_policy():
    from routeopt.router_training.train import train_router

    return train_router(timed_frame(n_items=80), quality_target=0.9, seed=0).policy


@pytest.fixture()
def router(timed_policy, publish_to, registry, keypair):
    publish_to(timed_policy)
    return load(registry, keypair[1], state_dir=False)


def test_the_router_serves_the_policys_budget_decision(router, timed_policy) -> None:
    budget = timed_policy.latency.budgets("ttft")[-1]
    for prompt, suite in PROMPTS:
        d = router.route(prompt, suite, ttft_budget_s=budget)
        want = timed_policy.decide(prompt, suite, ttft_budget_s=budget)
        assert (d.model, d.fallbacks) == (want.model, want.fallbacks)
        assert d.budget == {
            "kind": "ttft",
            "budget_s": budget,
            "tier_s": want.budget.tier_s,
            "met": want.budget.met,
            "predicted_s": want.budget.predicted_s,
            "mask_s": want.budget.mask_s,
        }
        assert router.route(prompt, suite).budget is None
    with pytest.raises(ValueError, match="not both"):
        router.route("x", ttft_budget_s=1, latency_budget_s=1)


def test_the_decision_log_records_the_budget(router, timed_policy, tmp_path) -> None:
    log = DecisionLog(tmp_path / "log")
    gateway = Gateway(router, log=log)
    budget = timed_policy.latency.budgets("latency")[0]
    d = gateway.route(PROMPTS[0][0], PROMPTS[0][1], request_id="r1", latency_budget_s=budget)
    log.close()
    (line,) = [json.loads(x) for f in (tmp_path / "log").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert line["request_id"] == "r1" and line["model"] == d.model
    assert line["budget"] == {k: v for k, v in d.budget.items() if k not in ("predicted_s", "mask_s")}
    assert line["budget"]["kind"] == "latency" and line["budget"]["budget_s"] == budget


def test_exploration_sends_a_budgeted_request_only_to_candidates_predicted_to_meet_it(
    router, timed_policy, tmp_path
) -> None:
    """Every request explored (rate 1): under a budget that some candidates' predicted p95
    misses, none of those is eligible or served, and the propensity is over the rest; without
    a budget every candidate is eligible, as before."""

    def within(b: float) -> list[int]:
        outcomes = (timed_policy.decide(p, s, ttft_budget_s=b).budget for p, s in PROMPTS)
        return [sum(t <= b for t in o.predicted_s.values()) for o in outcomes]

    k = len(timed_policy.candidates)
    budget = next(b for b in timed_policy.latency.budgets("ttft") if all(2 <= n < k for n in within(b)))
    log = DecisionLog(tmp_path / "log")
    gateway = Gateway(router, log=log, exploration=Exploration(rate=1.0, seed=3))
    served, left_out = set(), set()
    for i in range(60):
        prompt, suite = PROMPTS[i % len(PROMPTS)]
        d = gateway.route(prompt, suite, request_id=f"x{i}", ttft_budget_s=budget)
        within = [c for c, t in d.budget["predicted_s"].items() if t <= budget]
        assert d.model in within
        served.add(d.model)
        left_out |= set(d.budget["predicted_s"]) - set(within)
        assert d.propensity == pytest.approx(1 / len(within))
        free = gateway.route(prompt, suite, request_id=f"x{i}")
        assert free.propensity == pytest.approx(1 / k)
    log.close()
    assert left_out and len(served) >= 2  # the budget binds, and exploration still spreads
    lines = [json.loads(x) for f in (tmp_path / "log").glob("*.jsonl") for x in f.read_text().splitlines()]
    budgeted = [line for line in lines if "budget" in line]
    assert budgeted and all(set(line["exploration"]["eligible"]).isdisjoint(left_out) for line in budgeted)


def test_a_policy_without_a_latency_model_decides_without_the_budget_and_says_so(
    policies, publish_to, registry, keypair, caplog
) -> None:
    plain = policies[0]
    if plain.latency is not None:  # the shared test policy measured latency: drop its section
        import copy

        plain = copy.copy(plain)
        plain.latency = None
    publish_to(plain)
    router = load(registry, keypair[1], state_dir=False)
    with caplog.at_level(logging.WARNING):
        a = router.route(PROMPTS[0][0], ttft_budget_s=0.5)
        b = router.route(PROMPTS[1][0], ttft_budget_s=0.5)
    assert a.model == router.route(PROMPTS[0][0]).model
    assert a.budget == {
        "kind": "ttft",
        "budget_s": 0.5,
        "met": None,
        "unserved": "policy version 1 has no ttft model",
    }
    assert b.budget["met"] is None
    assert sum("has no ttft model" in r.getMessage() for r in caplog.records) == 1  # warned once


def test_budgets_are_read_from_the_body_metadata_or_headers() -> None:
    assert route_request({"prompt": "x", "ttft_budget_s": 0.8}).budgets() == {
        "ttft_budget_s": 0.8,
        "latency_budget_s": None,
    }
    assert (
        route_request({"prompt": "x", "metadata": {"routeopt_latency_budget_s": "3"}}).latency_budget_s == 3.0
    )
    assert route_request({"prompt": "x"}, {"x-routeopt-ttft-budget-s": "0.25"}).ttft_budget_s == 0.25
    for body, match in (
        ({"prompt": "x", "ttft_budget_s": 0}, "ttft_budget_s must be a positive number"),
        ({"prompt": "x", "ttft_budget_s": "soon"}, "ttft_budget_s is 'soon', not a number"),
        ({"prompt": "x", "latency_budget_s": True}, "latency_budget_s is a boolean"),
        ({"prompt": "x", "ttft_budget_s": 1, "latency_budget_s": 2}, "not both"),
    ):
        with pytest.raises(BadRequest, match=match):
            route_request(body)


async def test_the_decision_service_answers_with_the_budget(router, timed_policy, registry, keypair) -> None:
    service = DecisionService(
        GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=0)
    )
    service.start()
    budget = timed_policy.latency.budgets("ttft")[0]
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service), base_url="http://r") as c:
            r = await c.post(
                "/v1/route",
                json={"prompt": PROMPTS[1][0], "suite": "add"},
                headers={"x-routeopt-ttft-budget-s": str(budget)},
            )
            assert r.status_code == 200, r.text
            want = timed_policy.decide(PROMPTS[1][0], "add", ttft_budget_s=budget)
            got = r.json()
            assert got["model"] == want.model
            assert got["budget"] == {  # the predictions stay: an observation passes its model's back
                "kind": "ttft",
                "budget_s": budget,
                "tier_s": want.budget.tier_s,
                "met": want.budget.met,
                "predicted_s": want.budget.predicted_s,
            }
            explained = (
                await c.post("/v1/route?explain=1", json={"prompt": "y", "ttft_budget_s": budget})
            ).json()
            assert set(explained["budget"]["predicted_s"]) == set(timed_policy.candidates)
            bad = await c.post("/v1/route", json={"prompt": "y", "ttft_budget_s": -1})
            assert bad.status_code == 400 and "ttft_budget_s" in bad.text
    finally:
        service.close()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_live_latency_moves_decisions_off_a_slow_candidate_and_back(
    timed_policy, publish_to, registry, keypair, tmp_path
) -> None:
    from routeopt.router_training.policy.live import LiveSettings, live_move

    publish_to(timed_policy)
    clock = Clock()
    router = load(
        registry, keypair[1], state_dir=False, clock=clock, live=LiveSettings(window_s=10, min_observations=5)
    )
    budget = timed_policy.latency.budgets("ttft")[-1]
    frame = timed_frame(n_items=20).drop_duplicates("request_id")
    prompts = list(zip(frame["prompt"], frame["suite"]))
    before = [router.route(p, s, ttft_budget_s=budget) for p, s in prompts]
    assert all(d.live is None for d in before)
    names = timed_policy.candidates

    def move(d, slow):
        b = d.budget
        limit = b["budget_s"] if b["mask_s"] is None else b["mask_s"]
        return live_move(d.model, d.fallbacks, names, d.pass_probabilities, b["predicted_s"], limit, slow)

    movable = [d.model for d in before if move(d, {d.model: 3.0})]
    assert movable, "the test needs decisions a slowdown can move"
    slow = max(set(movable), key=movable.count)
    for t in range(20):  # 10 s of calls: the slow one at three times its prediction, the others at it
        clock.now = t * 0.5
        for name in names:
            router.observe(name, ttft_s=budget * (3 if name == slow else 1), predicted_ttft_s=budget)
            router.observe(name, ttft_s=budget * 9)  # without a prediction: no say in moving
    during = [router.route(p, s, ttft_budget_s=budget) for p, s in prompts]
    moved = [d for d in during if d.live is not None]
    assert moved, "some decision should move off the slow candidate"
    for d, b in zip(during, before):
        if d.live is not None:
            assert d.live == {"from": b.model, "over": [slow]} and d.model != slow
            assert d.pass_probabilities[d.model] >= d.pass_probabilities[b.model]
            assert d.fallbacks[0] == b.model
            assert d.budget["met"] == (d.budget["predicted_s"][d.model] <= budget)
        else:
            assert d.model == b.model
            assert b.model != slow or not move(b, {slow: 3.0})
    gateway = Gateway(router, log=DecisionLog(tmp_path / "log"))
    p, s = next((p, s) for (p, s), d in zip(prompts, during) if d.live is not None)
    gateway.route(p, s, request_id="moved", ttft_budget_s=budget)
    gateway.log.close()
    (line,) = [json.loads(x) for f in (tmp_path / "log").glob("*.jsonl") for x in f.read_text().splitlines()]
    assert line["live"]["over"] == [slow]
    clock.now = 30.0  # the window has passed with no new observations: too few to act on
    after = [router.route(p, s, ttft_budget_s=budget) for p, s in prompts]
    assert [d.model for d in after] == [d.model for d in before]
    assert [router.route(p, s).live for p, s in prompts] == [None] * len(prompts)  # no budget: never moved


async def test_the_decision_service_takes_observations(router, timed_policy, registry, keypair) -> None:
    service = DecisionService(
        GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=0)
    )
    service.start()
    try:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=service), base_url="http://r") as c:
            r = await c.post("/v1/observe", json=[{"model": "small", "ttft_s": 0.2, "latency_s": 1.5}] * 3)
            assert r.status_code == 200 and r.json() == {"observed": 3}
            r = await c.post("/v1/observe", json={"model": "small", "ttft_s": 0.2, "predicted_ttft_s": 0.1})
            assert r.json() == {"observed": 1}
            snapshot = service.gateway.champion.live.snapshot(service.gateway.champion._clock())
            assert set(snapshot) == {"small"}
            live = service.gateway.champion.live
            ratios = [row[2] for row in live._obs["small", "ttft"]]  # measured / predicted, NaN without
            assert all(math.isnan(r) for r in ratios[:3]) and ratios[3:] == [2.0]
            for body, field in (
                ({"model": "small", "ttft_s": -1}, "ttft_s"),
                ({"model": "", "ttft_s": 1}, "model"),
                ({"model": "small"}, "neither"),
                ([{"model": "small", "latency_s": "x"}], "[0].latency_s"),
                (
                    {"model": "small", "ttft_s": 1, "predicted_ttft_s": 0},
                    "predicted_ttft_s must be a positive",
                ),
                ({"model": "small", "latency_s": 1, "predicted_ttft_s": 1}, "predicted_ttft_s needs ttft_s"),
                ({"model": "small", "ttft_s": 1, "ttft": 1}, "body.ttft is not a field"),
            ):
                bad = await c.post("/v1/observe", json=body)
                assert bad.status_code == 400 and field in bad.json()["error"], bad.text
            assert (await c.get("/v1/observe")).status_code == 405
    finally:
        service.close()


async def test_workers_share_observations_whichever_receives_them(
    router, timed_policy, registry, keypair
) -> None:
    """Two services on one ring, as `--workers 2` runs them: what one is told, both apply, in
    the order published; a ring lapped before a worker looked skips what it lost."""
    shared = SharedObservations(slots=8)
    async with two_workers(registry, keypair[1], shared) as (workers, clients):
        first = [
            {"model": "small", "ttft_s": 0.2, "predicted_ttft_s": 0.1},
            {"model": "big", "latency_s": 3.0},
        ]
        assert (await clients[0].post("/v1/observe", json=first)).json() == {"observed": 2}
        third = {"model": "small", "ttft_s": 0.5, "predicted_ttft_s": 0.1}
        assert (await clients[1].post("/v1/observe", json=third)).json() == {"observed": 1}
        assert (await clients[0].post("/v1/route", json={"prompt": PROMPTS[0][0]})).status_code == 200

        def seen(w: DecisionService) -> dict:
            live = w.gateway.champion.live
            return {k: [row[1:] for row in rows] for k, rows in live._obs.items() if rows}

        assert seen(workers[0]) == seen(workers[1]) != {}
        assert [r[1] for r in seen(workers[0])["small", "ttft"]] == [2.0, 5.0]  # measured / predicted
        too_long = {"model": "m" * 201, "ttft_s": 1.0}
        assert (await clients[0].post("/v1/observe", json=too_long)).status_code == 400
    lapped, position = shared.drain(0)  # 3 of 8 slots used: nothing lost yet
    assert [o["model"] for o in lapped] == ["small", "big", "small"] and position == 3
    shared.publish(
        [
            {
                "model": f"m{i}",
                "ttft_s": 1.0,
                "latency_s": None,
                "predicted_ttft_s": None,
                "predicted_latency_s": None,
            }
            for i in range(10)
        ],
        at=5.0,
    )
    lapped, position = shared.drain(3)
    assert [o["model"] for o in lapped] == [f"m{i}" for i in range(2, 10)] and position == 13
    assert lapped[0] == {
        "model": "m2",
        "ttft_s": 1.0,
        "latency_s": None,
        "predicted_ttft_s": None,
        "predicted_latency_s": None,
        "at": 5.0,
    }


def test_litellm_call_timings() -> None:
    from datetime import datetime, timedelta

    from routeopt.artifacts.serving.litellm_proxy import call_timings

    start = datetime(2026, 1, 1, 12, 0, 0)
    kw = {"stream": True, "completion_start_time": start + timedelta(seconds=0.25)}
    assert call_timings(kw, start, start + timedelta(seconds=2)) == (0.25, 2.0)
    assert call_timings({}, start, start + timedelta(seconds=2)) == (None, 2.0)  # not streamed: no TTFT
    assert call_timings({}, None, start) == (None, None)


def test_the_litellm_callback_observes_each_call_beside_its_prediction() -> None:
    from routeopt.artifacts.serving.litellm_proxy import _predicted

    d = {"budget": {"kind": "ttft", "budget_s": 1.0, "predicted_s": {"a": 0.5, "b": 0.9}}}
    assert _predicted(d, "b", 0.3, 2.0) == {"predicted_ttft_s": 0.9}  # the served model's, of its kind
    assert _predicted(d, "a", None, 2.0) == {}  # not streamed: no TTFT to set it beside
    assert _predicted({"budget": {**d["budget"], "kind": "latency"}}, "a", 0.3, 2.0) == {
        "predicted_latency_s": 0.5
    }
    assert _predicted(d, "c", 0.3, 2.0) == {}  # a deployment outside the policy
    assert (
        _predicted(
            {"budget": {"kind": "ttft", "budget_s": 1.0, "met": None, "unserved": "no policy"}}, "a", 0.3, 2.0
        )
        == {}
    )
    assert _predicted({"budget": None}, "a", 0.3, 2.0) == {}


def test_a_router_applies_the_policys_default_budget(publish_to, registry, keypair) -> None:
    from routeopt.router_training.train import train_router

    policy = train_router(
        timed_frame(n_items=60), quality_target=0.9, seed=0, default_budgets={"*": ("ttft", 1.3)}
    ).policy
    publish_to(policy)
    router = load(registry, keypair[1], state_dir=False)
    d = router.route(PROMPTS[0][0], PROMPTS[0][1])
    assert d.budget["kind"] == "ttft" and d.budget["budget_s"] == 1.3
    want = policy.decide(PROMPTS[0][0], PROMPTS[0][1], ttft_budget_s=1.3)
    assert (d.model, d.fallbacks) == (want.model, want.fallbacks)
    assert router.route(PROMPTS[0][0], PROMPTS[0][1], latency_budget_s=50).budget["kind"] == "latency"
