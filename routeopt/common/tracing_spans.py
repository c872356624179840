"""Spans that routeopt records itself, and how a recorded span becomes the SDK's finished span.

The SDK's own span is costly on the caller's thread: a nightly call span (started, five sets of
attributes, two events, ended) took 130 us there, and its export 215 us more on the SDK's thread,
about 8% of an eval call's CPU against the fake server (benchmarks/tracing_overhead.py). A
`RecordedSpan` is an OpenTelemetry API span (so `use_span`, `get_current_span` and an
application's own instrumentation see it as the current span) that only keeps its values; when
it ends it is queued like a decision span, and the tracing thread, or the export process
(common/tracing_export.py), builds it with `SpanBuilder` and exports it.

Imported only when tracing is on: it imports the SDK.
"""

from __future__ import annotations

import time
import traceback
from typing import Any, Callable, Mapping

from opentelemetry import trace as api
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.sdk.trace import Event, ReadableSpan, SpanLimits
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace.status import Status, StatusCode


SERVER = api.SpanKind.SERVER.value


class RecordedSpan(api.Span):
    """A sampled span that keeps its name, attributes, events, links and status until it ends,
    then hands them to `submit` as one plain tuple (the queued item `SpanBuilder` reads):
    (parent, trace id, span id, start, end, attributes, name, kind, events, status, links).

    `parent` is (trace id, span id, flags, remote) or None; events are (name, time, attributes);
    status is None or (code, description); links are (trace id, span id, flags, remote,
    tracestate header, attributes).

    It ends up as the span the SDK would have made from the same calls (tests/common/
    test_tracing_spans.py compares them), with one difference: values are cleaned (copied,
    cut to the length limit) when the span is built, so a list changed after it was set is
    exported as changed."""

    def __init__(
        self,
        submit: Callable[[tuple], None],
        name: str,
        kind: int,
        context: api.SpanContext,
        parent: tuple | None,
        start_ns: int,
        attributes: Mapping[str, Any] | None,
    ) -> None:
        self._submit, self._name, self._kind, self._context = submit, name, kind, context
        self._parent, self._start = parent, start_ns
        self._attributes: dict[str, Any] = dict(attributes) if attributes else {}
        self._events: list[tuple] = []
        self._links: list[tuple] = []
        self._status: tuple | None = None
        self._ended = False

    def get_span_context(self) -> api.SpanContext:
        return self._context

    def is_recording(self) -> bool:
        return not self._ended

    def set_attribute(self, key: str, value: Any) -> None:
        if not self._ended:
            attrs = self._attributes
            attrs.pop(key, None)  # a key set again moves to the end, as in the SDK's bounded map
            attrs[key] = value

    def set_attributes(self, attributes: Mapping[str, Any]) -> None:
        if not self._ended:
            attrs = self._attributes
            for key, value in attributes.items():
                attrs.pop(key, None)
                attrs[key] = value

    def add_event(
        self, name: str, attributes: Mapping[str, Any] | None = None, timestamp: int | None = None
    ) -> None:
        if not self._ended:
            self._events.append((name, timestamp or time.time_ns(), dict(attributes) if attributes else {}))

    def add_link(self, context: api.SpanContext, attributes: Mapping[str, Any] | None = None) -> None:
        if not self._ended and (context.is_valid or attributes or context.trace_state):
            self._links.append(
                (
                    context.trace_id,
                    context.span_id,
                    int(context.trace_flags),
                    context.is_remote,
                    context.trace_state.to_header(),
                    dict(attributes) if attributes else {},
                )
            )

    def update_name(self, name: str) -> None:
        if not self._ended:
            self._name = name

    def set_status(self, status: Status | StatusCode, description: str | None = None) -> None:
        """As the SDK does: OK is final, UNSET never replaces a status, a description only
        goes with ERROR."""
        if self._ended or (self._status is not None and self._status[0] == StatusCode.OK.value):
            return
        if isinstance(status, Status):
            code, description = status.status_code, status.description
        else:
            code = status
        if code is StatusCode.UNSET:
            return
        self._status = (code.value, description if code is StatusCode.ERROR else None)

    def record_exception(
        self,
        exception: BaseException,
        attributes: Mapping[str, Any] | None = None,
        timestamp: int | None = None,
        escaped: bool = False,
    ) -> None:
        """The SDK's `exception` event: type, message, stack trace, escaped."""
        kind, module = type(exception).__qualname__, type(exception).__module__
        attrs: dict[str, Any] = {
            "exception.type": f"{module}.{kind}" if module and module != "builtins" else kind,
            "exception.message": str(exception),
            "exception.stacktrace": "".join(traceback.format_exception(exception)),
            "exception.escaped": str(escaped),
        }
        attrs.update(attributes or {})
        self.add_event("exception", attrs, timestamp)

    def end(self, end_time: int | None = None) -> None:
        if self._ended:
            return
        self._ended = True
        self._submit(
            (
                self._parent,
                self._context.trace_id,
                self._context.span_id,
                self._start,
                end_time or time.time_ns(),
                self._attributes,
                self._name,
                self._kind,
                self._events,
                self._status,
                self._links,
            )
        )


