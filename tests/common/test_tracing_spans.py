"""routeopt.common.tracing_spans: a span routeopt records itself ends up as the span the SDK would have
made from the same calls, and behaves as an OpenTelemetry span to whoever holds it."""

from __future__ import annotations

from typing import Any, Callable

import pytest

from routeopt.common import tracing

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
from opentelemetry import trace as api  # noqa: E402
from opentelemetry.sdk.trace import TracerProvider, sampling  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter  # noqa: E402
from opentelemetry.trace import Status, StatusCode  # noqa: E402

from routeopt.common.tracing_spans import RecordedSpan  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
LINKED = api.SpanContext(
    0x1234,
    0x5678,
    is_remote=True,
    trace_flags=api.TraceFlags(1),
    trace_state=api.TraceState([("vendor", "v1")]),
)
T0 = 1_700_000_000_000_000_000


def _attributes(span: Any) -> None:
    span.set_attribute("a", 1)
    span.set_attributes({"b": [1, 2], "c": "x", "d": None, "e": True})
    span.set_attribute("a", 2.5)  # set again: moves to the end
    span.set_attribute("f", None)
    span.set_attribute("long", "y" * 40)
    span.set_attributes({f"k{i}": i for i in range(8)})
    span.update_name("renamed")


def _events(span: Any) -> None:
    for i in range(6):
        span.add_event(f"e{i}", {"i": i, "s": "z" * 20}, timestamp=T0 + i)
    span.add_link(LINKED, {"why": "retry of"})
    span.add_link(api.INVALID_SPAN_CONTEXT)  # neither valid nor carrying anything: ignored
    span.add_link(api.INVALID_SPAN_CONTEXT, {"kept": True})  # attributes make it a link


def _status_error_then_ok(span: Any) -> None:
    span.set_status(StatusCode.ERROR, "boom")
    span.set_status(Status(StatusCode.UNSET))  # never replaces a status
    span.set_status(StatusCode.OK, "a description goes only with an error")
    span.set_status(StatusCode.ERROR, "after OK: ignored")


def _status_object(span: Any) -> None:
    span.set_status(Status(StatusCode.ERROR, "from a Status"))


def _exception(span: Any) -> None:
    try:
        raise KeyError("missing")
    except KeyError as exc:
        span.record_exception(exc, {"extra": 1}, timestamp=T0 + 7, escaped=True)
    tracing.set_error(span, "internal", "m" * 600)


def _after_end(span: Any) -> None:
    span.set_attribute("before", 1)
    span.end(end_time=T0 + 100)
    span.set_attribute("after", 1)
    span.add_event("after")
    span.set_status(StatusCode.ERROR, "after")
    span.update_name("after")


SCENARIOS: dict[str, Callable[[Any], None]] = {
    "attributes": _attributes,
    "events and links": _events,
    "status error then ok": _status_error_then_ok,
    "status object": _status_object,
    "exception": _exception,
    "after end": _after_end,
}
LIMITS = {
    "OTEL_SPAN_ATTRIBUTE_VALUE_LENGTH_LIMIT": "16",
    "OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT": "8",
    "OTEL_SPAN_ATTRIBUTE_COUNT_LIMIT": "6",
    "OTEL_SPAN_EVENT_COUNT_LIMIT": "4",
}


def _view(span: Any) -> dict:
    """What a backend gets of a finished span (ids aside: each side draws its own)."""
    return {
        "name": span.name,
        "kind": span.kind,
        "parent": (span.parent.trace_id, span.parent.span_id),
        "trace": span.context.trace_id == span.parent.trace_id,
        "flags": int(span.context.trace_flags) & 1,
        "attributes": list(span.attributes.items()),
        "events": [(e.name, e.timestamp, list(e.attributes.items())) for e in span.events],
        "links": [
            (
                link.context.trace_id,
                link.context.span_id,
                int(link.context.trace_flags),
                link.context.is_remote,
                link.context.trace_state.to_header(),
                list(link.attributes.items()),
            )
            for link in span.links
        ],
        "status": (span.status.status_code, span.status.description),
        "times": (span.start_time, span.end_time),
    }


