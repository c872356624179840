"""The call path (`routeopt.evals.execution.calls`) through the runner: an open breaker makes the queue
wait for its probe, one breaker per endpoint and key, a refused key stops the pair, and every
attempt (failed ones and retries included) is priced and counted against the spend caps."""

from __future__ import annotations

import math
import threading
import time

import pytest

from routeopt.evals.config import Candidate
from routeopt.evals.execution.budget import Budget
from routeopt.evals.execution.limits import (
    CircuitBreaker,
    EndpointLimits,
    RateLimiter,
    reset_shared_limits,
    shared_limits,
)
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
from routeopt.evals.providers.sdk import estimate_tokens
from routeopt.evals.storage.store import Outcome, Store
from routeopt.evals.suite.spec import load_suite
from tests.fake_llm import FaultPlan, _prompt_of, count_tokens, write_arithmetic_suite

FAST = RetryPolicy(base_s=0.005, max_s=0.02)


def limits(c: Candidate, failures: int = 10, cooldown_s: float = 30.0) -> EndpointLimits:
    return EndpointLimits(RateLimiter(), CircuitBreaker(c.base_url or "", failures, cooldown_s))


def by_item(rows: list[Outcome]) -> dict[str, Outcome]:
    out = {r.item_id: r for r in rows}
    assert len(out) == len(rows), "an item was written twice"
    return out


async def test_an_open_breaker_makes_the_queue_wait_for_its_probe(tmp_path, fake_llm, fake_candidate):
    """An outage that lasts 0.8 s after the breaker opens: the queue waits and probes, then
    every item passes."""
    fake_llm.faults = FaultPlan({"server_error": 1.0})
    suite = load_suite(write_arithmetic_suite(tmp_path, 20))
    cand = fake_candidate(max_retries=5, max_concurrency=2)
    lim = limits(cand, failures=3, cooldown_s=0.15)
    healed = threading.Event()
    outage: list[float] = []

    def heal_after_opening() -> None:
        while lim.breaker.times_opened == 0 and not healed.is_set():
            time.sleep(0.005)
        outage.append(lim.breaker.down_since or time.monotonic())  # when it opened
        healed.wait(0.8)
        fake_llm.faults = FaultPlan()
        outage.append(time.monotonic())

    watcher = threading.Thread(target=heal_after_opening)
    watcher.start()
    rows: list[Outcome] = []
    try:
        stats = await evaluate_pair(suite, cand, "r", rows.extend, limits=lim, retry=FAST)
    finally:
        healed.set()
        watcher.join()
    assert [r.error_kind for r in rows] == [None] * 20 and all(r.passed for r in rows)
    failed = [r for r in fake_llm.requests if r.fault == "server_error"]
    # 3 failures open it, the call in flight fails, then one probe per cool-down
    probes = math.ceil((outage[1] - outage[0]) / 0.15) + 1
    assert lim.breaker.times_opened >= 1 and len(failed) <= 3 + 1 + probes
    assert lim.breaker.state == "closed" and stats.errors == 0
    assert sum(r.attempts for r in rows) == len(fake_llm.settle(stats.calls)) == stats.calls


async def test_an_endpoint_down_past_the_wait_leaves_its_items_for_the_resumed_run(
    tmp_path, fake_llm, fake_candidate
):
    fake_llm.faults = FaultPlan({"server_error": 1.0})
    suite = load_suite(write_arithmetic_suite(tmp_path, 12))
    cand = fake_candidate(max_retries=8, max_concurrency=3)
    with Store(tmp_path / "o.duckdb") as store:
        t0 = time.perf_counter()
        await evaluate_pair(
            suite,
            cand,
            "r",
            store.write_outcomes,
            limits=limits(cand, 2, 0.1),
            retry=FAST,
            breaker_max_wait_s=0.5,
        )
        waited = time.perf_counter() - t0
        first = by_item(_rows(store))
        kinds = {r.error_kind for r in first.values()}
        assert kinds <= {"circuit_open", "server_error"} and "circuit_open" in kinds
        gave_up = [r for r in first.values() if r.error_kind == "circuit_open"]
        assert waited >= 0.5 and all("gave up after waiting" in r.error for r in gave_up)
        left = {it.id for it in suite.items} - store.done_items("r", suite.name, cand.name)
        assert left == {r.item_id for r in gave_up}  # resumable, unlike a final error

        fake_llm.faults = FaultPlan()  # the endpoint is back
        mark = len(fake_llm.requests)
        done = store.done_items("r", suite.name, cand.name)
        await evaluate_pair(
            suite, cand, "r", store.write_outcomes, done=done, limits=limits(cand, 2, 0.1), retry=FAST
        )
        final = by_item(_rows(store))
    assert len(fake_llm.requests) - mark == len(left)  # only those items were called again
    assert all(final[i].passed for i in left) and len(final) == 12


