"""Judged suites in batch mode: the judge's calls in the judge's own batches, a second stage.

Real SDKs -> the fake Batch APIs on the wire (`judging` answers the judge's prompts) -> store."""

from __future__ import annotations

import asyncio
import json
import logging
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

from routeopt.evals.config import Candidate, Config
from routeopt.evals.execution.batch import BatchStage, batch_summary
from routeopt.evals.execution.budget import Budget, spent_in_run
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
from routeopt.evals.storage.batches import BatchRecords
from routeopt.evals.storage.store import Store
from routeopt.evals.suite.spec import Suite, load_suite
from tests.fake_batches import JUDGE_RUBRIC, FakeBatchLLM, judging
from tests.fake_llm import fails_odd_answers, write_arithmetic_suite

N = 16
FAST = RetryPolicy(base_s=0.005, max_s=0.02)
ZOO_S = Path(__file__).resolve().parents[3] / "evals" / "demo" / "zoo" / "zoo-s"


@pytest.fixture
def server():
    with FakeBatchLLM(phase_s=0.03, answer_fn=judging(fails_odd_answers), prompt_cache=False) as s:
        yield s


def answering(server: FakeBatchLLM, **batch: Any) -> Candidate:
    spec = {"poll_interval_s": 0.02, "latency_sample": 2, **batch}
    return Candidate(
        name="ans",
        provider="openai",
        model="m-ans",
        base_url=server.openai_base_url,
        input_price_per_mtok=3.0,
        output_price_per_mtok=15.0,
        timeout_s=10,
        max_retries=2,
        batch=spec,
    )


def judge(server: FakeBatchLLM, provider: str = "openai") -> Candidate:
    base = server.openai_base_url if provider == "openai" else server.anthropic_base_url
    return Candidate(
        name="judge",
        provider=provider,
        model=f"j-{provider}",
        base_url=base,
        input_price_per_mtok=2.0,
        output_price_per_mtok=8.0,
        timeout_s=10,
        max_retries=2,
        batch={"enabled": False, "poll_interval_s": 0.02},  # the judge's batches: how they are polled
    )


def local_judge() -> Candidate:
    return Candidate(
        name="judge", provider="local", model=str(ZOO_S), gpu_hour_usd=0.5, gpu_tokens_per_s=50000
    )


def judged_suites(folder: Path, cfg: Config, score_pattern: str | None = None) -> list[Suite]:
    """The arithmetic suite judged, and a copy graded by `all: [contains, judge]`."""
    path = write_arithmetic_suite(folder, N)
    judge_spec: dict[str, Any] = {"type": "judge", "candidate": "judge", "rubric": JUDGE_RUBRIC}
    if score_pattern:
        judge_spec["score_pattern"] = score_pattern
    spec = json.loads(path.read_text())
    spec["grader"] = judge_spec
    path.write_text(json.dumps(spec))
    both = {
        **spec,
        "name": "arith_all",
        "prompt": {**spec["prompt"], "template": "Again: " + spec["prompt"]["template"]},
    }
    again = {**judge_spec, "rubric": "Again.\n" + JUDGE_RUBRIC}  # other prompts: billed apart
    both["grader"] = {"type": "all", "graders": [{"type": "contains", "target": "{{ answer }}"}, again]}
    (folder / "arith_all.yaml").write_text(json.dumps(both))
    return [load_suite(path, config=cfg), load_suite(folder / "arith_all.yaml", config=cfg)]


def run_batches(store: Store, suites: list[Suite], cand: Candidate, run_id: str, **kw: Any) -> BatchStage:
    """What the flow does: submissions, the synchronous pairs (the latency sample), the end."""
    stage = BatchStage(store, run_id, suites, [cand], sync_options={"retry": FAST}, **kw)
    stage.submit()
    for suite in suites:
        done = sorted(stage.owned(suite, cand))
        asyncio.run(
            evaluate_pair(
                suite, cand, run_id, store.write_outcomes, done=done, retry=FAST, budget=stage.budget
            )
        )
    assert stage.finish() == []
    return stage


