"""Batch mode end to end: real SDKs -> fake Batch APIs on the wire -> store, with faults."""

from __future__ import annotations

import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from routeopt.evals.config import Candidate, ConfigError
from routeopt.evals.execution.batch import BatchStage, batch_summary, custom_id, latency_sample
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
from routeopt.evals.storage.batches import BatchRecords
from routeopt.evals.storage.store import Store
from routeopt.evals.suite.spec import Suite, load_suite
from tests.fake_batches import FakeBatchLLM
from tests.fake_llm import write_arithmetic_suite

N = 24


def candidate(server: FakeBatchLLM, provider: str = "openai", **batch: Any) -> Candidate:
    base = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    spec = {"poll_interval_s": 0.02, "latency_sample": 2, **batch}
    return Candidate(name=f"b-{provider}", provider=provider, model=f"m-{provider}", base_url=base,
                     input_price_per_mtok=3.0, output_price_per_mtok=15.0, timeout_s=10,
                     max_retries=2, batch=spec)


@pytest.fixture
def server():
    with FakeBatchLLM(phase_s=0.03) as s:
        yield s


@pytest.fixture
def suite(tmp_path: Path) -> Suite:
    return load_suite(write_arithmetic_suite(tmp_path / "suites", N))


def run_batches(store: Store, suite: Suite, cand: Candidate, run_id: str = "run-b") -> BatchStage:
    stage = BatchStage(store, run_id, [suite], [cand],
                       sync_options={"retry": RetryPolicy(base_s=0.005, max_s=0.02)})
    stage.submit()
    # what the flow does meanwhile: the synchronous pairs, here the latency sample
    import asyncio

    asyncio.run(evaluate_pair(suite, cand, run_id, store.write_outcomes,
                              done=sorted(stage.owned(suite, cand)),
                              retry=RetryPolicy(base_s=0.005, max_s=0.02)))
    assert stage.finish() == []
    return stage


def rows(store: Store, run_id: str = "run-b") -> Any:
    return store.query("SELECT * FROM outcomes WHERE run_id = ? ORDER BY item_id", [run_id])


def billed_twice(server: FakeBatchLLM) -> list:
    return [k for k, n in server.billed.items() if n > 1]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_batch_answers_every_item_once_at_half_price(tmp_path, server, suite, provider):
    cand = candidate(server, provider)
    with Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suite, cand)
        got = rows(store)
        assert len(got) == N and got.passed.all()
        modes = Counter(got.call_mode)
        assert modes == {"batch": N - 2, "sync": 2}
        batch = got[got.call_mode == "batch"]
        assert batch.latency_s.isna().all() and batch.ttft_s.isna().all()
        assert got[got.call_mode == "sync"].latency_s.notna().all()
        assert (batch.cost_usd.round(12) == (batch.sync_cost_usd * 0.5).round(12)).all()
        assert not billed_twice(server) and sum(server.billed.values()) == N
        assert stage.reports[cand.name].submissions == 1
        jobs = BatchRecords(store).jobs("run-b")
        assert [j.state for j in jobs] == ["harvested"] and jobs[0].batch_id in server.batches
        summary = batch_summary(store, "run-b")[0]
        assert (summary["batch"], summary["sync"], summary["carried"]) == (N - 2, 2, 0)
    # what was sent: one line per item, with the custom ids the store holds
    sent = server.batches[jobs[0].batch_id].lines
    assert sorted(ln["custom_id"] for ln in sent) == sorted(
        custom_id("run-b", suite.name, i, cand.name, 1)
        for i in {it.id for it in suite.items} - latency_sample(suite, 2))


def test_submissions_split_to_limits(tmp_path, server, suite):
    cand = candidate(server, max_requests=5)
    with Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suite, cand)
        jobs = BatchRecords(store).jobs("run-b")
        assert len(jobs) == 5 and max(j.n_requests for j in jobs) <= 5
        assert len(rows(store)) == N and not billed_twice(server)


def test_enqueued_token_limit_holds_submissions_back(tmp_path, server, suite):
    server.enqueued_token_limit = 200
    cand = candidate(server, enqueued_token_limit=150)
    with Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suite, cand)
        jobs = BatchRecords(store).jobs("run-b")
        assert len(jobs) > 1 and all(j.est_tokens <= 150 for j in jobs)
        assert {j.provider_state for j in jobs} == {"completed"}
        assert len(rows(store)) == N and rows(store).passed.all()


def test_local_candidates_refuse_batch(tmp_path):
    with pytest.raises(ValueError, match="no batch API"):
        Candidate(name="l", provider="local", model="x", gpu_hour_usd=1.0, batch=True)
    cfg = tmp_path / "routeopt.yaml"
    cfg.write_text("candidates:\n  - name: l\n    provider: local\n    model: x\n"
                   "    gpu_hour_usd: 1.0\n    batch: true\n")
    from routeopt.evals.config import load_config

    with pytest.raises(ConfigError, match=r"routeopt.yaml:\d+: candidates.0.*no batch API"):
        load_config(cfg)


def test_batch_prices_cache_reads_at_batch_rate():
    c = Candidate(name="a", provider="anthropic", model="m", input_price_per_mtok=3.0,
                  output_price_per_mtok=15.0, batch=True)
    priced = c.batch_pricing()
    assert priced.token_prices() == (1.5, 7.5)
    assert priced.cache_prices() == pytest.approx((0.15, 1.875))  # 0.1x and 1.25x of 1.5
    explicit = Candidate(name="b", provider="openai", model="m", input_price_per_mtok=2.0,
                         output_price_per_mtok=8.0,
                         batch={"input_price_per_mtok": 0.8, "output_price_per_mtok": 4.0})
    assert explicit.batch_pricing().token_prices() == (0.8, 4.0)
    assert explicit.batch_pricing().cache_prices()[0] == pytest.approx(0.8)


def test_log_is_quiet_on_the_happy_path(tmp_path, server, suite, caplog):
    with caplog.at_level(logging.WARNING), Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suite, candidate(server))
    assert not [r for r in caplog.records if r.name.startswith("routeopt")]
