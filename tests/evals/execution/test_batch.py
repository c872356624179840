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
    return Candidate(
        name=f"b-{provider}",
        provider=provider,
        model=f"m-{provider}",
        base_url=base,
        input_price_per_mtok=3.0,
        output_price_per_mtok=15.0,
        timeout_s=10,
        max_retries=2,
        batch=spec,
    )


@pytest.fixture
def server():
    with FakeBatchLLM(phase_s=0.03) as s:
        yield s


@pytest.fixture
def suite(tmp_path: Path) -> Suite:
    return load_suite(write_arithmetic_suite(tmp_path / "suites", N))


def run_batches(store: Store, suite: Suite, cand: Candidate, run_id: str = "run-b") -> BatchStage:
    stage = BatchStage(
        store, run_id, [suite], [cand], sync_options={"retry": RetryPolicy(base_s=0.005, max_s=0.02)}
    )
    stage.submit()
    # what the flow does meanwhile: the synchronous pairs, here the latency sample
    import asyncio

    asyncio.run(
        evaluate_pair(
            suite,
            cand,
            run_id,
            store.write_outcomes,
            done=sorted(stage.owned(suite, cand)),
            retry=RetryPolicy(base_s=0.005, max_s=0.02),
        )
    )
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
        for i in {it.id for it in suite.items} - latency_sample(suite, 2)
    )


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
    cfg.write_text(
        "candidates:\n  - name: l\n    provider: local\n    model: x\n"
        "    gpu_hour_usd: 1.0\n    batch: true\n"
    )
    from routeopt.evals.config import load_config

    with pytest.raises(ConfigError, match=r"routeopt.yaml:\d+: candidates.0.*no batch API"):
        load_config(cfg)


def test_batch_prices_cache_reads_at_batch_rate():
    c = Candidate(
        name="a",
        provider="anthropic",
        model="m",
        input_price_per_mtok=3.0,
        output_price_per_mtok=15.0,
        batch=True,
    )
    priced = c.batch_pricing()
    assert priced.token_prices() == (1.5, 7.5)
    assert priced.cache_prices() == pytest.approx((0.15, 1.875))  # 0.1x and 1.25x of 1.5
    explicit = Candidate(
        name="b",
        provider="openai",
        model="m",
        input_price_per_mtok=2.0,
        output_price_per_mtok=8.0,
        batch={"input_price_per_mtok": 0.8, "output_price_per_mtok": 4.0},
    )
    assert explicit.batch_pricing().token_prices() == (0.8, 4.0)
    assert explicit.batch_pricing().cache_prices()[0] == pytest.approx(0.8)


def test_log_is_quiet_on_the_happy_path(tmp_path, server, suite, caplog):
    with caplog.at_level(logging.WARNING), Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suite, candidate(server))
    assert not [r for r in caplog.records if r.name.startswith("routeopt")]


# --- faults ---------------------------------------------------------------------------------


def faulty(tmp_path, suite, server, faults: set[str], provider: str = "openai", **batch: Any):
    server.all_faults = faults
    cand = candidate(server, provider, **batch)
    store = Store(tmp_path / "o.duckdb")
    stage = run_batches(store, suite, cand)
    got = rows(store)
    assert len(got) == N and got.passed.all(), got[["item_id", "error_kind", "error"]]
    assert len(set(got.item_id)) == N
    return store, stage, got


def problems(stage: BatchStage) -> str:
    return "\n".join(p for r in stage.reports.values() for p in r.problems)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_expired_batch_keeps_its_finished_lines_and_resends_the_rest(tmp_path, server, suite, provider):
    store, stage, got = faulty(tmp_path, suite, server, {"expire"}, provider)
    half = (N - 2) // 2
    assert Counter(got.call_mode) == {"batch": half, "sync": N - half}
    assert stage.reports[f"b-{provider}"].resent_sync == N - 2 - half
    assert not billed_twice(server)
    lines = store.query("SELECT state, count(*) n FROM batch_lines GROUP BY 1").set_index("state").n
    assert lines["answered"] == half and lines["expired"] == N - 2 - half


def test_resend_in_a_new_batch(tmp_path, server, suite):
    server.batch_faults = {1: {"expire"}}
    store, stage, got = faulty(tmp_path, suite, server, set(), resend="batch")
    jobs = BatchRecords(store).jobs("run-b")
    assert [j.round for j in jobs] == [1, 2] and len(server.batches) == 2
    assert Counter(got.call_mode) == {"batch": N - 2, "sync": 2}
    second = got[got.batch_id == jobs[1].batch_id]
    assert (second.attempts == 2).all() and len(second) == (N - 2) - (N - 2) // 2
    assert not billed_twice(server)