def run_sync(store: Store, suites: list[Suite], cand: Candidate, run_id: str) -> None:
    sync = cand.model_copy(update={"batch": None})
    for suite in suites:
        asyncio.run(evaluate_pair(suite, sync, run_id, store.write_outcomes, retry=FAST))


def rows(store: Store, run_id: str) -> Any:
    return store.query("SELECT * FROM outcomes WHERE run_id = ? ORDER BY suite, item_id", [run_id]).set_index(
        ["suite", "item_id"]
    )


def judge_lines(server: FakeBatchLLM, model: str) -> list[dict]:
    return [ln for b in server.batches.values() if b.model == model for ln in b.lines]


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_judge_batches_grade_as_synchronous_calls_do_at_batch_prices(tmp_path, server, provider):
    j = judge(server, provider)
    cand = answering(server)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]))
    with Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suites, cand, "run-b")
        billed = Counter(server.billed)
        run_sync(store, suites, cand, "run-s")
        got, want = rows(store, "run-b"), rows(store, "run-s")
        spent = spent_in_run(store, "run-b")
        summary = batch_summary(store, "run-b")[0]
        replies = store.query("SELECT * FROM judge_replies WHERE run_id = 'run-b'")
        kept = BatchRecords(store).kept("run-b", "ans")

    # the same graded rows as synchronous calls of the same answers, some passing, some not
    assert len(got) == 2 * N and got.error_kind.isna().all(), got[["error_kind", "error"]]
    cols = ["response", "passed", "score", "reason", "judge_candidate", "judge_input_tokens"]
    assert got[cols].equals(want[cols])
    assert 0 < got.passed.sum() < 2 * N and set(got.score.round(6)) >= {0.9, 0.2}
    # batch-answered rows were judged in the judge's batches, at its batch prices (half)
    batched = got[got.call_mode == "batch"]
    assert len(batched) == 2 * (N - 2) and (batched.judge_call_mode == "batch").all()
    assert (
        batched.judge_cost_usd.round(12) == (want.loc[batched.index].judge_cost_usd * 0.5).round(12)
    ).all()
    sample = got[got.call_mode == "sync"]
    assert sample.judge_call_mode.isna().all()
    assert (sample.judge_cost_usd == want.loc[sample.index].judge_cost_usd).all()
    # what was sent: one judge line per batch-answered row (`j` ids), each paid once
    lines = judge_lines(server, j.model)
    assert len(lines) == 2 * (N - 2) and all(ln["custom_id"].startswith("j") for ln in lines)
    assert not [k for k, n in billed.items() if n > 1]
    assert sum(n for (m, _), n in billed.items() if m == j.model) == 2 * N
    assert len(replies) == 2 * (N - 2) and set(replies["mode"]) == {"batch"}
    # the budget counts each judge call once, at what it cost
    assert spent["judge"] == pytest.approx(got.judge_cost_usd.sum())
    assert spent["ans"] == pytest.approx(got.cost_usd.sum())
    report = stage.reports["ans"]
    assert report.judge_submissions >= 1 and report.judge_replies == 2 * (N - 2)
    assert summary["batches"] and summary["judge_batches"]
    assert kept == []  # every kept answer left with its graded row


def test_a_local_judge_grades_synchronously(tmp_path, server):
    j = local_judge()
    cand = answering(server)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]), score_pattern=r"(\d)")[:1]
    with Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suites, cand, "run-l")
        got = rows(store, "run-l")
        kept = store.query("SELECT count(*) n FROM batch_answers").n[0]
        judge_jobs = store.query("SELECT count(*) n FROM batch_jobs WHERE judge_for IS NOT NULL").n[0]
    assert len(got) == N and (got.judge_candidate == "judge").all()
    assert got.judge_call_mode.isna().all() and (got.judge_cost_usd > 0).all()
    assert kept == 0 and judge_jobs == 0 and len(server.batches) == 1  # the answers' batch only