@pytest.mark.parametrize("limits", [False, True], ids=["default limits", "tight limits"])
@pytest.mark.parametrize("scenario", SCENARIOS, ids=str)
def test_a_recorded_span_is_what_the_sdk_would_have_made(
    scenario: str, limits: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    for key, value in LIMITS.items():
        if limits:
            monkeypatch.setenv(key, value)
    theirs_out, ours_out = InMemorySpanExporter(), InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(theirs_out))
    tracing.configure(ours_out, batch=False)
    try:
        ours = tracing.start_span(
            "call", traceparent=PARENT, kind="client", attributes={"at": "start"}, start_ns=T0
        )
        theirs = provider.get_tracer("routeopt").start_span(
            "call",
            context=tracing.parent_context(PARENT),
            kind=api.SpanKind.CLIENT,
            attributes={"at": "start"},
            start_time=T0,
        )
        assert isinstance(ours, RecordedSpan)
        for span in (ours, theirs):
            SCENARIOS[scenario](span)
            span.end(end_time=T0 + 200)
        assert tracing.flush(30)
        (got,), (want,) = ours_out.get_finished_spans(), theirs_out.get_finished_spans()
        assert _view(got) == _view(want)
        assert (
            got.context.trace_id == int(PARENT[3:35], 16)
            and got.context.span_id == ours.get_span_context().span_id
        )
    finally:
        tracing.disable()
        provider.shutdown()


def test_the_current_recorded_span_parents_an_applications_own_spans(memory: InMemorySpanExporter) -> None:
    """An application's tracer (its own provider) and routeopt's child spans both see it."""
    app_out = InMemorySpanExporter()
    app = TracerProvider(shutdown_on_exit=False)
    app.add_span_processor(SimpleSpanProcessor(app_out))
    outer = tracing.start_span("evaluate")
    with tracing.use(outer):
        assert api.get_current_span() is outer and tracing.current_span() is outer
        app.get_tracer("app").start_span("app work").end()
        inner = tracing.start_span("chat m", kind="client")
        assert tracing.traceparent_of(inner) == tracing.format_traceparent(
            outer.get_span_context().trace_id, inner.get_span_context().span_id, True
        )
        inner.end()
    outer.end()
    assert tracing.flush(30)
    (app_span,) = app_out.get_finished_spans()
    assert app_span.parent.span_id == outer.get_span_context().span_id
    by_name = {s.name: s for s in memory.get_finished_spans()}
    assert by_name["chat m"].parent.span_id == by_name["evaluate"].context.span_id
    assert by_name["evaluate"].parent is None and by_name["chat m"].kind is api.SpanKind.CLIENT
    assert tracing.ids(inner) == (
        f"{by_name['chat m'].context.trace_id:032x}",
        f"{by_name['chat m'].context.span_id:016x}",
    )


def test_a_span_the_sampler_drops_is_not_recorded_but_keeps_its_ids() -> None:
    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False, sampler=sampling.ParentBased(sampling.TraceIdRatioBased(0.0)))
    try:
        root = tracing.start_span("routeopt nightly")
        assert not root.is_recording() and root.get_span_context().is_valid
        assert not root.get_span_context().trace_flags.sampled
        with tracing.use(root):
            child = tracing.start_span("chat m")  # the parent was not sampled: neither is the child
            assert not child.is_recording() and tracing.current_span() is None
            assert child.get_span_context().trace_id == root.get_span_context().trace_id
            child.end()
        root.end()
        sampled = tracing.start_span("chat m", traceparent=PARENT)  # a sampled caller's child is sampled
        assert sampled.is_recording()
        sampled.end()
        assert tracing.flush(30)
        assert [s.name for s in exporter.get_finished_spans()] == ["chat m"]
    finally:
        tracing.disable()
