"""The nightly flow with batched candidates: the Batch APIs answer, the sync pairs sample latency."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from rich.console import Console

from tests.batch_driver import fleet
from tests.fake_batches import FakeBatchLLM
from tests.fake_llm import write_arithmetic_suite


def test_nightly_with_batched_candidates(tmp_path: Path, prefect_harness) -> None:
    from routeopt.evals.execution.batch import batch_summary
    from routeopt.flows.nightly import close_store, nightly, shared_store
    from routeopt.reports.summary import modes_table

    with FakeBatchLLM(phase_s=0.05) as server:
        write_arithmetic_suite(tmp_path / "suites", 30, name="arith")
        write_arithmetic_suite(tmp_path / "suites", 20, name="arith2", system=None)
        config = fleet(
            tmp_path,
            {"openai": server.openai_base_url, "anthropic": server.anthropic_base_url},
            batch=True,
            poll_s=0.05,
        )
        result = nightly(config_path=str(config), run_id="night-b", publish=False)
        store = shared_store(Path(result.db_path))
        rows = store.query("SELECT candidate, call_mode, passed, latency_s FROM outcomes")
        summary = batch_summary(store, "night-b")
        close_store(Path(result.db_path))
        billed = server.billed
    assert len(rows) == 100 and rows.passed.all()
    assert Counter(rows.call_mode) == {"batch": 2 * (50 - 4), "sync": 8}
    assert rows[rows.call_mode == "sync"].latency_s.notna().all()
    assert max(billed.values()) == 1 and sum(billed.values()) == 100
    assert result.router_metrics is not None  # trained on batch-answered outcomes
    by = {r["candidate"]: r for r in summary}
    assert by["gpt"]["batches"] == {"completed": 1} and by["claude"]["batches"] == {"ended": 1}
    assert abs(by["gpt"]["full_sync_usd"] - 2 * by["gpt"]["cost_usd"]) < 2 * (
        by["gpt"]["full_sync_usd"] - by["gpt"]["cost_usd"]
    )  # about half, the sample at full price
    out = Console(record=True, width=160)
    out.print(modes_table(summary))
    text = out.export_text()
    assert "completed 1" in text and "latency rows" in text and "full sync night" in text
