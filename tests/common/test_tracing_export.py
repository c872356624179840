"""routeopt.common.tracing_export: decision spans exported by a child process reach a real OTLP/HTTP
receiver intact, and the child's death, a refusing collector or the gateway's exit lose no call
and leave no process behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from routeopt.common import tracing, tracing_export
from tests import REPO

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
np = pytest.importorskip("numpy")

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


class Receiver:
    """An OTLP/HTTP receiver in this process that keeps every span it decodes."""

    def __init__(self) -> None:
        spans, resources = [], []

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 - the http.server API
                from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

                req = ExportTraceServiceRequest.FromString(
                    self.rfile.read(int(self.headers["Content-Length"]))
                )
                for rs in req.resource_spans:
                    resources.append({a.key: a.value.string_value for a in rs.resource.attributes})
                    spans.extend(s for ss in rs.scope_spans for s in ss.spans)
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args: object) -> None:
                pass

        self.spans, self.resources = spans, resources
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()


@pytest.fixture
def receiver(monkeypatch):
    r = Receiver()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", r.url)
    monkeypatch.setenv("OTEL_SERVICE_NAME", "gateway-under-test")
    monkeypatch.delenv("ROUTEOPT_TRACING_EXPORT", raising=False)
    yield r
    tracing.disable()
    r.close()


def _remote() -> tracing_export.ExportProcess:
    remote = tracing._STATE.deferred.remote  # type: ignore[union-attr]
    assert remote is not None, "the environment's set-up exports decisions from another process"
    return remote


def _attrs(i: int) -> dict:
    return {
        "routeopt.decision.model": f"m{i % 3}",
        "routeopt.policy.version": 7,
        "routeopt.decision.fallbacks": ["a", "b"],
        "routeopt.decision.propensity": np.float64(0.875),
        "routeopt.knob.target": 0.9,
        "routeopt.decision.explored": np.bool_(i % 2 == 0),
        "routeopt.request.n": np.int64(i),
    }


def test_decisions_are_built_and_exported_by_another_process(receiver: Receiver) -> None:
    assert tracing.configure().exporter == "otlp/http"
    handed = [
        tracing.record_decision(PARENT, time.time_ns(), (lambda i=i: _attrs(i)) if i % 2 else _attrs(i))
        for i in range(300)
    ]
    assert tracing.flush(30)
    remote = _remote()
    assert remote.proc is not None and remote.proc.pid != os.getpid()
    s = tracing.status()
    assert (s.ended, s.exported, s.dropped, s.queued) == (300, 300, 0, 0)
    assert tracing._STATE.counts.ended == 0  # type: ignore[union-attr]  # no span was built in this process
    nice = os.getpriority(
        os.PRIO_PROCESS, remote.proc.pid
    )  # background work: the gateway goes first for a core
    assert nice == min(19, os.getpriority(os.PRIO_PROCESS, 0) + tracing_export.NICE)
    assert len(receiver.spans) == 300
    assert {r.get("service.name") for r in receiver.resources} == {"gateway-under-test"}
    by_id = {s.span_id.hex(): s for s in receiver.spans}
    for i, (header, trace_id, span_id) in enumerate(handed):
        span = by_id[span_id]
        assert span.name == tracing.DECISION_SPAN and span.trace_id.hex() == trace_id == PARENT[3:35]
        assert span.parent_span_id.hex() == PARENT[36:52] and header.endswith(f"{span_id}-01")
        got = {a.key: a.value for a in span.attributes}
        assert got["routeopt.decision.model"].string_value == f"m{i % 3}"
        assert got["routeopt.decision.propensity"].double_value == 0.875
        assert got["routeopt.decision.explored"].bool_value is (i % 2 == 0)
        assert got["routeopt.request.n"].int_value == i  # a numpy scalar arrives as the number
        assert [v.string_value for v in got["routeopt.decision.fallbacks"].array_value.values] == ["a", "b"]


def test_a_killed_export_process_fails_no_call_and_its_spans_are_counted(
    receiver: Receiver, monkeypatch
) -> None:
    tracing.configure()
    for _ in range(100):
        tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
    assert tracing.flush(30)
    remote = _remote()
    first = remote.proc
    first.kill()  # type: ignore[union-attr]
    with remote.changed:
        assert remote.changed.wait_for(lambda: remote.proc is None, 30)
    assert "exited with code -9" in (tracing.status().last_error or "")
    for _ in range(100):  # within the restart interval: sent nowhere, counted, and no call fails
        tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
    assert tracing.flush(30)
    s = tracing.status()
    assert (s.exported, s.dropped, s.queued) == (100, 100, 0) and remote.proc is None
    monkeypatch.setattr(tracing_export, "RESTART_S", 0.0)
    for _ in range(50):  # the next batch starts a new process
        tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
    assert tracing.flush(30)
    s = tracing.status()
    assert (s.exported, s.dropped, s.queued) == (150, 100, 0)
    assert remote.proc is not None and remote.proc.pid != first.pid  # type: ignore[union-attr]
    assert len(receiver.spans) == 150


def test_spans_a_collector_refuses_are_counted_by_the_export_process(receiver: Receiver, monkeypatch) -> None:
    receiver.close()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TIMEOUT", "1")  # the exporter's retries end within a second
    tracing.configure()
    for _ in range(40):
        tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
    tracing.flush(30)
    s = tracing.status()
    assert (s.ended, s.export_failed, s.exported, s.queued) == (40, 40, 0, 0)


def _gateway_script(n: int) -> str:
    return (
        "import os, sys, time\n"
        "from routeopt.common import tracing\n"
        f"for _ in range({n}):\n"
        "    tracing.record_decision(None, time.time_ns(), {'routeopt.decision.model': 'm'})\n"
        "while tracing._STATE.deferred.remote.proc is None: time.sleep(0.01)\n"
        "print(tracing._STATE.deferred.remote.proc.pid, flush=True)\n"
        "if sys.argv[1] == 'hang': time.sleep(600)\n"
    )


def _gone(pid: int, timeout_s: float = 30) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _run_gateway(receiver: Receiver, mode: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-c", _gateway_script(500), mode],
        stdout=subprocess.PIPE,
        text=True,
        cwd=REPO,
        env=env,
    )


def test_a_gateway_that_exits_has_its_spans_exported_and_its_export_process_ended(receiver: Receiver) -> None:
    gateway = _run_gateway(receiver, "exit")
    child = int(gateway.stdout.readline())  # type: ignore[union-attr]
    assert gateway.wait(60) == 0
    assert _gone(child)
    assert (
        len(receiver.spans) == 500
    )  # the exit hook sent them; the child exported them, maybe after the gateway ended


def test_a_killed_gateway_leaves_no_export_process_behind(receiver: Receiver) -> None:
    gateway = _run_gateway(receiver, "hang")
    child = int(gateway.stdout.readline())  # type: ignore[union-attr]
    gateway.send_signal(signal.SIGKILL)
    gateway.wait(30)
    assert _gone(child)  # its stdin closed with the gateway: it exported what it had and ended


def test_the_thread_mode_keeps_every_span_in_this_process(receiver: Receiver, monkeypatch) -> None:
    monkeypatch.setenv("ROUTEOPT_TRACING_EXPORT", "thread")
    tracing.configure()
    assert tracing._STATE.deferred.remote is None  # type: ignore[union-attr]
    for i in range(20):
        tracing.record_decision(PARENT, time.time_ns(), _attrs(i))
    assert tracing.flush(30)
    assert tracing.status().exported == 20 and len(receiver.spans) == 20


def test_a_slow_collector_holds_back_the_export_process_never_the_caller(
    receiver: Receiver, monkeypatch
) -> None:
    """The child stops reading while its queue is full, so the pipe and then the gateway's
    queue take the rest; every span is then either exported or counted dropped."""
    slow = receiver.server.RequestHandlerClass.do_POST

    def do_post(handler) -> None:  # type: ignore[no-untyped-def]
        time.sleep(0.2)
        slow(handler)

    monkeypatch.setattr(receiver.server.RequestHandlerClass, "do_POST", do_post)
    monkeypatch.setenv("OTEL_BSP_MAX_QUEUE_SIZE", "64")
    tracing.configure()
    for i in range(1000):
        tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "m"})
        if i % 100 == 0:
            time.sleep(0.01)
    assert tracing.flush(60)
    s = tracing.status()
    assert s.ended + s.dropped == 1000 and s.exported == s.ended == len(receiver.spans) and s.queued == 0


def test_the_nightlys_spans_reach_the_collector_whole_through_the_export_process(receiver: Receiver) -> None:
    """A recorded span's name, kind, parent, attributes, events, link and error status survive
    the pipe and the child's build; numpy values in an event arrive as numbers."""
    from opentelemetry import trace as api

    tracing.configure()
    linked = api.SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=api.TraceFlags(1))
    run = tracing.start_span("routeopt nightly", traceparent=PARENT, attributes={"routeopt.run_id": "r1"})
    with tracing.use(run):
        call = tracing.start_span("chat m", kind="client", attributes={"gen_ai.request.model": "m"})
    call.set_attributes(
        {"gen_ai.usage.input_tokens": np.int64(12), "gen_ai.response.finish_reasons": ["stop"]}
    )
    call.add_event("gen_ai.first_token", {"gen_ai.response.time_to_first_chunk": np.float64(0.25)})
    call.add_link(linked, {"routeopt.why": "retry"})
    tracing.set_error(call, "timeout", "the model did not answer")
    call.end()
    run.end()
    assert tracing.flush(30)
    assert tracing._STATE.counts.ended == 0  # type: ignore[union-attr]  # built by the child, not here
    by_name = {s.name: s for s in receiver.spans}
    got_run, got_call = by_name["routeopt nightly"], by_name["chat m"]
    assert got_run.parent_span_id.hex() == PARENT[36:52] and got_run.trace_id.hex() == PARENT[3:35]
    assert got_call.parent_span_id == got_run.span_id and got_call.kind == 3  # SPAN_KIND_CLIENT
    attrs = {a.key: a.value for a in got_call.attributes}
    assert (
        attrs["gen_ai.usage.input_tokens"].int_value == 12 and attrs["error.type"].string_value == "timeout"
    )
    assert [v.string_value for v in attrs["gen_ai.response.finish_reasons"].array_value.values] == ["stop"]
    (event,) = got_call.events
    assert event.name == "gen_ai.first_token" and event.attributes[0].value.double_value == 0.25
    (link,) = got_call.links
    assert int.from_bytes(link.span_id, "big") == 0xDEF and link.attributes[0].value.string_value == "retry"
    assert got_call.status.code == 2 and got_call.status.message == "the model did not answer"
