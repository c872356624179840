"""Traces in a real backend: Arize Phoenix, started by the test from its own virtualenv.

A small nightly (two fake model servers, one judged suite) exports over OTLP/HTTP, configured
the standard way (OTEL_EXPORTER_OTLP_ENDPOINT, OTEL_SERVICE_NAME); then a gateway decision on
the policy that nightly published exports over OTLP/gRPC, inside an application's request span,
followed by the application's own model call. Phoenix is queried for both trees and their
attributes, and its UI is rendered in headless Chromium: the trace page must name the spans, and
a screenshot is kept (`$ROUTEOPT_SCREENSHOT_DIR`, else the test's tmp folder).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import urllib.parse
from pathlib import Path

import pytest

from tests.fake_llm import FakeLLM, default_answer
from tests.flows.test_nightly_tracing import SECRETS, config
from tests.phoenix_server import Phoenix

pytestmark = pytest.mark.slow
pytest.importorskip("opentelemetry.exporter.otlp.proto.grpc", reason="the tracing extra is not installed")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


def _by_id(spans: list[dict]) -> dict[str, dict]:
    return {s["context"]["span_id"]: s for s in spans}


def _check_nightly_tree(spans: list[dict]) -> None:
    ids = _by_id(spans)
    (run,) = [s for s in spans if s["name"] == "routeopt nightly"]
    assert run["parent_id"] is None and run["attributes"]["routeopt.run_id"] == "phx-1"
    pairs = [s for s in spans if s["name"].startswith("evaluate ")]
    assert len(pairs) == 4 and all(s["parent_id"] == run["context"]["span_id"] for s in pairs)
    calls = [s for s in spans if s["name"].startswith("chat ")]
    answers = [s for s in calls if s["attributes"]["routeopt.role"] == "answer"]
    judges = [s for s in calls if s["attributes"]["routeopt.role"] == "judge"]
    assert len(answers) == 32 and len(judges) == 8
    for s in answers:
        a = s["attributes"]
        assert ids[s["parent_id"]]["name"] == f"evaluate {a['routeopt.suite']} x {a['routeopt.candidate']}"
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.request.model"] in ("big", "small") and a["gen_ai.response.finish_reasons"]
        assert a["gen_ai.response.time_to_first_chunk"] > 0 and a["routeopt.cost_usd"] > 0
        assert isinstance(a["routeopt.grade.passed"], bool)
    assert sorted({s["attributes"]["routeopt.attempts"] for s in answers}) == [1, 2]
    for j in judges:
        assert ids[j["parent_id"]]["attributes"]["routeopt.suite"] == "judged"


def _screenshot(phoenix: Phoenix, trace_id: str, out: Path | None) -> str:
    """Phoenix's trace page rendered by headless Chromium: its text, and a PNG at `out` where
    one is asked for (each rendering is seconds of CPU)."""
    project = phoenix.get("/v1/projects")["data"][0]["id"]
    url = f"{phoenix.url}/projects/{project}/traces/{urllib.parse.quote(trace_id)}"
    common = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--window-size=1600,1000",
        "--virtual-time-budget=20000",
    ]
    dom = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=180).stdout
    if out is not None:
        subprocess.run([*common, f"--screenshot={out}", url], capture_output=True, timeout=180)
    return dom


def test_the_nightly_and_a_decision_arrive_in_phoenix_as_whole_trees(
    tmp_path: Path, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.trace import format_trace_id

    import openai

    from routeopt.artifacts.serving.gateway import Gateway
    from routeopt.common import tracing
    from routeopt.evals.storage.store import Store
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("STRONG_KEY", SECRETS[0])
    monkeypatch.setenv("WEAK_KEY", SECRETS[1])
    with Phoenix() as phoenix, FakeLLM() as strong, FakeLLM() as weak:
        strong.answer_fn = lambda p: "Fine. SCORE: 9" if "SCORE" in p else default_answer(p)
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.url)
        monkeypatch.setenv("OTEL_SERVICE_NAME", "routeopt-nightly")
        assert tracing.configure().exporter == "otlp/http"
        try:
            result = nightly(config_path=str(config(tmp_path, strong, weak)), run_id="phx-1")
            db = tmp_path / "out" / "routeopt.duckdb"
            close_store(db)
            with Store(db, read_only=True) as store:
                (trace_id,) = store.query("SELECT DISTINCT trace_id FROM outcomes").trace_id
            assert tracing.flush(30)
            spans = phoenix.wait_for(trace_id, 1 + 4 + 32 + 8)
            _check_nightly_tree(spans)
            dumped = json.dumps(spans)
            assert not [s for s in SECRETS if s in dumped]

            # the gateway, over gRPC, inside the application's own request span
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")
            monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", phoenix.grpc_url)
            monkeypatch.setenv("OTEL_SERVICE_NAME", "routeopt-gateway")
            assert tracing.configure().exporter == "otlp/grpc"
            app = TracerProvider(resource=Resource.create({"service.name": "the-application"}))
            app.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{phoenix.url}/v1/traces")))
            tracer = app.get_tracer("app")
            gw = Gateway.open(
                tmp_path / "out" / "registry", result.published["public_key"], log_dir=tmp_path / "decisions"
            )
            with tracer.start_as_current_span("POST /answer") as request_span:
                incoming = request_span.get_span_context()
                header = f"00-{format_trace_id(incoming.trace_id)}-{incoming.span_id:016x}-01"
                d = gw.route("What is 20 + 22?", suite="arith", request_id="req-phx", traceparent=header)
                from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

                ctx = TraceContextTextMapPropagator().extract({"traceparent": d.traceparent})
                with tracer.start_as_current_span(f"chat {d.model}", context=ctx) as call:
                    call.set_attribute("gen_ai.request.model", d.model)
                    client = openai.OpenAI(base_url=strong.openai_base_url, api_key=SECRETS[0])
                    answer = client.chat.completions.create(
                        model=d.model,
                        messages=[{"role": "user", "content": "What is 20 + 22?"}],
                        extra_headers={"traceparent": d.traceparent},
                    )
                    call.set_attribute("gen_ai.usage.output_tokens", answer.usage.completion_tokens)
            gw.close()
            assert tracing.flush(30)
        finally:
            tracing.disable()
        app_trace = format_trace_id(incoming.trace_id)
        tree = phoenix.wait_for(app_trace, 3)
        assert strong.requests[-1].headers["traceparent"] == d.traceparent  # sent on to the model server
        root, decision, llm = (
            next(s for s in tree if s["name"] == n)
            for n in ("POST /answer", "routeopt.route", f"chat {d.model}")
        )
        assert decision["parent_id"] == root["context"]["span_id"]
        assert llm["parent_id"] == decision["context"]["span_id"]
        a = decision["attributes"]
        assert a["routeopt.decision.id"] == "req-phx" and a["routeopt.decision.model"] == d.model
        assert a["routeopt.policy.version"] == result.published["version"] and "routeopt.knob.target" in a
        assert list(a["routeopt.decision.fallbacks"]) == list(d.fallbacks)
        logged = [
            json.loads(x)
            for f in (tmp_path / "decisions").glob("*.jsonl")
            for x in f.read_text().splitlines()
        ]
        assert logged[0]["trace_id"] == app_trace == d.trace_id

        if CHROMIUM is None:
            pytest.skip("chromium is not installed: the UI was not looked at")
        shots = (
            Path(os.environ["ROUTEOPT_SCREENSHOT_DIR"]) if "ROUTEOPT_SCREENSHOT_DIR" in os.environ else None
        )
        if shots is not None:
            shots.mkdir(parents=True, exist_ok=True)
        page = _screenshot(phoenix, trace_id, shots and shots / "phoenix-nightly-trace.png")
        assert "routeopt nightly" in page and "evaluate judged x weak" in page
        page = _screenshot(phoenix, app_trace, shots and shots / "phoenix-decision-trace.png")
        assert "routeopt.route" in page and "POST /answer" in page
        if shots is not None:
            assert (shots / "phoenix-nightly-trace.png").stat().st_size > 20_000
