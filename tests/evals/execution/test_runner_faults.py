"""Fault injection: 200-item suites through seeded fault mixes, via both SDKs, and a run killed
with SIGKILL and resumed. Invariants: no crash, no duplicate, no lost item, counts add up, every
error row says what happened, and the calls the server saw are exactly the attempts recorded.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from collections import defaultdict
from pathlib import Path

import pytest

from routeopt.evals.config import Candidate
from routeopt.evals.execution.limits import CircuitBreaker, EndpointLimits, RateLimiter
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
from routeopt.evals.providers.base import RETRYABLE
from routeopt.evals.storage.store import Outcome, Store
from routeopt.evals.suite.spec import load_suite
from tests import REPO
from tests.fake_llm import FakeLLM, FaultPlan, default_answer, fake_llm, write_arithmetic_suite  # noqa: F401

# 200-item runs through the real SDKs take 5-30 s each on a busy 2-core machine.
pytestmark = pytest.mark.slow
N = 200
MIXES = {
    "transient": {
        "rate_limit": 0.08,
        "server_error": 0.08,
        "unavailable": 0.04,
        "drop": 0.05,
        "malformed": 0.04,
        "truncated": 0.05,
        "slow_first": 0.04,
    },
    "hangs_and_answers": {"hang": 0.04, "slow_first": 0.08, "empty": 0.08, "no_choices": 0.05, "drop": 0.03},
    # (a refused key stops its pair: see test_a_key_revoked_mid_run_stops_the_pair_then_resumes)
    "hard": {"bad_request": 0.06, "server_error": 0.25, "overloaded": 0.05},
}
FAULT_KIND = {
    "rate_limit": "rate_limited",
    "server_error": "server_error",
    "unavailable": "server_error",
    "overloaded": "server_error",
    "auth": "auth",
    "bad_request": "client_error",
    "drop": "connection",
    "hang": "timeout",
    "malformed": "bad_response",
    "no_choices": "bad_response",
}


def candidate(server: FakeLLM, provider: str, **kw) -> Candidate:
    base = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    spec = dict(
        name=f"c-{provider}",
        provider=provider,
        model="m",
        base_url=base,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
        max_concurrency=16,
        timeout_s=1.5,
        max_retries=3,
    )
    return Candidate(**{**spec, **kw})


def check_invariants(
    suite,
    rows: list[Outcome],
    stats,
    server: FakeLLM,
    cand: Candidate,
    stream: bool,
    breaker: CircuitBreaker | None = None,
):
    by_item = {r.item_id: r for r in rows}
    assert len(by_item) == len(rows), "duplicate outcome"
    assert set(by_item) == {it.id for it in suite.items}, "lost item"
    assert stats.completed == N and stats.errors == sum(r.error_kind is not None for r in rows)
    assert sum(stats.error_kinds.values()) == stats.errors
    records = server.settle(stats.calls)
    sent: dict[str, list] = defaultdict(list)
    for rec in records:
        sent[rec.body["messages"][-1]["content"]].append(rec)
    assert sum(r.attempts for r in rows) == len(records) == stats.calls
    fault_kind = {**FAULT_KIND, "truncated": "truncated_stream" if stream else "connection"}
    for item in suite.items:
        row = by_item[item.id]
        calls = sorted(sent[suite.request(item).messages[-1].content], key=lambda r: r.attempt)
        assert len(calls) == row.attempts
        last = calls[-1].fault if calls else None
        if row.error_kind is None:
            assert row.score is not None and row.response is not None
            no_answer = last == "empty" or (last == "no_choices" and not stream)
            assert row.passed is (last != "empty"), (item.id, last, row.response)
            assert not no_answer or last == "empty"
        elif row.error_kind == "circuit_open":
            assert "circuit open" in row.error and "consecutive failures" in row.error
        else:
            assert row.error and row.passed is None
            assert row.error_kind == fault_kind[last], (item.id, last, row.error_kind, row.error)
            if row.error_kind in RETRYABLE and not (breaker and breaker.times_opened):
                assert row.attempts == cand.max_retries + 1  # (failed probes are not retries)


@pytest.mark.parametrize("mix", sorted(MIXES))
@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_fault_mix_streamed(tmp_path, fake_llm, provider, mix):
    await _run_mix(tmp_path, fake_llm, provider, mix, stream=True)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
async def test_fault_mix_plain_into_duckdb(tmp_path, fake_llm, provider):
    await _run_mix(tmp_path, fake_llm, provider, "hangs_and_answers", stream=False, db=True)


async def _run_mix(tmp_path, server: FakeLLM, provider: str, mix: str, *, stream: bool, db: bool = False):
    server.faults = FaultPlan(MIXES[mix], seed=7, retry_after_s=0.01, slow_first_s=0.2)
    suite = load_suite(write_arithmetic_suite(tmp_path, N))
    # A client timeout far above what an answer takes on a loaded machine (an attempt that timed
    # out before the server read it would be one call the server never saw), and below the
    # plan's hangs (30 s), which must time out.
    cand = candidate(server, provider, timeout_s=10.0 if "hang" in MIXES[mix] else 60.0)
    from routeopt.evals.providers import make_provider

    prov = make_provider(cand)
    prov.stream = stream
    limits = EndpointLimits(RateLimiter(), CircuitBreaker(cand.base_url, failures=10))
    rows: list[Outcome] = []
    store = Store(tmp_path / "o.duckdb") if db else None
    sink = store.write_outcomes if store else rows.extend
    try:
        stats = await evaluate_pair(
            suite,
            cand,
            "run-f",
            sink,
            provider=prov,
            limits=limits,
            retry=RetryPolicy(base_s=0.005, max_s=0.02),
            flush_every=16,
        )
    finally:
        await prov.aclose()
    if store:
        frame = store.query("SELECT * FROM outcomes WHERE run_id = 'run-f'")
        store.close()
        rows = [
            Outcome(**{k: (None if _isnull(v) else v) for k, v in rec.items()})
            for rec in frame.to_dict("records")
        ]
    check_invariants(suite, rows, stats, server, cand, stream, limits.breaker)
    kinds = {r.error_kind for r in rows}
    assert None in kinds  # the mixes leave most items answerable
    if mix == "hard":
        assert {"client_error", "server_error"} <= kinds


class _AuthWatchingBreaker(CircuitBreaker):
    """The breaker's consecutive-fault count right after each refused key it was told of."""

    def __init__(self, *args, **kw) -> None:
        super().__init__(*args, **kw)
        self.after_auth: list[int] = []

    def record(self, error, admission=None) -> None:
        super().record(error, admission)
        if error is not None and error.kind == "auth":
            self.after_auth.append(self.consecutive)


