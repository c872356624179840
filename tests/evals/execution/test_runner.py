"""The runner end to end: real SDKs -> fake wire-protocol server -> grader -> sink / DuckDB."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from routeopt.evals.config import Candidate
from routeopt.evals.execution.budget import Budget
from routeopt.evals.execution.cache import ResponseCache
from routeopt.evals.execution.limits import CircuitBreaker, EndpointLimits, RateLimiter
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair, token_cost
from routeopt.evals.storage.store import Outcome, Store
from routeopt.evals.suite.spec import load_suite
from tests.fake_llm import FaultPlan, default_answer, fake_candidate, fake_llm, write_arithmetic_suite  # noqa: F401
from tests.leaks import hits_under

FAST = RetryPolicy(base_s=0.005, max_s=0.02)


def fresh_limits(c: Candidate, failures: int = 10, cooldown_s: float = 30.0) -> EndpointLimits:
    return EndpointLimits(
        RateLimiter(c.requests_per_minute, c.tokens_per_minute),
        CircuitBreaker(c.base_url or "", failures, cooldown_s),
    )


class Rows(list):
    """A sink that keeps rows, and checks each item arrives once."""

    def __call__(self, batch: list[Outcome]) -> None:
        self.extend(batch)

    def by_item(self) -> dict[str, Outcome]:
        out = {r.item_id: r for r in self}
        assert len(out) == len(self), "an item was written twice"
        return out


async def run(suite, cand, rows, **kw):
    kw.setdefault("limits", fresh_limits(cand))
    kw.setdefault("retry", FAST)
    return await evaluate_pair(suite, cand, "run-1", rows, **kw)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_grades_costs_and_sends_every_item_once(tmp_path, fake_llm, fake_candidate, provider):
    suite = load_suite(write_arithmetic_suite(tmp_path, 40))
    wrong = suite.request(suite.items[3]).messages[-1].content.strip()
    fake_llm.answers[wrong] = "999"
    cand = fake_candidate(provider, max_concurrency=8)
    rows = Rows()
    progress: list[int] = []
    stats = await run(suite, cand, rows, on_progress=progress.append, flush_every=7)
    got = rows.by_item()
    assert set(got) == {it.id for it in suite.items} and sum(progress) == 40
    assert (stats.completed, stats.errors, stats.calls) == (40, 0, 40), (
        stats,
        [(r.error_kind, r.error, r.attempts) for r in rows if r.attempts != 1],
    )
    assert [i for i, r in got.items() if not r.passed] == [suite.items[3].id]
    r = got[suite.items[0].id]
    assert (r.score, r.attempts, r.cached, r.error_kind) == (1.0, 1, False, None)
    assert r.input_tokens > 0 and r.output_tokens == 1 and r.ttft_s is not None
    assert r.suite_version == suite.version and r.candidate == cand.name
    # no cache prices are configured: OpenAI's cached input costs the input price, Anthropic's
    # reads 0.1x and writes 1.25x (whether the server reports this item's prefix as read or
    # written depends on which request it saw first)
    read, write = r.cached_input_tokens or 0, r.cache_write_input_tokens or 0
    x_read, x_write = (0.1, 1.25) if provider == "anthropic" else (1.0, 1.0)
    assert r.cost_usd == pytest.approx(
        ((r.input_tokens - read - write) + read * x_read + write * x_write + r.output_tokens * 2.0) / 1e6
    )
    assert len(fake_llm.requests) == 40


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_a_server_that_answers_streams_with_json_is_recorded_not_broken(
    tmp_path, fake_llm, fake_candidate, provider
):
    """LiteLLM's proxy answers a streamed Anthropic request with one JSON message: every item is
    an answer with TTFT unknown (NULL in DuckDB, streamed false), and the breaker stays shut."""
    fake_llm.stream_as_json = True
    suite = load_suite(write_arithmetic_suite(tmp_path, 30))
    cand = fake_candidate(provider, max_concurrency=4, stream=True, circuit_breaker_failures=3)
    store = Store(tmp_path / "o.duckdb")
    stats = await run(suite, cand, store.write_outcomes, limits=fresh_limits(cand, failures=3))
    assert (stats.completed, stats.errors, stats.calls) == (30, 0, 30), stats.error_kinds
    rows = store.query(
        "SELECT passed, error_kind, ttft_s IS NULL AS no_ttft, tpot_s IS NULL AS "
        "no_tpot, latency_s, streamed, output_tokens FROM outcomes"
    ).to_dict("records")
    store.close()
    assert all(r["stream"] is True for r in (rec.body for rec in fake_llm.requests))
    assert len(rows) == 30 and all(r["passed"] and r["error_kind"] is None for r in rows)
    assert all(r["streamed"] is False and r["output_tokens"] == 1 and r["latency_s"] > 0 for r in rows)
    assert all(r["no_ttft"] and r["no_tpot"] for r in rows)


async def test_done_items_are_skipped(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 10))
    done = [it.id for it in suite.items[:6]]
    rows = Rows()
    stats = await run(suite, fake_candidate(), rows, done=done)
    assert stats.skipped_done == 6 and sorted(rows.by_item()) == [it.id for it in suite.items[6:]]
    assert len(fake_llm.requests) == 4


async def test_retries_recover_and_count_attempts(tmp_path, fake_llm, fake_candidate):
    tags = {
        0: "[[fault:server_error*2]]",
        1: "[[fault:drop*1]]",
        2: "[[fault:truncated*3]]",
        3: "[[fault:malformed*1]]",
        4: "[[fault:unavailable*1]]",
    }
    suite = load_suite(write_arithmetic_suite(tmp_path, 6, tags=lambda i: tags.get(i, "")))
    rows = Rows()
    await run(suite, fake_candidate(max_retries=4), rows)
    got = rows.by_item()
    assert [got[f"q{i:05d}"].attempts for i in range(6)] == [3, 2, 4, 2, 2, 1]
    assert all(r.passed and r.error_kind is None for r in rows)
    assert len(fake_llm.requests) == 3 + 2 + 4 + 2 + 2 + 1


async def test_retry_after_is_honoured(tmp_path, fake_llm, fake_candidate):
    fake_llm.faults = FaultPlan(retry_after_s=0.4)
    suite = load_suite(write_arithmetic_suite(tmp_path, 1, tags=lambda i: "[[fault:rate_limit*1]]"))
    rows = Rows()
    await run(suite, fake_candidate(), rows)
    first, second = fake_llm.requests
    assert second.t - first.t >= 0.38
    assert rows[0].passed and rows[0].attempts == 2


async def test_exhausted_and_non_retryable_errors_are_recorded(tmp_path, fake_llm, fake_candidate):
    tags = {0: "[[fault:server_error]]", 1: "[[fault:bad_request]]", 2: "[[fault:hang]]"}
    suite = load_suite(write_arithmetic_suite(tmp_path, 4, tags=lambda i: tags.get(i, "")))
    rows = Rows()
    stats = await run(suite, fake_candidate(max_retries=2, timeout_s=0.3), rows)
    got = rows.by_item()
    assert (got["q00000"].error_kind, got["q00000"].attempts) == ("server_error", 3)
    assert (got["q00001"].error_kind, got["q00001"].attempts) == ("client_error", 1)
    assert (got["q00002"].error_kind, got["q00002"].attempts) == ("timeout", 3)
    assert "HTTP 500" in got["q00000"].error and got["q00000"].passed is None
    assert got["q00003"].passed
    assert stats.errors == 3 and stats.error_kinds == {"server_error": 1, "client_error": 1, "timeout": 1}


async def test_breaker_half_opens_after_cooldown_and_closes_on_success(tmp_path, fake_llm, fake_candidate):
    now = [0.0]
    breaker = CircuitBreaker("x", failures=2, cooldown_s=10, clock=lambda: now[0])
    from routeopt.evals.providers.base import ProviderError

    boom = ProviderError("server_error", "HTTP 500")
    breaker.record(boom)
    assert breaker.check() is None
    breaker.record(boom)
    assert breaker.state == "open" and "2 consecutive failures" in breaker.check()
    now[0] = 10.5
    assert breaker.check() is None and breaker.state == "half_open"  # the probe
    assert breaker.check() is not None  # only one probe at a time
    breaker.record(boom)
    assert breaker.state == "open"
    now[0] = 21.0
    assert breaker.check() is None
    breaker.record(None)
    assert breaker.state == "closed" and breaker.check() is None
    breaker.record(ProviderError("rate_limited", "429"))  # a live endpoint: not a failure
    assert breaker.consecutive == 0


async def test_rpm_limit_spreads_requests(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 30))
    cand = fake_candidate(max_concurrency=30, requests_per_minute=1200)  # 20/s, burst 20
    t0 = time.time()
    await run(suite, cand, Rows())
    times = sorted(r.t for r in fake_llm.requests)
    assert times[-1] - t0 >= 0.45  # the last 10 go beyond the burst, at 20/s


def test_token_bucket_tpm_with_refunds():
    now = [0.0]
    lim = RateLimiter(tpm=600, clock=lambda: now[0])  # 10 tokens/s, burst 10
    assert lim.reserve(10) == 0.0
    assert lim.reserve(20) == pytest.approx(2.0)  # 20 tokens in debt at 10/s
    lim.refund(15)
    now[0] = 0.6  # +6 tokens: level back to 1
    assert lim.reserve(1) == 0.0 and RateLimiter().active is False


async def test_another_runs_answers_are_replayed_only_when_asked_and_young(
    tmp_path, fake_llm, fake_candidate
):
    suite = load_suite(write_arithmetic_suite(tmp_path, 12))
    cand = fake_candidate()
    first, second, replayed = Rows(), Rows(), Rows()
    await evaluate_pair(suite, cand, "run-a", first, cache=tmp_path / "cache", limits=fresh_limits(cand))
    # by default another run measures the model again: tonight's answers, not yesterday's
    stats = await evaluate_pair(
        suite, cand, "run-b", second, cache=tmp_path / "cache", limits=fresh_limits(cand)
    )
    assert len(fake_llm.requests) == 24 and stats.cached == 0 and stats.calls == 12
    assert not any(r.cached for r in second)
    # a development run that opts in replays answers up to the age it names
    stats = await evaluate_pair(
        suite,
        cand,
        "run-c",
        replayed,
        cache=tmp_path / "cache",
        cache_max_age_s=3600,
        limits=fresh_limits(cand),
    )
    assert len(fake_llm.requests) == 24 and stats.cached == 12 and stats.calls == 0
    b, c = second.by_item(), replayed.by_item()
    for item_id, row in c.items():
        assert row.cached and row.attempts == 0 and row.passed
        assert (row.input_tokens, row.latency_s) == (b[item_id].input_tokens, b[item_id].latency_s)
        # cost_usd is what the answer costs at list price (what training learns from); the run
        # paid nothing for it, which `cached` records and spend accounting honours
        assert row.cost_usd == b[item_id].cost_usd > 0
    # two hours later the same answers are too old for a one-hour limit
    later = ResponseCache(tmp_path / "cache", max_age_s=3600, clock=lambda: time.time() + 7200)
    stats = await evaluate_pair(suite, cand, "run-d", Rows(), cache=later, limits=fresh_limits(cand))
    assert len(fake_llm.requests) == 36 and stats.cached == 0
    later.close()


async def test_two_candidates_of_one_model_each_measure_their_own_answers(tmp_path, fake_llm, fake_candidate):
    """The same model under two names (a second endpoint, a speculative twin) is called for each:
    within a run the cache gives a candidate back only its own answers."""
    suite = load_suite(write_arithmetic_suite(tmp_path, 6))
    one = fake_candidate()
    twin = one.model_copy(update={"name": f"{one.name}-twin"})
    for cand in (one, twin):
        stats = await evaluate_pair(
            suite, cand, "run-t", Rows(), cache=tmp_path / "cache", limits=fresh_limits(cand)
        )
        assert stats.calls == 6 and stats.cached == 0
    assert len(fake_llm.requests) == 12


async def test_a_resumed_run_takes_back_its_own_unflushed_answers(tmp_path, fake_llm, fake_candidate):
    """Answers finished before a kill but never flushed: the resumed run neither waits nor pays
    for them again, records them as its own measurements and books what they cost."""
    suite = load_suite(write_arithmetic_suite(tmp_path, 10))
    cand = fake_candidate()
    lost = Rows()  # the rows a killed run never wrote
    await evaluate_pair(suite, cand, "run-k", lost, cache=tmp_path / "cache", limits=fresh_limits(cand))
    budget = Budget(run_usd=1.0)
    resumed = Rows()
    stats = await evaluate_pair(
        suite, cand, "run-k", resumed, cache=tmp_path / "cache", budget=budget, limits=fresh_limits(cand)
    )
    assert len(fake_llm.requests) == 10 and stats.calls == 0
    before = lost.by_item()
    for item_id, row in resumed.by_item().items():
        assert not row.cached and row.attempts == before[item_id].attempts == 1
        assert (row.latency_s, row.cost_usd) == (before[item_id].latency_s, before[item_id].cost_usd)
    assert budget.spent() == pytest.approx(sum(r.cost_usd for r in lost)) and budget.spent() > 0
    # the same run id in another store is another run: it measures for itself
    await evaluate_pair(
        suite,
        cand,
        "run-k",
        Rows(),
        cache=tmp_path / "cache",
        cache_scope="other.duckdb#run-k",
        limits=fresh_limits(cand),
    )
    assert len(fake_llm.requests) == 20


def test_cache_ages_and_their_errors():
    from routeopt.evals.execution.cache import format_age, parse_age

    assert [parse_age(a) for a in ("90s", "30m", "12h", "1d", "1.5d", "2w")] == [
        90,
        1800,
        43200,
        86400,
        129600,
        1209600,
    ]
    assert [format_age(s) for s in (86400, 5400, 1209600, 45)] == ["1d", "90m", "2w", "45s"]
    with pytest.raises(ValueError, match="give a number and a unit"):
        parse_age("yesterday")
    with pytest.raises(ValueError, match="longer than the cache keeps answers"):
        parse_age("60d")


async def test_sampling_settings_are_not_cached(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 5, temperature=0.7))
    cand = fake_candidate()
    for run_id in ("r1", "r2"):
        await evaluate_pair(suite, cand, run_id, Rows(), cache=tmp_path / "c", limits=fresh_limits(cand))
    assert len(fake_llm.requests) == 10 and len(ResponseCache(tmp_path / "c")) == 0


async def test_grader_errors_are_recorded(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 3))

    async def broken(response, item):
        raise RuntimeError("grader exploded")

    object.__setattr__(suite.grader, "grade", broken)
    rows = Rows()
    stats = await run(suite, fake_candidate(), rows)
    assert {r.error_kind for r in rows} == {"grader_error"} and stats.errors == 3
    assert "grader exploded" in rows[0].error and rows[0].response == rows[0].response.strip()


async def test_gpu_priced_candidate_shares_the_window(tmp_path, fake_llm, fake_candidate):
    fake_llm.first_token_delay_s = 0.02
    suite = load_suite(write_arithmetic_suite(tmp_path, 16))
    cand = fake_candidate(
        input_price_per_mtok=None, output_price_per_mtok=None, gpu_hour_usd=3.6, utilization=0.5
    )
    rows = Rows()
    t0 = time.perf_counter()
    stats = await run(suite, cand, rows, flush_every=4)
    wall = time.perf_counter() - t0
    total = sum(r.cost_usd for r in rows)
    # $3.6/h = $0.001/s, at 50% utilisation every served second costs $0.002
    assert 0.002 * stats.wall_s * 0.5 <= total <= 0.002 * wall * 1.01
    assert all(r.cost_usd > 0 for r in rows) and token_cost(cand, _completion()) is None


async def test_a_gpu_priced_at_a_stated_throughput_costs_its_tokens(tmp_path, fake_llm, fake_candidate):
    """gpu_tokens_per_s: every call costs its tokens at the GPU-hour price over that throughput,
    whatever the run's own speed: $3.6/h over 1,000 tok/s at 50% utilisation is $2 per Mtok.
    Prompt tokens read from a prefix cache are not computed again, so they cost nothing."""
    fake_llm.first_token_delay_s = 0.02
    suite = load_suite(write_arithmetic_suite(tmp_path, 8))
    cand = fake_candidate(
        input_price_per_mtok=None,
        output_price_per_mtok=None,
        gpu_hour_usd=3.6,
        gpu_tokens_per_s=1000,
        utilization=0.5,
    )
    rows = Rows()
    await run(suite, cand, rows, flush_every=4)
    assert not cand.gpu_metered and cand.token_prices() == pytest.approx((2.0, 2.0))
    assert any(r.cached_input_tokens for r in rows)  # the fake server reports a cached prefix
    for r in rows:
        computed = r.input_tokens - (r.cached_input_tokens or 0) + r.output_tokens
        assert r.cost_usd == pytest.approx(computed * 2.0 / 1e6)
    assert token_cost(cand, _completion()) == pytest.approx(4e-6)


def _completion():
    from routeopt.evals.providers.base import Completion

    return Completion("x", "stop", 1, 1)


async def test_budget_cap_records_budget_rows(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(write_arithmetic_suite(tmp_path, 20))
    cand = fake_candidate(max_concurrency=1, input_price_per_mtok=1000.0, output_price_per_mtok=1000.0)
    rows = Rows()
    stats = await run(suite, cand, rows, budget=Budget(run_usd=0.1))
    kinds = {r.error_kind for r in rows}
    assert kinds == {None, "budget"} and stats.completed == 20
    assert sum(r.cost_usd or 0 for r in rows) <= 0.1
    assert len(fake_llm.requests) == sum(r.error_kind is None for r in rows)


async def test_api_key_never_reaches_db_logs_errors_or_cache(
    tmp_path, fake_llm, fake_candidate, monkeypatch, caplog
):
    secret = "sk-planted-secret-0123456789"
    monkeypatch.setenv("ROUTEOPT_TEST_KEY", secret)
    caplog.set_level(logging.DEBUG)
    suite = load_suite(write_arithmetic_suite(tmp_path, 6))
    db = tmp_path / "out.duckdb"
    with Store(db) as store:
        for provider in ("openai", "anthropic"):
            cand = fake_candidate(provider, api_key_env="ROUTEOPT_TEST_KEY", name=f"c-{provider}")
            fake_llm.expect_api_key = secret  # right key: answers, cached
            store.begin_run(f"ok-{provider}", candidates=[cand.public_dict()])
            await evaluate_pair(
                suite,
                cand,
                f"ok-{provider}",
                store.write_outcomes,
                cache=tmp_path / "cache",
                limits=fresh_limits(cand),
            )
            fake_llm.expect_api_key = "something-else"  # server echoes the wrong key back
            await evaluate_pair(
                suite, cand, f"bad-{provider}", store.write_outcomes, limits=fresh_limits(cand)
            )
        errors = store.query("SELECT error FROM outcomes WHERE error_kind = 'auth'")
    assert len(errors) == 12 and errors.error.str.contains("Incorrect API key").all()
    sent = {
        r.headers.get("x-api-key") or r.headers["authorization"].removeprefix("Bearer ")
        for r in fake_llm.requests
    }
    assert sent == {secret}  # the key reached the server on every call...
    assert hits_under([tmp_path], secret) == []  # ...and nothing the runs wrote holds it
    assert f"{db}:outcomes.error" in hits_under([db], "Incorrect API key")  # the search sees rows
    assert secret not in caplog.text and "0123456789" not in caplog.text


def test_shared_limits_follow_candidate_fields(fake_candidate):
    from routeopt.evals.execution.limits import reset_shared_limits, shared_limits

    reset_shared_limits()
    cand = fake_candidate(circuit_breaker_failures=3, circuit_breaker_cooldown_s=5, requests_per_minute=60)
    a, b = (
        shared_limits(cand, breaker_failures=3, breaker_cooldown_s=5),
        shared_limits(cand, breaker_failures=3, breaker_cooldown_s=5),
    )
    assert a.breaker is b.breaker and a.limiter is b.limiter  # shared across pairs in a process
    assert (a.breaker.failures, a.breaker.cooldown_s, a.limiter.active) == (3, 5, True)
    reset_shared_limits()


async def test_cancelled_run_flushes_finished_items_and_resumes(tmp_path, fake_llm, fake_candidate):
    import asyncio

    fake_llm.first_token_delay_s = 0.05
    suite = load_suite(write_arithmetic_suite(tmp_path, 40))
    cand = fake_candidate(max_concurrency=4)
    rows = Rows()
    task = asyncio.ensure_future(run(suite, cand, rows, flush_every=5))
    while len(fake_llm.requests) < 12:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    first = set(rows.by_item())
    assert 8 <= len(first) < 40  # finished calls were flushed although the batch was not full
    await run(suite, cand, rows, done=first)
    assert sorted(rows.by_item()) == [it.id for it in suite.items]
    assert all(r.passed for r in rows)


async def test_concurrent_pairs_on_one_gpu_share_its_time(tmp_path, fake_llm, fake_candidate):
    import asyncio

    fake_llm.first_token_delay_s = 0.05
    suites = [load_suite(write_arithmetic_suite(tmp_path / n, 12, name=n)) for n in ("s-one", "s-two")]
    cand = fake_candidate(
        input_price_per_mtok=None, output_price_per_mtok=None, gpu_hour_usd=3.6, max_concurrency=2
    )
    rows = Rows()
    t0 = time.perf_counter()
    await asyncio.gather(
        *(evaluate_pair(s, cand, "run-g", rows, limits=fresh_limits(cand), flush_every=3) for s in suites)
    )
    wall = time.perf_counter() - t0
    total = sum(r.cost_usd for r in rows)
    assert len(rows) == 24 and all(r.cost_usd > 0 for r in rows)
    assert 0.001 * wall * 0.6 <= total <= 0.001 * wall * 1.01  # charged once, not per pair


class FlakySink(Rows):
    """A store whose writes fail: `fail(n)` says whether the n-th write (from 1) raises."""

    def __init__(self, fail):
        super().__init__()
        self.fail, self.writes = fail, 0

    def __call__(self, batch: list[Outcome]) -> None:
        self.writes += 1
        if self.fail(self.writes):
            import duckdb

            raise duckdb.IOException("IO Error: could not write file: No space left on device")
        self.extend(batch)


async def test_a_write_that_keeps_failing_fails_the_pair_and_keeps_its_rows(
    tmp_path, fake_llm, fake_candidate, monkeypatch
):
    from routeopt.evals.execution.runner import FlushError, _Flusher

    monkeypatch.setattr(_Flusher, "RETRY_DELAYS_S", (0.0, 0.01), raising=False)
    fake_llm.first_token_delay_s = 0.01
    suite = load_suite(write_arithmetic_suite(tmp_path, 60))
    sink = FlakySink(lambda n: n > 1)  # the first batch is written, then the disk is full
    with pytest.raises(FlushError, match="not complete, resume it") as info:
        await run(suite, fake_candidate(max_concurrency=2), sink, flush_every=5)
    kept = info.value.rows
    assert len(sink) == 5 and kept and not {r.item_id for r in kept} & {r.item_id for r in sink}
    called = len(fake_llm.requests)
    assert called < 60  # the pair stopped starting items
    assert len(sink) + len(kept) == called  # every answer is written or handed back, none lost
    assert sink.writes >= 1 + 3  # the failed write was retried


async def test_a_write_that_fails_then_succeeds_loses_nothing(
    tmp_path, fake_llm, fake_candidate, monkeypatch
):
    from routeopt.evals.execution.runner import _Flusher

    monkeypatch.setattr(_Flusher, "RETRY_DELAYS_S", (0.0, 0.0), raising=False)
    suite = load_suite(write_arithmetic_suite(tmp_path, 30))
    sink = FlakySink(lambda n: n in (2, 3))  # one batch fails twice, then goes through
    stats = await run(suite, fake_candidate(max_concurrency=2), sink, flush_every=5)
    assert sorted(sink.by_item()) == [it.id for it in suite.items] and stats.completed == 30


async def test_co_located_gpu_candidates_are_measured_one_at_a_time(tmp_path, fake_llm, fake_candidate):
    """Two GPU-priced candidates served from one box (one base URL): run side by side, as the
    nightly runs candidates, they take the device in turn, and each pays for its own time."""
    import asyncio

    from routeopt.evals.execution.limits import reset_shared_limits

    reset_shared_limits()
    fake_llm.first_token_delay_s = 0.03
    suite = load_suite(write_arithmetic_suite(tmp_path, 12))
    cands = [
        fake_candidate(
            name=f"gpu-{x}",
            model=f"model-{x}",
            input_price_per_mtok=None,
            output_price_per_mtok=None,
            gpu_hour_usd=3.6,
            max_concurrency=2,
        )
        for x in "ab"
    ]
    rows = Rows()
    t0 = time.perf_counter()
    stats = await asyncio.gather(
        *(
            asyncio.to_thread(
                asyncio.run,
                evaluate_pair(suite, c, "run-d", rows, limits=fresh_limits(c), retry=FAST, flush_every=4),
            )
            for c in cands
        )
    )
    wall = time.perf_counter() - t0
    spans = [[r.t for r in fake_llm.requests if r.body["model"] == c.model] for c in cands]
    first, second = sorted(spans, key=min)
    assert len(first) == len(second) == 12 and max(first) < min(second)  # never at the same time
    cost = {c.name: sum(r.cost_usd for r in rows if r.candidate == c.name) for c in cands}
    for c, s in zip(cands, stats):  # $3.6/h = $0.001 per second of its own time on the device
        assert 0.001 * s.wall_s * 0.9 <= cost[c.name] <= 0.001 * (s.wall_s + 0.2)
    assert sum(cost.values()) <= 0.001 * wall * 1.01  # the device's time is charged once
    reset_shared_limits()


def test_co_location_is_by_device_or_server():
    from routeopt.evals.execution.limits import device_of

    def local(device: str, name: str = "l") -> Candidate:
        return Candidate(name=name, provider="local", model="m", device=device, gpu_hour_usd=1.0)

    assert device_of(local("cuda")) == device_of(local("cuda:0")) == "local:cuda:0"
    assert device_of(local("cuda:1")) != device_of(local("cuda:0"))
    assert device_of(local("auto")) in ("local:cpu", "local:cuda:0")
    server = dict(provider="openai", model="m", gpu_hour_usd=2.0)
    assert device_of(Candidate(name="a", base_url="http://gpu1:8000/v1", **server)) == device_of(
        Candidate(name="b", base_url="http://gpu1:8000/v1/", **server)
    )
    assert (
        device_of(Candidate(name="c", base_url="http://gpu2:8000/v1", **server))
        == "server:http://gpu2:8000/v1"
    )
    assert device_of(Candidate(name="api", provider="openai", model="m", input_price_per_mtok=1)) is None


async def test_gpu_budget_ends_at_what_the_windows_cost(tmp_path, fake_llm, fake_candidate):
    fake_llm.first_token_delay_s = 0.02
    suite = load_suite(write_arithmetic_suite(tmp_path, 16))
    cand = fake_candidate(
        input_price_per_mtok=None, output_price_per_mtok=None, gpu_hour_usd=3.6, max_concurrency=4
    )
    budget = Budget(run_usd=100.0)
    rows = Rows()
    await run(suite, cand, rows, flush_every=4, budget=budget)
    total = sum(r.cost_usd for r in rows)
    assert total > 0 and budget.spent(cand.name) == pytest.approx(total)


def _judged_suite(tmp_path: Path, server, n: int, judge_cap: float | None = None):
    import json

    from routeopt.evals.config import Config

    path = write_arithmetic_suite(tmp_path, n)
    spec = json.loads(path.read_text())
    spec["grader"] = {
        "type": "judge",
        "candidate": "judge",
        "max_tokens": 64,
        "rubric": "Grade the answer {{ response }} to {{ a }} + {{ b }} (reference {{ answer }}).",
    }
    path.write_text(json.dumps(spec))
    server.answer_fn = lambda p: (
        "Correct.\nSCORE: 9" if p.startswith("Grade the answer") else default_answer(p)
    )
    common = dict(provider="openai", base_url=server.openai_base_url, timeout_s=10, max_retries=2)
    cfg = Config(
        candidates=[
            Candidate(
                name="model",
                model="model",
                input_price_per_mtok=1.0,
                output_price_per_mtok=2.0,
                max_concurrency=1,
                **common,
            ),
            Candidate(
                name="judge",
                model="judge-model",
                input_price_per_mtok=3.0,
                output_price_per_mtok=15.0,
                **common,
            ),
        ]
    )
    return load_suite(path, config=cfg), cfg


async def test_judge_calls_are_recorded_and_budgeted_against_the_judge(tmp_path, fake_llm):
    from tests.fake_llm import _prompt_of, count_tokens

    suite, cfg = _judged_suite(tmp_path, fake_llm, 12)
    budget = Budget(per_candidate_usd={"judge": 0.002})  # room for a few judge calls only
    rows = Rows()
    stats = await run(suite, cfg.candidate("model"), rows, budget=budget)
    got = [rows.by_item()[it.id] for it in suite.items]
    judged = [r for r in got if r.error_kind is None]
    skipped = [r for r in got if r.error_kind == "budget"]
    assert judged and skipped and len(judged) + len(skipped) == 12
    assert all(r.passed and r.reason.startswith("judge 9/10") for r in judged)
    assert all(
        "grader's model call failed" in r.error and "candidate 'judge' is capped" in r.error for r in skipped
    )
    to_judge = [r for r in fake_llm.requests if r.body["model"] == "judge-model"]
    assert len(to_judge) == len(judged) == stats.judge_calls  # the cap stopped the judge's calls
    for r, sent in zip(judged, to_judge):
        assert r.judge_candidate == "judge" and r.judge_input_tokens == count_tokens(
            _prompt_of("", sent.body)
        )
        assert r.judge_output_tokens == 3 and r.judge_cost_usd == pytest.approx(
            (r.judge_input_tokens * 3.0 + r.judge_output_tokens * 15.0) / 1e6
        )
    judge_spend = sum(r.judge_cost_usd for r in judged)
    assert budget.spent("judge") == pytest.approx(judge_spend) and judge_spend <= 0.002
    assert budget.spent("model") == pytest.approx(sum(r.cost_usd for r in got))
    assert all(r.judge_cost_usd == 0 for r in skipped)  # refused before it was sent


async def test_judge_calls_share_the_judge_breaker_and_retries(tmp_path, fake_llm, monkeypatch):
    """The judge's endpoint fails twice: the runner's retries (not the judge's own) recover, and
    the failures count on the breaker of the judge's endpoint and key."""
    from routeopt.evals.execution.limits import reset_shared_limits, shared_limits

    reset_shared_limits()
    suite, cfg = _judged_suite(tmp_path, fake_llm, 3)
    judge = cfg.candidate("judge")
    failures = [0]
    original = fake_llm.faults.choose

    def choose(prompt: str, attempt: int):
        if prompt.startswith("You are a strict") and failures[0] < 2:  # the judge's system prompt
            failures[0] += 1
            return "server_error"
        return original(prompt, attempt)

    monkeypatch.setattr(fake_llm.faults, "choose", choose)
    rows = Rows()
    await run(suite, cfg.candidate("model"), rows)
    assert all(r.passed for r in rows) and failures[0] == 2
    first = rows.by_item()[suite.items[0].id]
    assert first.judge_cost_usd is not None
    breaker = shared_limits(
        judge,
        breaker_failures=judge.circuit_breaker_failures,
        breaker_cooldown_s=judge.circuit_breaker_cooldown_s,
    ).breaker
    assert breaker.last_error.startswith("server_error")
    reset_shared_limits()