def _rows(store: Store) -> list[Outcome]:
    frame = store.query("SELECT item_id, error_kind, error, passed, attempts, cost_usd FROM outcomes")
    return [
        Outcome(
            "r",
            "arith",
            "v",
            r.item_id,
            "c",
            error_kind=r.error_kind,
            error=r.error,
            passed=r.passed,
            attempts=r.attempts,
            cost_usd=r.cost_usd,
        )
        for r in frame.itertuples()
    ]


def test_one_breaker_per_endpoint_and_key_never_holding_the_key(monkeypatch):
    reset_shared_limits()
    monkeypatch.setenv("TEAM_A_KEY", "sk-team-a-0123456789")
    monkeypatch.setenv("TEAM_B_KEY", "sk-team-b-9876543210")

    def cand(name: str, key: str, **kw) -> Candidate:
        return Candidate(
            name=name,
            provider="openai",
            model=name,
            api_key_env=key,
            input_price_per_mtok=1,
            output_price_per_mtok=1,
            **kw,
        )

    a, a2, b = cand("a", "TEAM_A_KEY"), cand("a-mini", "TEAM_A_KEY"), cand("b", "TEAM_B_KEY")
    vllm = cand("v", "TEAM_A_KEY", base_url="http://vllm.internal:8000/v1")
    breakers = {c.name: shared_limits(c).breaker for c in (a, a2, b, vllm)}
    assert breakers["a"] is breakers["a-mini"]  # one account on one endpoint fails together
    assert breakers["a"] is not breakers["b"]  # another key is another account
    assert breakers["a"] is not breakers["v"]  # another endpoint
    assert "api.openai.com" in breakers["a"].endpoint and "$TEAM_A_KEY" in breakers["a"].endpoint
    from routeopt.evals.execution import limits as limits_module

    for text in (repr(limits_module._SHARED), repr(breakers)):
        assert "sk-team" not in text and "0123456789" not in text
    reset_shared_limits()


async def test_a_refused_key_stops_the_pair_without_opening_the_breaker(
    tmp_path, fake_llm, fake_candidate, monkeypatch, caplog
):
    caplog.set_level("WARNING", logger="routeopt.evals.execution.calls")
    monkeypatch.setenv("FAKE_KEY", "sk-wrong-0123456789")
    fake_llm.expect_api_key = "sk-right-0123456789"
    suite = load_suite(write_arithmetic_suite(tmp_path, 30))
    cand = fake_candidate(api_key_env="FAKE_KEY", max_concurrency=3)
    lim = limits(cand, failures=2)
    with Store(tmp_path / "o.duckdb") as store:
        stats = await evaluate_pair(suite, cand, "r", store.write_outcomes, limits=lim, retry=FAST)
        rows = by_item(_rows(store))
        assert len(fake_llm.requests) <= 3  # the first wave only, not one call per item
        assert {r.error_kind for r in rows.values()} == {"auth"} and len(rows) == 30
        unsent = [r for r in rows.values() if r.attempts == 0]
        assert len(unsent) >= 27 and all("$FAKE_KEY" in r.error and "not sent" in r.error for r in unsent)
        assert lim.breaker.state == "closed" and lim.breaker.times_opened == 0
        assert stats.halted and "resume" in stats.halted and stats.error_kinds == {"auth": 30}
        said = [r.getMessage() for r in caplog.records if r.name == "routeopt.evals.execution.calls"]
        assert len(said) == 1 and said[0].startswith(
            "candidate 'fake-openai' stopped calling"
        )  # when it stopped
        assert not any(
            "sk-wrong" in (r.error or "") or "0123456789" in (r.error or "") for r in rows.values()
        )

        monkeypatch.setenv("FAKE_KEY", "sk-right-0123456789")  # fixed: the resumed run finishes
        done = store.done_items("r", suite.name, cand.name)
        assert done == set()
        await evaluate_pair(suite, cand, "r", store.write_outcomes, done=done, limits=lim, retry=FAST)
        assert all(r.passed for r in _rows(store)) and len(_rows(store)) == 30