async def test_a_key_revoked_mid_run_stops_the_pair_then_resumes(tmp_path, fake_llm, monkeypatch):
    """The key is revoked after 60 answers: the pair stops calling (no 401 per remaining item),
    every item still has exactly one row, and with the new key the resumed run finishes all."""
    monkeypatch.setenv("ROTATED_KEY", "sk-old-key-000000")
    fake_llm.expect_api_key = "sk-old-key-000000"
    # faults that are answers of a live endpoint: only the 401s could open this breaker
    fake_llm.faults = FaultPlan(
        {"rate_limit": 0.1, "slow_first": 0.05, "empty": 0.05}, seed=5, retry_after_s=0.01, slow_first_s=0.05
    )
    answered = [0]

    def answer(prompt: str) -> str:
        answered[0] += 1
        if answered[0] == 60:
            fake_llm.expect_api_key = "sk-new-key-111111"
        return default_answer(prompt)

    fake_llm.answer_fn = answer
    suite = load_suite(write_arithmetic_suite(tmp_path, N))
    # no hang in this plan: a client timeout could only come from a busy machine, and would make
    # an attempt the server never recorded
    cand = candidate(fake_llm, "openai", api_key_env="ROTATED_KEY", timeout_s=60)
    breaker = _AuthWatchingBreaker(cand.base_url, failures=3)
    limits = EndpointLimits(RateLimiter(), breaker)
    with Store(tmp_path / "o.duckdb") as store:
        stats = await evaluate_pair(
            suite,
            cand,
            "run-a",
            store.write_outcomes,
            limits=limits,
            retry=RetryPolicy(base_s=0.005, max_s=0.02),
            flush_every=16,
        )
        rows = _stored(store)
        assert len(rows) == N and len({r.item_id for r in rows}) == N and stats.completed == N
        assert sum(r.attempts for r in rows) == len(fake_llm.settle(stats.calls)) == stats.calls
        refused = [r for r in rows if r.error_kind == "auth"]
        assert stats.halted and len(refused) > N / 2
        # A wave of 401s (up to max_concurrency in flight) would open a 3-failure breaker if
        # they counted; they are answers of a live endpoint and reset the count instead. (On a
        # loaded machine a call may still time out: that is an endpoint fault and may count.)
        assert breaker.after_auth and set(breaker.after_auth) == {0}
        assert sum(r.attempts > 0 for r in refused) <= cand.max_concurrency  # the wave in flight
        assert all("$ROTATED_KEY" in r.error for r in refused if r.attempts == 0)
        assert all(r.error_kind in (None, "auth", *RETRYABLE) for r in rows)

        monkeypatch.setenv("ROTATED_KEY", "sk-new-key-111111")
        mark = len(fake_llm.requests)
        done = store.done_items("run-a", suite.name, cand.name)
        assert done == {r.item_id for r in rows if r.error_kind != "auth"}
        await evaluate_pair(
            suite,
            cand,
            "run-a",
            store.write_outcomes,
            done=done,
            limits=limits,
            retry=RetryPolicy(base_s=0.005, max_s=0.02),
            flush_every=16,
        )
        final = _stored(store)
    assert len(final) == N and not [r for r in final if r.error_kind == "auth"]
    asked = {rec.body["messages"][-1]["content"] for rec in fake_llm.requests[mark:]}
    assert asked == {
        suite.request(it).messages[-1].content for it in suite.items if it.id in {r.item_id for r in refused}
    }