def test_judge_batching_turned_off_calls_the_judge_at_harvest(tmp_path, server):
    j = judge(server)
    cand = answering(server, judge=False)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]))[:1]
    with Store(tmp_path / "o.duckdb") as store:
        run_batches(store, suites, cand, "run-o")
        got = rows(store, "run-o")
    assert len(got) == N and got.judge_call_mode.isna().all() and got.error_kind.isna().all()
    assert judge_lines(server, j.model) == [] and not [k for k, n in server.billed.items() if n > 1]


# --- faults in the judge's batches ----------------------------------------------------------


def judge_faults(server: FakeBatchLLM, faults: set[str]) -> None:
    """Faults for the judge's batches only (the answers' batch is the first one created)."""
    server.batch_faults = {n: set(faults) for n in range(2, 10)}


def problems(stage: BatchStage) -> str:
    return "\n".join(p for r in stage.reports.values() for p in r.problems)


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
def test_broken_unknown_and_duplicated_judge_lines_are_named(tmp_path, server, provider):
    judge_faults(server, {"bad_json", "unknown_id", "duplicate"})
    j = judge(server, provider)
    cand = answering(server)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]))[:1]
    with Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suites, cand, "run-f")
        got = rows(store, "run-f")
    text = problems(stage)
    assert "judge judge of ans: batch " in text and " line " in text and "not JSON" in text
    assert "was never sent in this batch" in text and "appears twice; the first kept" in text
    assert len(got) == N and got.error_kind.isna().all()
    assert (got[got.call_mode == "batch"].judge_call_mode == "batch").all()
    assert not [k for k, n in server.billed.items() if n > 1]


@pytest.mark.parametrize("fault", ["expire", "fail_validation", "gone"])
def test_judge_lines_no_batch_answered_are_called_synchronously(tmp_path, server, fault, caplog):
    judge_faults(server, {fault})
    j = judge(server)
    cand = answering(server)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]))[:1]
    with caplog.at_level(logging.WARNING), Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suites, cand, "run-f")
        got = rows(store, "run-f")
        modes = Counter(store.query("SELECT mode FROM judge_replies").to_dict("list")["mode"])
    batched = got[got.call_mode == "batch"]
    assert len(got) == N and got.error_kind.isna().all()
    answered_in_batch = {"expire": (N - 2) // 2, "fail_validation": 0, "gone": 0}[fault]
    assert modes == {
        k: v for k, v in {"batch": answered_in_batch, "sync": N - 2 - answered_in_batch}.items() if v
    }
    assert set(batched.judge_call_mode) == ({"batch", "sync"} if answered_in_batch else {"sync"})
    assert not [k for k, n in server.billed.items() if n > 1]
    if fault == "fail_validation":
        assert "judge judge of ans: batch " in problems(stage) and "line 2" in problems(stage)


def test_judge_batches_reserve_under_the_spend_cap(tmp_path, server):
    """A judge submission that does not fit the cap is refused before it is sent; its requests
    go to synchronous calls under the cap, which the cap refuses too: resumable placeholders."""
    j = judge(server)
    cand = answering(server)
    suites = judged_suites(tmp_path / "suites", Config(candidates=[cand, j]))[:1]
    with Store(tmp_path / "o.duckdb") as store:
        stage = run_batches(store, suites, cand, "run-c", budget=Budget(None, {"judge": 1e-9}))
        got = rows(store, "run-c")
        kept = BatchRecords(store).kept("run-c", "ans")
    assert "does not fit the spend caps" in problems(stage)
    assert judge_lines(server, j.model) == []
    batched = got[got.call_mode == "batch"]
    assert (batched.error_kind == "budget").all() and len(kept) == N - 2  # graded again on resume