def _failed_cost(provider: str, body: dict, request, answer: str) -> float:
    """What a stream cut after its content costs: the prompt (as the server reported it in
    Anthropic's message_start, else estimated) and the output received (estimated)."""
    inp = (
        count_tokens(_prompt_of("", body))
        if provider == "anthropic"
        else estimate_tokens(request.prompt_text)
    )
    return (inp * 1.0 + math.ceil(len(answer) / 4) * 2.0) / 1e6


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_failed_attempts_and_retries_are_priced_and_budgeted(
    tmp_path, fake_llm, fake_candidate, provider
):
    tags = {0: "[[fault:truncated*1]]", 1: "[[fault:truncated]]", 2: "[[fault:server_error*1]]"}
    suite = load_suite(write_arithmetic_suite(tmp_path, 4, tags=lambda i: tags.get(i, "")))
    cand = fake_candidate(provider, max_retries=2)
    budget = Budget(run_usd=10.0)
    rows: list[Outcome] = []
    await evaluate_pair(suite, cand, "r", rows.extend, limits=limits(cand), retry=FAST, budget=budget)
    got = by_item(rows)
    bodies = {_prompt_of("", rec.body): rec.body for rec in fake_llm.requests}

    def cut(i: int) -> float:
        body = next(b for prompt, b in bodies.items() if tags[i] in prompt)
        return _failed_cost(provider, body, suite.request(suite.items[i]), str(3 * i + 1))

    def answer_cost(row: Outcome) -> float:  # prompt-cache reads and writes at their prices
        return (
            cand.input_cost_usd(
                row.input_tokens, row.cached_input_tokens or 0, row.cache_write_input_tokens or 0
            )
            + row.output_tokens * 2.0 / 1e6
        )

    assert (got["q00000"].attempts, got["q00000"].error_kind) == (2, None)
    assert got["q00000"].cost_usd == pytest.approx(cut(0) + answer_cost(got["q00000"]))
    assert (got["q00001"].attempts, got["q00001"].error_kind) == (3, "truncated_stream")
    assert got["q00001"].cost_usd == pytest.approx(3 * cut(1)) and cut(1) > 0
    # an HTTP 500 is refused before any generation: the retry's answer is all it cost
    assert got["q00002"].attempts == 2 and got["q00002"].cost_usd == pytest.approx(answer_cost(got["q00002"]))
    assert budget.spent() == pytest.approx(sum(r.cost_usd for r in rows)) and budget.reserved() == 0


async def test_retries_count_toward_the_cap(tmp_path, fake_llm, fake_candidate):
    """Every call streams its answer and is cut short: no item passes, yet each attempt is
    billed; the cap stops the calls, and the spend never exceeds it."""
    fake_llm.faults = FaultPlan({"truncated": 1.0})
    suite = load_suite(write_arithmetic_suite(tmp_path, 10))
    cand = fake_candidate(
        max_retries=3, max_concurrency=1, input_price_per_mtok=1000.0, output_price_per_mtok=1000.0
    )
    budget = Budget(run_usd=0.25)
    rows: list[Outcome] = []
    await evaluate_pair(
        suite, cand, "r", rows.extend, limits=limits(cand, failures=1000), retry=FAST, budget=budget
    )
    spent = sum(r.cost_usd or 0 for r in rows)
    assert budget.spent() == pytest.approx(spent) and 0.1 < spent <= 0.25
    assert {r.error_kind for r in rows} == {"truncated_stream", "budget"}
    assert sum(r.attempts for r in rows) == len(fake_llm.requests)
    assert [r for r in rows if r.error_kind == "budget"][-1].attempts == 0


async def test_a_timeout_mid_stream_costs_the_prompt_and_what_arrived(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 1))
    long_answer = " ".join(f"word{i}" for i in range(40))
    fake_llm.answer_fn = lambda prompt: long_answer
    fake_llm.token_delay_s = 0.05  # 40 pieces take 2 s; the candidate waits 0.6 s
    cand = fake_candidate(timeout_s=0.6, max_retries=0)
    budget = Budget(run_usd=1.0)
    rows: list[Outcome] = []
    await evaluate_pair(suite, cand, "r", rows.extend, limits=limits(cand), retry=FAST, budget=budget)
    (row,) = rows
    prompt = estimate_tokens(suite.request(suite.items[0]).prompt_text) * 1.0 / 1e6
    whole = prompt + math.ceil(len(long_answer) / 4) * 2.0 / 1e6
    assert row.error_kind == "timeout" and prompt < row.cost_usd < whole  # part of the answer came
    assert budget.spent() == pytest.approx(row.cost_usd)


async def test_only_the_probes_answer_decides_a_half_open_breaker():
    """A call sent before the breaker opened and failing late must not take the probe's place:
    the probe's success closes the breaker."""
    from routeopt.evals.providers.base import ProviderError

    now = [0.0]
    breaker = CircuitBreaker("x", failures=1, cooldown_s=1.0, clock=lambda: now[0])
    boom = ProviderError("server_error", "HTTP 500")
    straggler = await breaker.admit(10)  # let through while closed
    breaker.record(boom, await breaker.admit(10))  # opens
    now[0] = 1.5
    probe = await breaker.admit(10)
    assert probe.probe and not straggler.probe and breaker.state == "half_open"
    breaker.record(boom, straggler)  # the straggler's late failure
    breaker.record(None, probe)
    assert breaker.state == "closed" and breaker.down_since is None