class SpanBuilder:
    """Builds a queued span (a decision, or a `RecordedSpan`) as the finished span the SDK would
    make, with the provider's resource and attribute limits.

    The SDK's `start_span` + `end` cost 20 to 50 us a span here (sampling again, the span's lock,
    processors' start hooks); the caller already sampled and drew the ids, so only the finished
    span is built: about 8 us for a decision."""

    def __init__(self, resource: Any, decision_name: str) -> None:
        self.limits, self.scope, self.resource = SpanLimits(), InstrumentationScope("routeopt"), resource
        self.decision_name = decision_name  # the name of a span recorded without one: a decision's

    @staticmethod
    def _bounded(attrs: Any, limit: int, length: int | None) -> BoundedAttributes:
        return BoundedAttributes(limit, attrs, immutable=True, max_value_len=length)

    def __call__(self, item: tuple) -> ReadableSpan:
        limits = self.limits
        parent, trace_id, span_id, start, end, attrs, *rest = item
        name, kind, events, status, links = rest or (self.decision_name, SERVER, (), None, ())
        if callable(attrs):
            attrs = attrs()
        # W3C level 2: a trace id this process drew is random; a caller's says so itself
        random_bit = 0x02 if parent is None else parent[2] & 0x02
        context = api.SpanContext(
            trace_id,
            span_id,
            is_remote=False,
            trace_flags=api.TraceFlags(api.TraceFlags.SAMPLED | random_bit),
        )
        up = (
            None
            if parent is None
            else api.SpanContext(
                parent[0], parent[1], is_remote=parent[3], trace_flags=api.TraceFlags(parent[2])
            )
        )
        return ReadableSpan(
            name,
            context=context,
            parent=up,
            resource=self.resource,
            kind=api.SpanKind(kind),
            attributes=self._bounded(attrs, limits.max_span_attributes, limits.max_span_attribute_length),
            events=[
                Event(n, self._bounded(a, limits.max_event_attributes, limits.max_attribute_length), t)
                for n, t, a in _last(events, limits.max_events)
            ],
            links=[
                api.Link(
                    api.SpanContext(
                        t,
                        s,
                        is_remote=r,
                        trace_flags=api.TraceFlags(f),
                        trace_state=api.TraceState.from_header([h]) if h else None,
                    ),
                    self._bounded(a, limits.max_link_attributes, limits.max_attribute_length),
                )
                for t, s, f, r, h, a in _last(links, limits.max_links)
            ],
            status=Status(StatusCode(status[0]), status[1]) if status else Status(StatusCode.UNSET),
            start_time=start,
            end_time=end,
            instrumentation_scope=self.scope,
        )


def _last(items: Any, n: int | None) -> Any:
    """The last `n` (all with no limit): the SDK's bounded lists keep the newest."""
    return items if n is None else items[max(0, len(items) - n) :]