def _stored(store: Store) -> list[Outcome]:
    frame = store.query("SELECT * FROM outcomes")
    return [
        Outcome(**{k: (None if _isnull(v) else v) for k, v in rec.items()})
        for rec in frame.to_dict("records")
    ]


def _isnull(v) -> bool:
    try:
        return v != v  # NaN from pandas
    except Exception:
        return False


CHILD = textwrap.dedent("""
    import asyncio, sys
    from routeopt.evals.config import Candidate
    from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
    from routeopt.evals.storage.store import Store
    from routeopt.evals.suite.spec import load_suite

    suite_path, db, base_url, cache = sys.argv[1:5]
    suite = load_suite(suite_path)
    cand = Candidate(name="c", provider="openai", model="m", base_url=base_url, max_concurrency=8,
                     input_price_per_mtok=1, output_price_per_mtok=1, timeout_s=5, max_retries=3)
    store = Store(db)
    def sink(rows):
        store.write_outcomes(rows)
        print("FLUSH", len(rows), flush=True)
    done = store.done_items("run-k", suite.name, cand.name)
    print("START", len(done), flush=True)
    stats = asyncio.run(evaluate_pair(suite, cand, "run-k", sink, done=done, cache=cache,
                                      flush_every=8, retry=RetryPolicy(0.01, 0.05)))
    store.close()
    print("DONE", stats.completed, stats.skipped_done, flush=True)
""")


def _child(script: Path, suite_path: Path, db: Path, server: FakeLLM, cache: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, str(script), str(suite_path), str(db), server.openai_base_url, str(cache)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=REPO,
    )


def _kill_after(proc: subprocess.Popen, flushes: int, extra_s: float) -> None:
    assert proc.stdout is not None
    seen = 0
    for line in proc.stdout:
        seen += line.startswith("FLUSH")
        if seen >= flushes:
            break
    time.sleep(extra_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(10)


def _rows(db: Path) -> list[tuple[str, str | None]]:
    with Store(db, read_only=True) as store:
        frame = store.query("SELECT item_id, error_kind FROM outcomes WHERE run_id = 'run-k'")
    return list(frame.itertuples(index=False, name=None))


def test_sigkill_at_any_moment_then_resume_finishes_each_item_once(tmp_path, fake_llm):
    fake_llm.token_delay_s = 0.004
    fake_llm.faults = FaultPlan({"server_error": 0.05, "drop": 0.03}, seed=3, retry_after_s=0.01)
    suite_path = write_arithmetic_suite(tmp_path, N, tags=lambda i: "pad " * (i % 7))
    suite = load_suite(suite_path)
    script, db, cache = tmp_path / "child.py", tmp_path / "k.duckdb", tmp_path / "cache"
    script.write_text(CHILD)
    rng = random.Random(11)
    done_before: set[str] = set()
    for kill in (dict(flushes=2, extra_s=0.0), dict(flushes=1, extra_s=rng.uniform(0.05, 0.4)), None):
        mark = len(fake_llm.requests)
        proc = _child(script, suite_path, db, fake_llm, cache)
        if kill is None:
            out, _ = proc.communicate(timeout=240)
            assert proc.returncode == 0 and "DONE" in out, out
        else:
            _kill_after(proc, **kill)
        rows = _rows(db)
        ids = [r[0] for r in rows]
        assert len(ids) == len(set(ids)), "a killed run left a duplicate"
        asked = {rec.body["messages"][-1]["content"] for rec in fake_llm.requests[mark:]}
        asked_items = {it.id for it in suite.items if suite.request(it).messages[-1].content in asked}
        assert not asked_items & done_before, "a resumed run called items already done"
        assert done_before <= set(ids)
        done_before = set(ids)
    assert sorted(done_before) == sorted(it.id for it in suite.items)
    assert all(kind is None or kind in RETRYABLE for _, kind in _rows(db))
