"""Decision spans: a child of the caller's traceparent, the header handed back, the trace id in the
decision log and the store; and with tracing off, nothing imported and nothing recorded."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway, verbatim
from routeopt.artifacts.serving.loader import load
from routeopt.common import tracing
from tests import REPO
from tests.artifacts.policies import PROMPTS
from tests.artifacts.serving.test_gateway import FakeRouter

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


def test_a_gateway_decision_is_one_span_under_the_callers_trace(memory, tmp_path: Path) -> None:
    gw = Gateway(
        FakeRouter(), log=DecisionLog(tmp_path, redact=verbatim), exploration=Exploration(rate=0.0001, seed=1)
    )
    d = gw.route("What is 2 + 2?", "add", 0.9, request_id="req-7", traceparent=PARENT)
    gw.log.flush()
    assert tracing.flush()
    (span,) = memory.get_finished_spans()  # the router inside the gateway records none of its own
    assert span.name == "routeopt.route" and span.kind.name == "SERVER"
    assert f"{span.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736" == d.trace_id
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert d.traceparent == f"00-{d.trace_id}-{span.context.span_id:016x}-01"
    assert dict(span.attributes) == {
        "routeopt.decision.model": "cheap",
        "routeopt.decision.fallbacks": ("mid", "dear", "banned"),
        "routeopt.decision.propensity": d.propensity,
        "routeopt.policy.version": 1,
        "routeopt.decision.id": "req-7",
        "routeopt.policy.channel": "champion",
        "routeopt.decision.explored": False,
        "routeopt.knob.target": 0.9,
        "routeopt.suite": "add",
    }
    assert "What is 2" not in span.to_json()  # never the prompt
    (rec,) = [json.loads(x) for f in tmp_path.glob("*.jsonl") for x in f.read_text().splitlines()]
    assert rec["trace_id"] == d.trace_id and rec["span_id"] == f"{span.context.span_id:016x}"


def test_the_applications_llm_span_becomes_a_child_of_the_decision(memory) -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    d = Gateway(FakeRouter()).route("hi", request_id="r1", traceparent=PARENT)
    assert tracing.flush()
    app = TracerProvider()  # the application's own tracing, exporting where ours does
    app.add_span_processor(SimpleSpanProcessor(memory))
    ctx = TraceContextTextMapPropagator().extract({"traceparent": d.traceparent})
    app.get_tracer("app").start_span(f"chat {d.model}", context=ctx).end()
    decision, call = memory.get_finished_spans()
    assert call.parent.span_id == decision.context.span_id
    assert call.context.trace_id == decision.context.trace_id


def test_a_router_alone_records_a_span_with_its_knob_target(
    memory, policies, publish_to, registry, keypair
) -> None:
    publish_to(policies[0])
    router = load(registry, keypair[1])
    d = router.route(*PROMPTS[0])  # no header: a new trace (no current span here)
    assert tracing.flush()
    (span,) = memory.get_finished_spans()
    assert span.parent is None and d.trace_id == f"{span.context.trace_id:032x}"
    assert span.attributes["routeopt.knob.target"] == policies[0].quality_target
    assert span.attributes["routeopt.decision.model"] == d.model


def test_off_the_header_is_handed_back_and_the_log_still_joins(tmp_path: Path) -> None:
    tracing.disable()
    gw = Gateway(FakeRouter(), log=DecisionLog(tmp_path))
    d = gw.route("hi", request_id="r1", traceparent=PARENT)
    assert d.traceparent == PARENT and d.trace_id == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert gw.route("hi", request_id="r2").trace_id is None
    gw.close()
    recs = {
        r["request_id"]: r
        for f in tmp_path.glob("*.jsonl")
        for r in map(json.loads, f.read_text().splitlines())
    }
    assert recs["r1"]["trace_id"] == d.trace_id and "span_id" not in recs["r1"]
    assert "trace_id" not in recs["r2"]


def test_the_trace_id_is_imported_with_the_decision(memory, tmp_path: Path) -> None:
    from routeopt.evals.storage.store import Store
    from routeopt.evals.storage.traffic import import_decisions

    gw = Gateway(FakeRouter(), log=DecisionLog(tmp_path / "log"))
    d = gw.route("hi", request_id="r1", traceparent=PARENT)
    gw.close()
    assert tracing.flush()
    with Store(tmp_path / "db.duckdb") as store:
        import_decisions(tmp_path / "log", store)
        row = store.query("SELECT trace_id, span_id FROM decisions").iloc[0]
    assert row.trace_id == d.trace_id and d.traceparent.split("-")[2] == row.span_id


GATEWAY_SCRIPT = """
import json, sys, tempfile
before = set(sys.modules)
from routeopt.artifacts.serving.gateway import Gateway
gw = Gateway.open(sys.argv[1], public_key=sys.argv[2], log_dir=tempfile.mkdtemp())
d = gw.route("Reverse the string: abcdef", suite="reverse", request_id="r1",
             traceparent="00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
gw.close()
loaded = sorted({".".join(m.split(".")[:2]) if m.startswith("routeopt.") else m.split(".")[0]
                 for m in set(sys.modules) - before} - set(sys.stdlib_module_names))
print(json.dumps({"traceparent": d.traceparent, "loaded": loaded}))
"""


@pytest.mark.parametrize(
    "env",
    [{}, {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9", "OTEL_SDK_DISABLED": "true"}],
    ids=["unset", "disabled"],
)
def test_tracing_off_imports_nothing_on_the_gateways_path(
    env, policies, publish_to, registry, keypair
) -> None:
    publish_to(policies[0])
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "ROUTEOPT_TRACING"))}
    out = subprocess.run(
        [sys.executable, "-c", GATEWAY_SCRIPT, str(registry), str(keypair[1])],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        env={**clean, **env},
    )
    result = json.loads(out.stdout)
    assert result["traceparent"] == "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    assert set(result["loaded"]) <= {
        "numpy",
        "cryptography",
        "_cffi_backend",
        "_openssl",
        "routeopt",
        "routeopt.artifacts",
        "routeopt.router_training",
        "routeopt.common",
        "wasmtime",  # the fast extra's WebAssembly kernel, where installed
    }, result["loaded"]
