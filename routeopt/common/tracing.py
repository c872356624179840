"""OpenTelemetry tracing for every layer: off unless configured, and free when off.

Nothing here imports OpenTelemetry until tracing is turned on, so a gateway without the
`tracing` extra (or with tracing off) imports nothing new and pays one function call per
decision. Tracing is on when the standard variables ask for an exporter:

- `OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` is set, or
  `OTEL_TRACES_EXPORTER` is `otlp` or `console`; `ROUTEOPT_TRACING=on|off` overrides that;
- and `OTEL_SDK_DISABLED` is not true and `OTEL_TRACES_EXPORTER` is not `none`.

Then spans go through a batch processor to an OTLP exporter over HTTP (`http/protobuf`, the
default) or gRPC (`OTEL_EXPORTER_OTLP_TRACES_PROTOCOL` / `OTEL_EXPORTER_OTLP_PROTOCOL` = `grpc`),
with the SDK's own handling of the endpoint, headers, timeout, `OTEL_SERVICE_NAME` (default
`routeopt`), `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER(_ARG)` and `OTEL_BSP_*`.

Tracing never blocks or fails a call: spans are queued and exported by the SDK's thread; when the
collector is down or slow and `OTEL_BSP_MAX_QUEUE_SIZE` spans wait, new spans are dropped and
counted (`status().dropped`), and spans a collector refused are counted too (`export_failed`).
At exit the queue gets `ROUTEOPT_TRACING_EXIT_TIMEOUT_S` (2 s) to drain, never more.

The provider is routeopt's own (the global OpenTelemetry provider is left to the application);
a parent comes from a W3C `traceparent` header or from the caller's current span.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import logging
import os
import random
import re
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

log = logging.getLogger("routeopt.tracing")
ON_VALUES, OFF_VALUES = ("1", "true", "on", "yes"), ("0", "false", "off", "no")
_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-[^\s]*)?")
DECISION_SPAN = "routeopt.route"
IN_DECISION: ContextVar[bool] = ContextVar("routeopt_in_decision", default=False)
"""Set while a Gateway records its decision span, so the Router it calls records none."""


def parse_traceparent(header: str | None) -> tuple[str, str, str] | None:
    """(trace id, parent span id, flags) of a W3C `traceparent`, or None when it is absent or
    invalid (W3C: the receiver then starts a new trace). Version 00 has exactly four fields."""
    if not header:
        return None
    m = _TRACEPARENT.fullmatch(header.strip())
    if m is None:
        return None
    version, trace_id, span_id, flags, rest = m.groups()
    if version == "ff" or (version == "00" and rest) or trace_id == "0" * 32 or span_id == "0" * 16:
        return None
    return trace_id, span_id, flags


def format_traceparent(trace_id: int | str, span_id: int | str, sampled: bool) -> str:
    """The W3C header naming a span as the parent of what the caller does next."""
    t = trace_id if isinstance(trace_id, str) else f"{trace_id:032x}"
    s = span_id if isinstance(span_id, str) else f"{span_id:016x}"
    return f"00-{t}-{s}-{'01' if sampled else '00'}"


# -- configuration ------------------------------------------------------------------------------


@dataclass(frozen=True)
class TracingStatus:
    """What tracing did in this process: spans handed to the exporter, exported, refused by the
    collector (`export_failed`), dropped while the queue was full, and still queued."""

    enabled: bool
    exporter: str | None
    endpoint: str | None
    service_name: str | None
    ended: int = 0
    exported: int = 0
    export_failed: int = 0
    dropped: int = 0
    queued: int = 0
    last_error: str | None = None
    reason: str | None = None  # why tracing is off, when it was asked for and could not start


class _Counts:
    """Span counters; each field has one writer thread (the callers, or the export thread)."""

    def __init__(self) -> None:
        self.ended = self.exported = self.failed = self.dropped = 0
        self.last_error: str | None = None


class _State:
    def __init__(
        self,
        tracer: Any = None,
        provider: Any = None,
        counts: _Counts | None = None,
        exporter: str | None = None,
        endpoint: str | None = None,
        service: str | None = None,
        reason: str | None = None,
        processor: Any = None,
    ) -> None:
        self.tracer, self.provider, self.counts = tracer, provider, counts or _Counts()
        self.exporter, self.endpoint, self.service, self.reason = exporter, endpoint, service, reason
        self.processor = processor  # where finished decision spans go (the provider's only one)
        self.deferred: _Deferred | None = None
        self._rule = None if provider is None else _sampling_rule(provider.sampler)

    def sampled(
        self,
        parent: tuple | None,
        trace_id: int,
        name: str = DECISION_SPAN,
        kind: Any = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> bool:
        """The provider's sampling decision for a span (a decision's by default), taken where
        the ids are drawn."""
        if self._rule is not None:
            return self._rule(parent, trace_id)
        from opentelemetry.trace import (
            SpanKind,
            set_span_in_context,
            NonRecordingSpan,
            SpanContext,
            TraceFlags,
        )

        ctx = (
            None
            if parent is None
            else set_span_in_context(
                NonRecordingSpan(
                    SpanContext(parent[0], parent[1], is_remote=parent[3], trace_flags=TraceFlags(parent[2]))
                )
            )
        )
        return self.provider.sampler.should_sample(
            ctx, trace_id, name, kind or SpanKind.SERVER, attributes
        ).decision.is_sampled()


def _sampling_rule(sampler: Any) -> Callable[[tuple | None, int], bool] | None:
    """The SDK's own samplers (always on/off, trace-id ratio, parent-based over those) decide
    from the parent's flags and the trace id alone: the same decision as their `should_sample`
    without its context and result objects (3 to 4 us of a decision's path). None for any other
    sampler, which is then asked itself."""
    from opentelemetry.sdk.trace.sampling import ParentBased, StaticSampler, TraceIdRatioBased

    kind = type(sampler).should_sample
    if kind is StaticSampler.should_sample:
        on = sampler._decision.is_sampled()
        return lambda parent, trace_id: on
    if kind is TraceIdRatioBased.should_sample:
        limit, bound = sampler.TRACE_ID_LIMIT, sampler.bound
        return lambda parent, trace_id: trace_id & limit < bound
    if kind is not ParentBased.should_sample:
        return None
    rules = [
        _sampling_rule(s)
        for s in (
            sampler._root,
            sampler._local_parent_not_sampled,
            sampler._local_parent_sampled,
            sampler._remote_parent_not_sampled,
            sampler._remote_parent_sampled,
        )
    ]
    if any(r is None for r in rules):
        return None
    root, by_parent = rules[0], rules[1:]  # indexed by 2 * remote + sampled flag

    def parent_based(parent: tuple | None, trace_id: int) -> bool:
        if parent is None:
            return root(None, trace_id)
        return by_parent[2 * parent[3] + (parent[2] & 1)](parent, trace_id)

    return parent_based


_STATE: _State | None = None
_LOCK = threading.Lock()


def tracer() -> Any:
    """The tracer, or None while tracing is off (the first call decides, from the environment)."""
    state = _STATE
    if state is None:
        state = _resolve()
    return state.tracer


def enabled() -> bool:
    return tracer() is not None


def wanted(env: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (see the module docstring)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() in ON_VALUES:
        return False
    exporters = env.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters == "none":
        return False
    override = env.get("ROUTEOPT_TRACING", "").strip().lower()
    if override in OFF_VALUES:
        return False
    if override in ON_VALUES:
        return True
    return bool(
        env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT")
        or exporters in ("otlp", "console")
    )


def _resolve() -> _State:
    global _STATE
    with _LOCK:
        if _STATE is None:
            _STATE = _from_environment() if wanted() else _State()
        return _STATE


def _from_environment() -> _State:
    try:
        exporter, name, endpoint = _env_exporter()
    except ImportError as exc:
        reason = (
            f"tracing was asked for but the OpenTelemetry SDK is missing ({exc}); install "
            "the tracing extra: pip install 'routeopt[tracing]'"
        )
        log.warning(reason)
        return _State(reason=reason)
    return _build(exporter, name, endpoint, batch=True, export_process=_export_in_process())


def _export_in_process() -> bool:
    """`ROUTEOPT_TRACING_EXPORT`: `process` (the default) builds and exports decision spans in
    a child process, off the gateway's GIL and core; `thread` does it in this process."""
    mode = os.environ.get("ROUTEOPT_TRACING_EXPORT", "process").strip().lower() or "process"
    if mode not in ("process", "thread"):
        log.warning("ROUTEOPT_TRACING_EXPORT=%r is neither 'process' nor 'thread'; using 'process'", mode)
    return mode != "thread"


def _env_exporter() -> tuple[Any, str, str | None]:
    """The exporter the standard variables name: console, OTLP over gRPC, or OTLP over HTTP."""
    env = os.environ
    if env.get("OTEL_TRACES_EXPORTER", "").strip().lower() == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter(), "console", None
    protocol = (
        (
            env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
            or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
            or "http/protobuf"
        )
        .strip()
        .lower()
    )
    endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

        return OTLPSpanExporter(), "otlp/grpc", endpoint or "http://localhost:4317"
    if protocol != "http/protobuf":
        log.warning("OTLP protocol %r is not supported here; exporting with http/protobuf", protocol)
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter

    return HttpExporter(), "otlp/http", endpoint or "http://localhost:4318"


def configure(
    exporter: Any = None,
    *,
    batch: bool = True,
    max_queue_size: int | None = None,
    sampler: Any = None,
    service_name: str | None = None,
) -> TracingStatus:
    """Turn tracing on in code, with a given span exporter (tests, benchmarks, an application
    that exports its own way); without one, as the environment says. Replaces any earlier set-up."""
    global _STATE
    with _LOCK:
        old, _STATE = _STATE, None
    if old is not None and old.provider is not None:
        _shutdown(old)
    with _LOCK:
        if exporter is None:
            _STATE = _from_environment()
        else:
            _STATE = _build(
                exporter,
                type(exporter).__name__,
                None,
                batch=batch,
                max_queue_size=max_queue_size,
                sampler=sampler,
                service=service_name,
            )
    return status()


def disable() -> None:
    """Turn tracing off in this process (queued spans get the exit timeout to go)."""
    global _STATE
    with _LOCK:
        old, _STATE = _STATE, _State()
    if old is not None and old.provider is not None:
        _shutdown(old)


@contextlib.contextmanager
def paused() -> Iterator[None]:
    """Tracing off inside the block, as if never configured, and the set-up back after it, its
    threads and export process kept: a benchmark compares on and off in adjacent short blocks
    without paying a start-up in between. One thread's tool: other threads see it off too."""
    global _STATE
    with _LOCK:
        kept, _STATE = _STATE, _State()
    try:
        yield
    finally:
        with _LOCK:
            _STATE = kept


def _build(
    exporter: Any,
    name: str,
    endpoint: str | None,
    *,
    batch: bool,
    max_queue_size: int | None = None,
    sampler: Any = None,
    service: str | None = None,
    export_process: bool = False,
    decisions: bool = True,
) -> _State:
    """A provider exporting through `exporter`; decision spans are built by a thread here, or
    by the export process (`export_process`, which builds its own exporter from the
    environment), or not at all (`decisions=False`: the export process itself)."""
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

    attrs = {}
    if service or not (
        os.environ.get("OTEL_SERVICE_NAME")
        or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    ):
        attrs["service.name"] = service or "routeopt"
    provider = TracerProvider(resource=Resource.create(attrs), sampler=sampler, shutdown_on_exit=False)
    counts = _Counts()
    counted = _counting_exporter(exporter, counts)
    queue = max_queue_size or int(os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE", "2048"))
    inner = (
        BatchSpanProcessor(counted, max_queue_size=queue, max_export_batch_size=min(512, queue))
        if batch
        else SimpleSpanProcessor(counted)
    )
    gate = _gate(inner, counts, queue if batch else None)
    provider.add_span_processor(gate)
    state = _State(
        provider.get_tracer("routeopt"),
        provider,
        counts,
        name,
        endpoint,
        provider.resource.attributes.get("service.name"),
        processor=gate,
    )
    if decisions:
        remote = None
        if export_process:
            from routeopt.common.tracing_export import ExportProcess

            remote = ExportProcess(state.counts, service=service, queue=queue)
        state.deferred = _Deferred(state, queue, remote)
    _exit_hook()
    return state


@functools.cache
def _exit_hook() -> None:
    """At exit, shut down whatever set-up is current then (registered once, not per set-up)."""
    atexit.register(lambda: _shutdown(_STATE) if _STATE is not None else None)


def _counting_exporter(inner: Any, counts: _Counts) -> Any:
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class CountingExporter(SpanExporter):
        """Counts what the collector took and what it refused (never raises into the SDK)."""

        def export(self, spans: Any) -> Any:
            try:
                result = inner.export(spans)
            except Exception as exc:  # an exporter bug must not kill the export thread
                result, counts.last_error = SpanExportResult.FAILURE, repr(exc)
            if result == SpanExportResult.SUCCESS:
                counts.exported += len(spans)
            else:
                counts.failed += len(spans)
                if (
                    counts.last_error is None
                    or counts.failed == len(spans)
                    or counts.failed % 1000 < len(spans)
                ):
                    log.warning("trace export failed: %d spans not exported so far", counts.failed)
                counts.last_error = counts.last_error or "the collector did not take a batch"
            return result

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return getattr(inner, "force_flush", lambda *_: True)(timeout_millis)

    return CountingExporter()


def _gate(inner: Any, counts: _Counts, limit: int | None) -> Any:
    from opentelemetry.sdk.trace import SpanProcessor

    class Gate(SpanProcessor):
        """Drops (and counts) a finished span when `limit` spans already wait for the
        collector, instead of letting the SDK log a warning per dropped span."""

        def on_start(self, span: Any, parent_context: Any = None) -> None:
            inner.on_start(span, parent_context=parent_context)

        def on_end(self, span: Any) -> None:
            if limit is not None and counts.ended - counts.exported - counts.failed >= limit:
                counts.dropped += 1
                return
            counts.ended += 1
            inner.on_end(span)

        def shutdown(self) -> None:
            inner.shutdown()

        def force_flush(self, timeout_millis: int = 30_000) -> bool:
            return inner.force_flush(timeout_millis)

    return Gate()


def _shutdown(state: _State) -> None:
    """Give queued spans a bounded time to go (a dead collector must not hold up exit)."""
    if state.provider is None:
        return
    timeout_s = float(os.environ.get("ROUTEOPT_TRACING_EXIT_TIMEOUT_S", "2"))
    if state.deferred is not None:
        state.deferred.flush(timeout_s / 2)
        state.deferred.stop()
        if state.deferred.remote is not None:
            state.deferred.remote.close(timeout_s / 2)
    done = threading.Thread(target=state.provider.shutdown, name="routeopt-tracing-shutdown", daemon=True)
    done.start()
    done.join(timeout_s)


def flush(timeout_s: float = 30.0) -> bool:
    """Export what is queued now (tests, the end of a command); False if it did not finish."""
    state = _STATE
    if state is None or state.provider is None:
        return True
    deadline = time.monotonic() + timeout_s
    decisions = state.deferred.flush(timeout_s) if state.deferred is not None else True
    done: list[bool] = []
    worker = threading.Thread(
        target=lambda: done.append(bool(state.provider.force_flush())),
        name="routeopt-tracing-flush",
        daemon=True,
    )
    worker.start()
    worker.join(
        max(0.0, deadline - time.monotonic())
    )  # a dead or slow collector must not hold the caller longer
    return decisions and bool(done and done[0])


def status() -> TracingStatus:
    state = _STATE or _State()
    c, deferred = state.counts, state.deferred
    ended, exported, failed, dropped = c.ended, c.exported, c.failed, c.dropped
    queued = max(0, ended - exported - failed) + (len(deferred.queue) if deferred is not None else 0)
    last_error = c.last_error
    remote = deferred.remote if deferred is not None else None
    if remote is not None:  # what the export process did with the spans it was sent
        r = remote.counts()
        ended, exported, failed, dropped = (
            ended + r.ended,
            exported + r.exported,
            failed + r.failed,
            dropped + r.dropped,
        )
        queued += r.queued
        last_error = r.last_error or last_error
    return TracingStatus(
        state.tracer is not None,
        state.exporter,
        state.endpoint,
        state.service,
        ended,
        exported,
        failed,
        dropped,
        queued,
        last_error,
        state.reason,
    )


# -- spans --------------------------------------------------------------------------------------


def parent_context(traceparent: str | None) -> Any:
    """The OpenTelemetry context of a `traceparent` (None: the caller's current context)."""
    if parse_traceparent(traceparent) is None:
        return None
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    return TraceContextTextMapPropagator().extract({"traceparent": traceparent.strip()})  # type: ignore[union-attr]


def start_span(
    name: str,
    *,
    traceparent: str | None = None,
    attributes: Mapping[str, Any] | None = None,
    kind: str = "internal",
    start_ns: int | None = None,
) -> Any:
    """A started span (child of `traceparent`, else of the current span), or None when off.

    A sampled span is a `RecordedSpan` (common/tracing_spans.py): it keeps its values and, once
    ended, is built and exported the way decision spans are, off the caller's thread; one the
    sampler drops is the SDK's non-recording span, with its ids for the next hop."""
    state = _STATE
    if state is None:
        state = _resolve()
    if state.tracer is None:
        return None
    from opentelemetry import trace as api

    from routeopt.common.tracing_spans import RecordedSpan

    start = start_ns or time.time_ns()
    span_kind = api.SpanKind[kind.upper()]
    parent = _parent(traceparent)
    trace_id = parent[0] if parent else random.getrandbits(128) or 1
    span_id = random.getrandbits(64) or 1
    sampled = state.sampled(parent, trace_id, name, span_kind, attributes)
    random_bit = 0x02 if parent is None else parent[2] & 0x02
    context = api.SpanContext(
        trace_id,
        span_id,
        is_remote=False,
        trace_flags=api.TraceFlags((api.TraceFlags.SAMPLED if sampled else 0) | random_bit),
    )
    if not sampled:
        return api.NonRecordingSpan(context)
    if state.deferred is None:  # the export process's own set-up, which records no decisions either
        return state.tracer.start_span(
            name, context=parent_context(traceparent), kind=span_kind, attributes=attributes, start_time=start
        )
    return RecordedSpan(state.deferred.submit, name, span_kind.value, context, parent, start, attributes)


def ids(span: Any) -> tuple[str, str] | tuple[None, None]:
    """(trace id, span id) of a span in hex, as stored beside outcome rows and decisions."""
    if span is None:
        return None, None
    c = span.get_span_context()
    return f"{c.trace_id:032x}", f"{c.span_id:016x}"


def traceparent_of(span: Any) -> str | None:
    """The `traceparent` header that makes what the caller does next a child of `span`."""
    if span is None:
        return None
    c = span.get_span_context()
    return format_traceparent(c.trace_id, c.span_id, c.trace_flags.sampled)


def use(span: Any) -> Any:
    """Make `span` current for a `with` block (a no-op context without one); does not end it."""
    if span is None:
        return contextlib.nullcontext()
    from opentelemetry.trace import use_span

    return use_span(span, end_on_exit=False, record_exception=False, set_status_on_exception=False)


def current_span() -> Any:
    """The caller's current span if it is recording, else None."""
    from opentelemetry.trace import get_current_span

    span = get_current_span()
    return span if span.is_recording() else None


def set_error(span: Any, kind: str, message: str | None = None) -> None:
    from opentelemetry.trace import Status, StatusCode

    span.set_attribute("error.type", kind)
    span.set_status(Status(StatusCode.ERROR, (message or kind)[:500]))


# -- decisions ----------------------------------------------------------------------------------


def decision_attributes(
    decision: Any,
    *,
    request_id: str | None = None,
    channel: str | None = None,
    explored: bool | None = None,
    knob_target: float | None = None,
    suite: str | None = None,
) -> dict[str, Any]:
    """The decision span's attributes: the contract every runtime follows (docs/tracing.md).
    Never the prompt or its text."""
    return attributes_for(
        decision.model,
        decision.fallbacks,
        decision.propensity,
        decision.policy_version,
        request_id if request_id is not None else getattr(decision, "request_id", None),
        default_reason=getattr(decision, "default_reason", None),
        channel=channel,
        explored=explored,
        knob_target=knob_target,
        suite=suite,
    )


def attributes_for(
    model: str,
    fallbacks: Any,
    propensity: float,
    policy_version: int,
    request_id: str | None,
    *,
    default_reason: str | None = None,
    channel: str | None = None,
    explored: bool | None = None,
    knob_target: float | None = None,
    suite: str | None = None,
) -> dict[str, Any]:
    """`decision_attributes` from the values themselves (the gateway has them before its
    Decision exists)."""
    attrs: dict[str, Any] = {
        "routeopt.decision.model": model,
        "routeopt.decision.fallbacks": list(fallbacks),
        "routeopt.decision.propensity": float(propensity),
        "routeopt.policy.version": int(policy_version),
    }
    for key, value in (
        ("routeopt.decision.id", request_id),
        ("routeopt.policy.channel", channel),
        ("routeopt.decision.explored", explored),
        ("routeopt.knob.target", knob_target),
        ("routeopt.suite", suite),
        ("routeopt.decision.default_reason", default_reason),
    ):
        if value is not None:
            attrs[key] = value
    return attrs


def record_decision(
    traceparent: str | None, start_ns: int, attributes: Mapping[str, Any] | Callable[[], Mapping[str, Any]]
) -> tuple[str | None, str | None, str | None]:
    """Record one finished decision as a span; returns (traceparent to send back, trace id,
    span id). The span starts at `start_ns` (time.time_ns() before deciding) and ends now; its
    parent is the caller's `traceparent`, else the caller's current span, else none.

    The caller's thread only draws the ids, asks the sampler and queues the span: a writer
    thread builds it (a few microseconds here instead of tens; the decision is on a request's
    path). A full queue drops the span and counts it. `attributes` may be a function that makes
    them (from immutable values): the writer thread calls it, not the caller's.

    With tracing off it records nothing and hands back the caller's own valid `traceparent`
    (the application's next span stays a child of the caller's) and its trace id."""
    state = _STATE
    if state is None:
        state = _resolve()
    if state.tracer is None:
        parsed = parse_traceparent(traceparent)
        return (traceparent.strip(), parsed[0], None) if parsed else (None, None, None)  # type: ignore[union-attr]
    end_ns = time.time_ns()
    parent = _parent(traceparent)
    trace_id = parent[0] if parent else random.getrandbits(128) or 1
    span_id = random.getrandbits(64) or 1
    sampled = state.sampled(parent, trace_id)
    if sampled:
        state.deferred.submit((parent, trace_id, span_id, start_ns, end_ns, attributes))
    header = format_traceparent(trace_id, span_id, sampled)
    return header, header[3:35], header[36:52]  # the ids as the header spells them


def _parent(traceparent: str | None) -> tuple[int, int, int, bool] | None:
    """(trace id, span id, flags, remote) of the caller's header, else of its current span."""
    parsed = parse_traceparent(traceparent)
    if parsed is not None:
        return int(parsed[0], 16), int(parsed[1], 16), int(parsed[2], 16), True
    c = _current_span().get_span_context()
    return (c.trace_id, c.span_id, int(c.trace_flags), c.is_remote) if c.is_valid else None


def _current_span() -> Any:
    from opentelemetry.trace import get_current_span

    globals()["_current_span"] = get_current_span  # the import once, not on every decision
    return get_current_span()


class _Deferred:
    """Takes queued decision spans off the callers' threads, with the ids already handed out:
    one daemon thread builds them here, or (`remote`) sends them to the export process, which
    builds, encodes and exports them on another core (common/tracing_export.py)."""

    def __init__(self, state: "_State", limit: int, remote: Any = None) -> None:
        self.state, self.limit, self.remote = state, limit, remote
        self.batch = max(1, min(256, limit // 2))  # wake the thread before the queue is full
        self.queue: collections.deque = collections.deque()
        self.wake = threading.Event()
        self.busy = self.stopped = False
        self.thread = threading.Thread(target=self._run, name="routeopt-tracing-decisions", daemon=True)
        self.thread.start()

    def submit(self, item: tuple) -> None:
        if self.stopped or len(self.queue) >= self.limit:
            self.state.counts.dropped += 1
            return
        self.queue.append(item)
        if len(self.queue) >= self.batch:
            self.wake.set()

    def _run(self) -> None:
        while not self.stopped:
            self.wake.wait(0.2)
            self.wake.clear()
            self.drain()

    def stop(self) -> None:
        """End the thread once its set-up is replaced or shut down; what is still queued then
        is dropped and counted (the caller flushed first, within its time)."""
        self.stopped = True
        self.wake.set()
        self.thread.join(1.0)
        self.state.counts.dropped += len(self.queue)
        self.queue.clear()

    def drain(self) -> None:
        self.busy = True
        try:
            if self.remote is not None:
                self._send()
            else:
                from routeopt.common.tracing_spans import SpanBuilder

                build = SpanBuilder(self.state.provider.resource, DECISION_SPAN)
                while self.queue:
                    self.state.processor.on_end(build(self.queue.popleft()))
        except Exception as exc:  # never let one bad span stop the thread
            self.state.counts.last_error = repr(exc)
        finally:
            self.busy = False

    def _send(self) -> None:
        """Hand the export process the queued spans, their attributes made here (a function
        the caller gave runs in the caller's process)."""
        while self.queue:
            batch = []
            while self.queue and len(batch) < 512:
                item = self.queue.popleft()
                batch.append(item if not callable(item[5]) else (*item[:5], item[5](), *item[6:]))
            self.remote.send(batch)

    def flush(self, timeout_s: float) -> bool:
        """Build or send what is queued; with the export process, until it has exported too.
        False if that did not finish in time."""
        deadline = time.monotonic() + timeout_s
        while (self.queue or self.busy) and time.monotonic() < deadline:
            self.wake.set()
            time.sleep(0.005)
        if self.queue or self.busy:
            return False
        return self.remote is None or self.remote.flush(max(0.0, deadline - time.monotonic()))
