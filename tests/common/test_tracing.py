"""routeopt.common.tracing: when it turns on, traceparent rules, and that a bad collector costs no call."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from routeopt.common import tracing
from tests import REPO

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402

VECTORS = json.loads((REPO / "docs" / "tracing_vectors.json").read_text())


@pytest.mark.parametrize("case", VECTORS["traceparent"], ids=lambda c: c["name"])
def test_traceparent_vectors(case: dict) -> None:
    got = tracing.parse_traceparent(case["header"])
    assert (list(got) if got else None) == case["parsed"]


@pytest.mark.parametrize(
    "env, on",
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "ROUTEOPT_TRACING": "off"}, False),
        ({"ROUTEOPT_TRACING": "on"}, True),
    ],
)
def test_the_standard_variables_turn_it_on(env: dict, on: bool) -> None:
    assert tracing.wanted(env) is on


def test_decision_vectors_give_the_documented_attributes() -> None:
    from routeopt.artifacts.serving.loader import ServedDecision

    for case in VECTORS["decision_attributes"]:
        d = ServedDecision(**case["decision"])
        assert tracing.decision_attributes(d, **case["context"]) == case["attributes"], case["name"]


def test_a_decision_span_is_a_child_of_the_callers_traceparent(memory) -> None:
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    back, trace_id, span_id = tracing.record_decision(
        parent, time.time_ns(), {"routeopt.decision.model": "m"}
    )
    assert tracing.flush()
    (span,) = memory.get_finished_spans()
    assert span.name == "routeopt.route" and trace_id == "0af7651916cd43dd8448eb211c80319c"
    assert f"{span.parent.span_id:016x}" == "b7ad6b7169203331"
    assert back == f"00-{trace_id}-{span_id}-01" and span_id == f"{span.context.span_id:016x}"
    # an invalid header starts a new trace (W3C), never fails the decision
    back2, trace2, _ = tracing.record_decision("00-garbage", time.time_ns(), {})
    assert trace2 != trace_id and tracing.parse_traceparent(back2)[0] == trace2


def test_off_it_hands_the_callers_header_back_and_records_nothing() -> None:
    tracing.disable()
    header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    assert tracing.record_decision(header, 0, {}) == (header, "0af7651916cd43dd8448eb211c80319c", None)
    assert tracing.record_decision("bogus", 0, {}) == (None, None, None)


class _Down(SpanExporter):
    """A collector that holds every batch until released, then refuses it."""

    def __init__(self) -> None:
        self.release, self.entered = threading.Event(), threading.Event()
        self.threads: set[int] = set()

    def export(self, spans):
        self.threads.add(threading.get_ident())
        self.entered.set()
        self.release.wait(60)
        return SpanExportResult.FAILURE

    def shutdown(self) -> None:
        self.release.set()


def test_a_stuck_collector_blocks_nothing_and_drops_are_counted() -> None:
    """Every call returns while the exporter is stuck (had one waited for it, the test would
    hang until the exporter gave up); the queue holds 50 spans and the rest are counted dropped."""
    down = _Down()
    tracing.configure(down, max_queue_size=50)
    try:
        for _ in range(500):
            tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
            with tracing.use(tracing.start_span("chat m")) as span:
                span.end()
        assert not down.release.is_set()  # all 1,000 spans were handed over with the collector stuck
        assert tracing.flush(0.5) is False  # bounded: a stuck collector does not hold the caller
        down.release.set()
        tracing.flush(30)
        s = tracing.status()
        assert s.enabled and s.dropped >= 1000 - 3 * 50  # the queue, a batch in export, the builder's queue
        assert s.dropped + s.ended == 1000 and s.exported == 0 and s.export_failed == s.ended
        assert threading.get_ident() not in down.threads  # exported by the SDK's thread, never the caller's
    finally:
        down.release.set()
        tracing.disable()
    assert tracing.status().enabled is False


def test_without_the_sdk_it_stays_off_and_says_why(tmp_path: Path) -> None:
    """A fresh interpreter where `opentelemetry.sdk` cannot be imported, with an endpoint set."""
    script = (
        "import sys, json\n"
        "sys.modules['opentelemetry.sdk'] = None\n"
        "from routeopt.common import tracing\n"
        "print(json.dumps([tracing.enabled(), tracing.status().reason]))\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=REPO,
        env={
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(REPO),
            "OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9",
        },
        check=True,
    )
    on, reason = json.loads(out.stdout)
    assert on is False and "pip install 'routeopt[tracing]'" in reason


def test_a_new_set_up_builds_what_the_old_one_queued_and_ends_its_thread() -> None:
    """Re-configuring (a benchmark toggling, an application changing exporters) must not lose
    the decisions queued under the old set-up, nor leave its span-building thread behind."""
    exporters = [InMemorySpanExporter() for _ in range(5)]  # a shut-down exporter takes no more
    builders = lambda: [t for t in threading.enumerate() if t.name == "routeopt-tracing-decisions"]  # noqa: E731
    tracing.disable()
    before = len(builders())
    try:
        for exporter in exporters:
            tracing.configure(exporter, batch=False)
            for _ in range(100):  # fewer than the builder's wake-up batch: still queued at the swap
                tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
        tracing.flush(30)
        assert [len(e.get_finished_spans()) for e in exporters] == [100] * 5
        assert tracing.status().dropped == 0
    finally:
        tracing.disable()
    assert len(builders()) == before


def _samplers() -> list:
    from opentelemetry.sdk.trace import sampling as s

    class Custom(s.Sampler):  # not the SDK's: asked itself
        def should_sample(
            self, parent_context, trace_id, name, kind=None, attributes=None, links=None, trace_state=None
        ):
            return s.SamplingResult(s.Decision.RECORD_AND_SAMPLE if trace_id % 3 else s.Decision.DROP)

        def get_description(self) -> str:
            return "custom"

    ratio = s.TraceIdRatioBased(0.3)
    return [
        s.ALWAYS_ON,
        s.ALWAYS_OFF,
        s.DEFAULT_ON,
        s.DEFAULT_OFF,
        ratio,
        s.ParentBased(ratio),
        s.ParentBasedTraceIdRatio(0.7),
        Custom(),
        s.ParentBased(Custom()),
        s.ParentBased(
            s.ALWAYS_OFF,
            remote_parent_sampled=ratio,
            remote_parent_not_sampled=s.ALWAYS_ON,
            local_parent_sampled=s.ALWAYS_OFF,
            local_parent_not_sampled=ratio,
        ),
    ]


@pytest.mark.parametrize("sampler", _samplers(), ids=lambda s: s.get_description())
def test_a_decision_is_sampled_as_the_providers_sampler_decides(sampler) -> None:
    """The decision path decides the SDK's own samplers without asking them (it is on a
    request's path); the answer must be theirs, with and without a parent of either kind."""
    import random

    from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False, sampler=sampler)
    try:
        state, rng, mine = tracing._STATE, random.Random(7), []
        for i in range(4000):
            trace_id = rng.getrandbits(128) or 1
            parent = (
                None
                if i % 5 == 0
                else (trace_id, rng.getrandbits(64) or 1, rng.choice((0, 1, 3)), bool(rng.getrandbits(1)))
            )
            ctx = (
                None
                if parent is None
                else set_span_in_context(
                    NonRecordingSpan(
                        SpanContext(
                            parent[0], parent[1], is_remote=parent[3], trace_flags=TraceFlags(parent[2])
                        )
                    )
                )
            )
            theirs = sampler.should_sample(ctx, trace_id, tracing.DECISION_SPAN, SpanKind.SERVER)
            mine.append(state.sampled(parent, trace_id))
            assert mine[-1] == theirs.decision.is_sampled(), (i, parent)
        assert 0 < sum(mine) < len(mine) or sampler.get_description().startswith(
            ("Always", "ParentBased{root:Always")
        )
    finally:
        tracing.disable()


def test_paused_is_off_inside_and_the_same_set_up_after(memory) -> None:
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    before = tracing._STATE
    with tracing.paused():
        assert not tracing.enabled()
        assert tracing.record_decision(parent, time.time_ns(), {"routeopt.decision.model": "m"})[2] is None
    assert tracing._STATE is before and tracing.enabled()
    tracing.record_decision(parent, time.time_ns(), {"routeopt.decision.model": "m"})
    assert tracing.flush(30) and len(memory.get_finished_spans()) == 1