@pytest.mark.parametrize(
    "fault,provider",
    [
        ("stuck_validating", "openai"),
        ("stuck_processing", "openai"),
        ("stuck_finalizing", "openai"),
        ("stuck_processing", "anthropic"),
    ],
)
def test_stuck_batch_is_cancelled_past_its_deadline(tmp_path, server, suite, fault, provider):
    store, stage, got = faulty(tmp_path, suite, server, {fault}, provider, deadline_s=0.3)
    assert "deadline_s" in problems(stage) and "cancelled" in problems(stage)
    kept = {"stuck_validating": 0, "stuck_processing": (N - 2) // 2, "stuck_finalizing": N - 2}[fault]
    assert (got.call_mode == "batch").sum() == kept
    assert not billed_twice(server)


def test_failed_validation_names_the_line(tmp_path, server, suite, caplog):
    with caplog.at_level(logging.ERROR):
        store, stage, got = faulty(tmp_path, suite, server, {"fail_validation"})
    assert "line 2: invalid_request: missing required parameter 'messages'" in problems(stage)
    assert "line 2" in caplog.text and (got.call_mode == "sync").all()
    assert not billed_twice(server)


def test_enqueued_token_limit_exceeded_at_the_provider(tmp_path, server, suite):
    server.enqueued_token_limit = 10
    server.batch_faults = {}
    cand = candidate(server, max_requests=11)
    with Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suite, cand)
        assert "token_limit_exceeded" in problems(stage)
        assert len(rows(store)) == N and rows(store).passed.all()


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_duplicated_unknown_and_broken_lines_are_named(tmp_path, server, suite, provider):
    store, stage, got = faulty(tmp_path, suite, server, {"duplicate", "bad_json", "unknown_id"}, provider)
    text = problems(stage)
    assert "appears twice; the first kept" in text
    assert "not JSON" in text and "line " in text
    assert "was never sent in this batch" in text
    assert (got.call_mode == "batch").sum() == N - 2 and not billed_twice(server)


def test_missing_line_is_resent(tmp_path, server, suite):
    store, stage, got = faulty(tmp_path, suite, server, {"missing"})
    assert Counter(got.call_mode) == {"batch": N - 3, "sync": 3}
    assert store.query("SELECT count(*) n FROM batch_lines WHERE state = 'missing'").n[0] == 1


def test_5xx_on_poll_is_retried(tmp_path, server, suite, caplog):
    with caplog.at_level(logging.WARNING):
        store, stage, got = faulty(tmp_path, suite, server, {"poll_5xx"})
    assert (got.call_mode == "batch").sum() == N - 2
    assert "polling batch" in caplog.text and "trying again" in caplog.text


def test_uploads_that_keep_failing_go_synchronous(tmp_path, server, suite, caplog):
    """A proxy that answers every upload with a 5xx (LiteLLM without `files_settings`) must not
    hold the run forever: after `upload_attempts` the items are answered synchronously."""
    with caplog.at_level(logging.WARNING):
        store, stage, got = faulty(tmp_path, suite, server, {"upload_5xx"}, upload_attempts=2)
    assert (got.call_mode == "sync").all() and not billed_twice(server)
    assert "failed 2 times in a row (last: HTTP 500: injected fault: upload_5xx" in problems(stage)
    assert not server.batches


def test_batch_that_no_longer_exists(tmp_path, server, suite):
    store, stage, got = faulty(tmp_path, suite, server, {"gone"})
    assert "no longer exists at the provider" in problems(stage)
    assert (got.call_mode == "sync").all() and [j.state for j in BatchRecords(store).jobs("run-b")] == [
        "lost"
    ]


# --- resume ---------------------------------------------------------------------------------


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_resume_polls_the_same_batch(tmp_path, server, suite, provider):
    cand = candidate(server, provider)
    with Store(tmp_path / "o.duckdb") as store:
        BatchStage(store, "run-b", [suite], [cand]).submit()  # the run dies after submitting
        assert len(server.batches) == 1
        run_batches(store, suite, cand)  # resumed
        assert len(server.batches) == 1 and len(rows(store)) == N
        assert not billed_twice(server)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_resume_finds_a_batch_created_but_not_recorded(tmp_path, server, suite, provider):
    """Killed between the provider creating the batch and the store recording its id."""
    import asyncio

    cand = candidate(server, provider)
    with Store(tmp_path / "o.duckdb") as store:
        stage = BatchStage(store, "run-b", [suite], [cand])
        records = BatchRecords(store)
        from routeopt.evals.execution.batch import _CandidateBatches

        async def create_unrecorded() -> None:
            cb = _CandidateBatches(stage, cand)
            cb.plan()
            job = records.jobs("run-b")[0]
            _, body = cb._lines_of(job)
            file_id = await cb.api.upload(job.submission_id, body)
            records.update(job.submission_id, file_id=file_id, state="creating")
            await cb.api.create(job.submission_id, file_id, body)  # ... and the run dies here
            await cb.api.aclose()

        asyncio.run(create_unrecorded())
        assert records.jobs("run-b")[0].batch_id is None and len(server.batches) == 1
        run_batches(store, suite, cand)
        assert len(server.batches) == 1, "the batch was created twice"
        assert records.jobs("run-b")[0].batch_id in server.batches
        assert len(rows(store)) == N and not billed_twice(server)


def test_resume_refuses_a_changed_batch_candidate(tmp_path, server, suite):
    cand = candidate(server)
    with Store(tmp_path / "o.duckdb") as store:
        store.begin_run("run-b", candidates=[cand.public_dict()])
        run_batches(store, suite, cand)
        changed = cand.model_copy(update={"batch": cand.batch.model_copy(update={"discount": 0.4})})
        from routeopt.evals.storage.store import ResumeConflict

        with pytest.raises(ResumeConflict, match=r"candidate 'b-openai': batch.discount 0.5 -> 0.4 since"):
            store.check_resume("run-b", {cand.name: changed.measured_dict()}, {})
        slower = cand.model_copy(update={"batch": cand.batch.model_copy(update={"poll_interval_s": 9})})
        store.check_resume("run-b", {cand.name: slower.measured_dict()}, {})  # pacing may change