async def test_the_breaker_says_when_it_opens_stays_down_closes_and_gives_up(caplog):
    """Each change of an endpoint's health is a warning at the moment it happens, with its
    reason: a run waiting on a dead endpoint is never silent."""
    import logging

    from routeopt.evals.providers.base import ProviderError

    now = [0.0]
    breaker = CircuitBreaker(
        "http://127.0.0.1:9/v1 (key $K)", failures=2, cooldown_s=30.0, clock=lambda: now[0]
    )
    refused = ProviderError("connection", "Connection error. (POST http://127.0.0.1:9/v1/chat/completions)")
    caplog.set_level(logging.WARNING, logger="routeopt.evals.execution.limits")
    breaker.record(refused, await breaker.admit(600))
    assert caplog.messages == []  # one failure is not an outage
    breaker.record(refused, await breaker.admit(600))
    now[0] = 31.0
    breaker.record(refused, await breaker.admit(600))  # the probe fails
    now[0] = 62.0
    breaker.record(None, await breaker.admit(600))  # the next probe answers
    breaker.record(refused, await breaker.admit(600))
    breaker.record(refused, await breaker.admit(600))  # down again
    now[0] = 700.0
    gave_up = [await breaker.admit(600), await breaker.admit(600)]
    assert all(a.refused for a in gave_up[1:]) and gave_up[0].probe  # a probe due still goes
    breaker.record(refused, gave_up[0])
    assert (await breaker.admit(600)).refused and (await breaker.admit(600)).refused
    assert caplog.messages[:3] == [
        "circuit breaker open for http://127.0.0.1:9/v1 (key $K) after 2 consecutive failures "
        "(last: connection: Connection error. (POST http://127.0.0.1:9/v1/chat/completions)); "
        "its calls wait for a probe every 30s",
        "http://127.0.0.1:9/v1 (key $K) is still down after 31s (probe: connection: Connection "
        "error. (POST http://127.0.0.1:9/v1/chat/completions)); next probe in 30s",
        "http://127.0.0.1:9/v1 (key $K) answers again after 62s down; its calls go on",
    ]
    assert caplog.messages[3].startswith("circuit breaker open for http://127.0.0.1:9/v1 (key $K)")
    assert caplog.messages[4:] == [
        "gave up waiting for http://127.0.0.1:9/v1 (key $K) after 638s down "
        "(circuit_breaker_max_wait_s); its remaining items are recorded as circuit_open, and "
        "resuming the run calls them again",  # said once, however many calls it refuses
        "http://127.0.0.1:9/v1 (key $K) is still down after 638s (probe: connection: Connection "
        "error. (POST http://127.0.0.1:9/v1/chat/completions)); next probe in 30s",
    ]


async def test_an_item_that_keeps_drawing_the_probe_stops_once_the_wait_is_over():
    """One item against an endpoint that never answers: it is the only caller, so it draws every
    probe. Failed probes spend no retries only while the endpoint has been down for less than
    the breaker's wait; after that the item ends with the error instead of probing for ever (a
    nightly once hung on it). The clock is the breaker's own, advanced by each attempt."""
    import asyncio

    from routeopt.evals.execution.calls import Caller
    from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request

    now = [0.0]

    class Down:
        calls = 0

        async def generate(self, request):
            Down.calls += 1
            now[0] += 1.0  # each attempt takes a second of the breaker's clock
            raise ProviderError("connection", "Connection refused")

    c = Candidate(
        name="down",
        provider="openai",
        model="m",
        base_url="http://127.0.0.1:9/v1",
        max_retries=0,
        input_price_per_mtok=1.0,
        output_price_per_mtok=1.0,
    )
    lim = EndpointLimits(RateLimiter(), CircuitBreaker("http://127.0.0.1:9/v1", 1, 0.0, clock=lambda: now[0]))
    lim.breaker.record(ProviderError("connection", "Connection refused"))  # down: the item's calls are probes
    caller = Caller(c, Down(), lim, None, FAST, max_wait_s=5.0)
    request = Request((Message("user", "2+2="),), GenerationSettings(max_tokens=4))
    result = await asyncio.wait_for(caller.call(request), 20)  # it looped for ever before
    assert result.error is not None and result.error.kind == "connection"
    assert 2 <= Down.calls <= 8  # probes while down < 5 s of its clock, then one that counts
