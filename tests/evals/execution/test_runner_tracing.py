"""The runner with a collector that is down: every item is still evaluated and graded, every row
has its span's ids, and the spans that could not be exported are counted."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from routeopt.common import tracing
from tests.fake_llm import write_arithmetic_suite

pytest.importorskip("opentelemetry.exporter.otlp.proto.http", reason="the tracing extra is not installed")


def test_a_dead_collector_costs_no_item(tmp_path: Path, fake_candidate) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

    from routeopt.evals.execution.runner import evaluate_pair
    from routeopt.evals.suite.spec import load_suite
    from tests.litellm_proxy import free_port

    suite = load_suite(write_arithmetic_suite(tmp_path, 40))
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"  # nothing listens there
    tracing.configure(OTLPSpanExporter(endpoint=dead, timeout=1), max_queue_size=16)
    rows: list = []
    try:
        stats = asyncio.run(
            evaluate_pair(suite, fake_candidate("openai", max_concurrency=8), "r1", rows.extend)
        )
        tracing.flush(5)
        s = tracing.status()
    finally:
        tracing.disable()
    assert stats.completed == 40 and stats.errors == 0 and all(r.passed for r in rows)
    assert len({r.span_id for r in rows}) == 40 and all(r.trace_id for r in rows)
    assert s.exported == 0 and s.export_failed + s.dropped + s.queued == 40  # every span accounted for
