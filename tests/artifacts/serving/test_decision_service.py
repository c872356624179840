"""The decision service as a gateway calls it: decisions like the embedded runtime's, every kind of
bad input answered with a clear JSON error, readiness, metrics, hot swap and decision logs."""

from __future__ import annotations

import asyncio
import json
import re
import threading
from pathlib import Path

import httpx
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.serving.settings import GatewaySettings
from routeopt.artifacts.publish.registry import move_channel
from routeopt.artifacts.serving.loader import PolicyLoadError, load
from routeopt.artifacts.serving.decision_service import DecisionService, ServiceOptions
from routeopt.common import tracing
from tests.artifacts.policies import PROMPTS


def make_service(
    registry: Path, public_key: Path | None, *, start: bool = True, options=None, **settings
) -> DecisionService:
    settings.setdefault("refresh_s", 0)
    keys = (str(public_key),) if public_key else ()
    service = DecisionService(
        GatewaySettings(source=str(registry), public_keys=keys, **settings), options=options
    )
    if start:
        service.start()
    return service


def client(service: DecisionService) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=service), base_url="http://routeopt")


@pytest.fixture()
def published(policies, publish_to, registry, keypair):
    publish_to(policies[0])
    return Gateway(load(registry, keypair[1], state_dir=False))  # the embedded gateway, to compare with


@pytest.fixture()
def service(published, registry, keypair):
    s = make_service(registry, keypair[1])
    yield s
    s.close()


async def test_decisions_are_the_embedded_gateways_as_json_and_headers(service, published) -> None:
    async with client(service) as c:
        for target in (None, 0.0, 1.0):
            for prompt, suite in PROMPTS:
                body = {"prompt": prompt, "suite": suite, "request_id": f"r-{target}-{suite}"}
                if target is not None:
                    body["quality_target"] = target
                r = await c.post("/v1/route?explain=1", json=body)
                want = published.route(prompt, suite, target)
                assert r.status_code == 200, r.text
                got = r.json()
                assert (got["model"], got["fallbacks"], got["policy_version"]) == (
                    want.model,
                    list(want.fallbacks),
                    1,
                )
                assert got["pass_probabilities"] == pytest.approx(want.pass_probabilities)
                assert got["decision_id"] == body["request_id"] == r.headers["x-routeopt-decision-id"]
                assert r.headers["x-routeopt-model"] == want.model
                assert r.headers["x-routeopt-fallbacks"] == ",".join(want.fallbacks)
                assert r.headers["x-routeopt-policy-version"] == "1"
                assert float(r.headers["x-routeopt-propensity"]) == want.propensity


async def test_an_openai_chat_body_is_routed_on_its_messages(service, published) -> None:
    prompt, suite = PROMPTS[1]
    chat = {
        "model": "routeopt",
        "stream": True,
        "metadata": {"routeopt_suite": suite},
        "messages": [{"role": "user", "content": [{"type": "text", "text": prompt}]}],
    }
    async with client(service) as c:
        trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        r = await c.post(
            "/v1/route/v1/chat/completions",
            json=chat,
            headers={"x-request-id": "env-1", "traceparent": trace},
        )
        plain = await c.post(
            "/v1/route",
            content=prompt.encode(),
            headers={"content-type": "text/plain", "x-routeopt-suite": suite},
        )
    assert r.status_code == plain.status_code == 200
    assert r.json()["model"] == plain.json()["model"] == published.route(prompt, suite).model
    assert r.json()["decision_id"] == "env-1" and r.json()["suite"] == suite
    assert r.headers["traceparent"] == trace  # W3C trace context passes through the decision
    assert "pass_probabilities" not in r.json()  # only with ?explain=1


async def test_with_tracing_on_the_answer_names_the_decisions_span(service, published) -> None:
    """The decision is a span under the caller's trace; the header handed back names it, so the
    gateway's call of the model becomes its child. /metrics counts the spans exported."""
    pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False)
    try:
        trace = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
        async with client(service) as c:
            r = await c.post(
                "/v1/route",
                json={"prompt": PROMPTS[0][0], "suite": PROMPTS[0][1]},
                headers={"x-request-id": "t-1", "traceparent": trace},
            )
            assert tracing.flush()
            metrics = (await c.get("/metrics")).text
        (span,) = exporter.get_finished_spans()
    finally:
        tracing.disable()
    assert r.status_code == 200
    assert f"{span.parent.span_id:016x}" == "00f067aa0ba902b7"
    assert r.headers["traceparent"] == f"00-4bf92f3577b34da6a3ce929d0e0e4736-{span.context.span_id:016x}-01"
    assert span.attributes["routeopt.decision.id"] == "t-1"
    assert span.attributes["routeopt.decision.model"] == r.json()["model"]
    assert 'routeopt_tracing_spans_total{outcome="exported"} 1' in metrics


async def test_a_request_naming_another_model_passes_through(service) -> None:
    async with client(service) as c:
        r = await c.post("/v1/route", json={"model": "gpt-4o", "messages": []})
        metrics = (await c.get("/metrics")).text
    assert r.status_code == 200 and r.json() == {"model": "gpt-4o", "routed": False}
    assert r.headers["x-routeopt-model"] == "gpt-4o" and r.headers["x-routeopt-routed"] == "false"
    assert "routeopt_passthrough_total 1" in metrics


BAD = [
    (b"{not json", "application/json", 400, "not JSON: .* line 1 column 2"),
    (b'{"prompt": "\xff\xfe"}', "application/json", 400, "not UTF-8 text"),
    (b"", "application/json", 400, "the body is empty"),
    (b"[1, 2]", "application/json", 400, "JSON list, not an object"),
    (b"[" * 200_000 + b"]" * 200_000, "application/json", 400, "nests too deeply"),
    (b'{"messages": []}', "application/json", 400, "messages is empty"),
    (b'{"messages": [{"role": "user", "content": {"text": "x"}}]}', None, 400, r"content is a dict"),
    (b'{"suite": "sort"}', None, 400, "no prompt"),
    (b'{"prompt": "p", "quality_target": -0.5}', None, 400, "finite number >= 0"),
]


@pytest.mark.parametrize(
    "body, content_type, status, message",
    BAD,
    ids=[
        "malformed",
        "not-utf8",
        "empty",
        "list",
        "deep",
        "no-messages",
        "odd-content",
        "no-prompt",
        "target",
    ],
)
async def test_bad_input_is_a_clear_json_error_and_the_service_keeps_routing(
    service, body, content_type, status, message
) -> None:
    headers = {"content-type": content_type} if content_type else {}
    async with client(service) as c:
        r = await c.post("/v1/route", content=body, headers=headers)
        assert r.status_code == status and re.search(message, r.json()["error"]), r.text
        assert "x-routeopt-model" not in r.headers  # no model to copy: never a silent decision
        after = await c.post("/v1/route", json={"prompt": PROMPTS[0][0]})
    assert after.status_code == 200


async def test_size_limits_method_paths_and_cut_bodies(published, registry, keypair) -> None:
    service = make_service(registry, keypair[1], options=ServiceOptions(max_body_bytes=1000))
    big = json.dumps({"prompt": "x" * 2000}).encode()

    async def chunks():
        for i in range(0, len(big), 100):
            yield big[i : i + 100]

    async with client(service) as c:
        declared = await c.post("/v1/route", content=big)
        streamed = await c.post("/v1/route", content=chunks())  # no Content-Length: counted as read
        cut = await c.post("/v1/route", json={"prompt": "p"}, headers={"x-envoy-auth-partial-body": "true"})
        get = await c.get("/v1/route")
        missing = await c.post("/v2/route", json={"prompt": "p"})
        metrics = (await c.get("/metrics")).text
    assert declared.status_code == streamed.status_code == 413
    assert "limit is 1000" in declared.json()["error"] and "1000-byte limit" in streamed.json()["error"]
    assert cut.status_code == 413 and "max_request_bytes" in cut.json()["error"]
    assert get.status_code == 405 and get.headers["allow"] == "POST" and "auth_request" in get.json()["error"]
    assert missing.status_code == 404
    assert 'routeopt_refused_requests_total{reason="too_large"} 2' in metrics
    assert 'routeopt_refused_requests_total{reason="partial_body"} 1' in metrics
    service.close()


async def test_require_suite_refuses_requests_without_one(published, registry, keypair) -> None:
    service = make_service(registry, keypair[1], options=ServiceOptions(require_suite=True))
    async with client(service) as c:
        without = await c.post("/v1/route", json={"prompt": "p"})
        with_one = await c.post("/v1/route", json={"prompt": "p", "suite": "sort"})
    assert without.status_code == 400 and "no suite" in without.json()["error"]
    assert with_one.status_code == 200
    service.close()


async def test_prompts_of_any_characters_and_size_route_like_the_runtime(service, published) -> None:
    prompts = [
        "",
        " \t\n" * 50,
        "a\x00b",
        "\ud800 lone surrogate \udfff",
        "e\u0301\u0301",
        "😀" * 100,
        "שלום عالم",
        "漢字かな",
        "İı ς",
        "x" * (1 << 20),
    ]
    async with client(service) as c:
        for p in prompts:
            body = json.dumps({"prompt": p}).encode()  # lone surrogates travel as \ud800 escapes
            r = await c.post("/v1/route", content=body, headers={"content-type": "application/json"})
            assert r.status_code == 200, r.text
            assert r.json()["model"] == published.route(p).model
        raw = bytes(range(256)) * 8
        r = await c.post("/v1/route", content=raw, headers={"content-type": "application/octet-stream"})
    assert r.status_code == 200 and r.json()["model"] == published.route(raw.decode("utf-8", "replace")).model


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    body=st.one_of(
        st.binary(max_size=300),
        st.recursive(
            st.none() | st.booleans() | st.floats() | st.text(max_size=20),
            lambda kids: (
                st.lists(kids, max_size=4)
                | st.dictionaries(
                    st.sampled_from(
                        ["prompt", "messages", "content", "text", "suite", "model", "metadata", "x"]
                    ),
                    kids,
                    max_size=4,
                )
            ),
            max_leaves=12,
        ).map(lambda v: json.dumps(v).encode()),
    )
)
def test_any_body_gets_a_decision_or_a_json_error(service, body: bytes) -> None:
    async def go() -> httpx.Response:
        async with client(service) as c:
            return await c.post("/v1/route", content=body, headers={"content-type": "application/json"})

    r = asyncio.run(go())
    assert r.status_code in (200, 400), r.text
    assert ("error" in r.json()) == (r.status_code != 200)
    assert ("x-routeopt-model" in r.headers) == (r.status_code == 200)


async def test_health_readiness_status_and_metrics(service) -> None:
    async with client(service) as c:
        for _ in range(3):
            await c.post("/v1/route", json={"prompt": PROMPTS[0][0], "suite": PROMPTS[0][1]})
        await c.post("/v1/route", content=b"nope")
        health, ready = await c.get("/healthz"), await c.get("/readyz")
        status, metrics = await c.get("/v1/status"), await c.get("/metrics")
        head = await c.head("/metrics")
    assert health.json() == {"status": "ok"}
    assert ready.status_code == 200 and ready.json()["version"] == 1
    assert status.json()["champion"]["version"] == 1
    assert metrics.headers["content-type"].startswith("text/plain; version=0.0.4")
    text = metrics.text
    assert re.search(r'routeopt_decisions_total\{model="\w+",default_model="false"\} 3\n', text)
    assert 'routeopt_refused_requests_total{reason="bad_request"} 1' in text
    assert "routeopt_route_seconds_count 3" in text and 'routeopt_route_seconds_bucket{le="+Inf"} 3' in text
    assert "routeopt_policy_version 1" in text and "routeopt_ready 1" in text
    for line in text.splitlines():  # the text format: comments, or `name{labels} number`
        assert line.startswith("# ") or re.fullmatch(r"[a-z_]+(\{[^}]*\})? -?[0-9.e+]+", line), line
    assert head.status_code == 200 and head.content == b""


async def test_unready_until_a_policy_is_published_then_ready(
    policies, publish_to, registry, keypair
) -> None:
    service = make_service(registry, keypair[1], refresh_s=0.05)
    try:
        async with client(service) as c:
            ready, routed = await c.get("/readyz"), await c.post("/v1/route", json={"prompt": "p"})
            assert ready.status_code == 503 and "no policy loaded yet" in ready.json()["reason"]
            assert routed.status_code == 503 and "cannot route yet" in routed.json()["error"]
            assert "routeopt_ready 0" in (await c.get("/metrics")).text
            publish_to(policies[0])
            for _ in range(2000):  # the retry thread loads it on one of its next polls
                if (await c.get("/readyz")).status_code == 200:
                    break
                await asyncio.sleep(0.01)
            assert (await c.post("/v1/route", json={"prompt": "p"})).json()["policy_version"] == 1
    finally:
        service.close()


async def test_a_default_model_serves_while_there_is_no_policy(registry, keypair) -> None:
    service = make_service(registry, keypair[1], default_model="fallback-model")
    async with client(service) as c:
        ready, r = await c.get("/readyz"), await c.post("/v1/route", json={"prompt": "p"})
    assert ready.status_code == 200 and ready.json()["serving_default"] is True
    assert r.json()["model"] == "fallback-model" and r.json()["policy_version"] == 0
    assert "no valid policy" in r.headers["x-routeopt-default-reason"]
    service.close()


def test_a_key_that_cannot_be_read_stops_the_start(published, registry, tmp_path) -> None:
    (tmp_path / "bad.pem").write_text("not a key")
    service = make_service(registry, tmp_path / "bad.pem", start=False)
    with pytest.raises(PolicyLoadError, match="cannot verify policies") as err:
        service.start()
    assert err.value.kind == "config"


async def test_hot_swap_and_refused_versions_while_serving(
    policies, publish_to, registry, keypair, other_keypair
) -> None:
    publish_to(policies[0])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    service = make_service(registry, keypair[1], refresh_s=0)
    champion = service.gateway.champion
    async with client(service) as c:
        publish_to(policies[1], signing_key=other_keypair[0])  # signed by a key the service does not trust
        move_channel(registry, "champion", 2, signing_key=keypair[0])
        assert champion.refresh() is False
        assert (await c.post("/v1/route", json={"prompt": "p"})).json()["policy_version"] == 1
        publish_to(policies[1])
        move_channel(registry, "champion", 3, signing_key=keypair[0])
        assert champion.refresh() is True
        r = await c.post("/v1/route", json={"prompt": PROMPTS[1][0], "suite": PROMPTS[1][1]})
        metrics = (await c.get("/metrics")).text
    assert r.json()["policy_version"] == 3
    assert r.json()["model"] == load(registry, keypair[1], state_dir=False).route(*PROMPTS[1]).model
    assert 'routeopt_policy_events_total{kind="rejected"} 1' in metrics
    assert 'routeopt_policy_events_total{kind="swapped"} 1' in metrics
    assert "routeopt_policy_swaps_total 1" in metrics and "routeopt_policy_version 3" in metrics
    service.close()


async def test_a_registry_that_hangs_never_holds_up_a_decision(published, registry, keypair) -> None:
    """The refresher blocks inside a registry that does not answer; requests still get decisions."""
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from routeopt.artifacts.serving.backends import LocalBackend

    backend, polled, release = LocalBackend(registry), threading.Event(), threading.Event()

    class Registry(BaseHTTPRequestHandler):
        hang = False

        def do_GET(self) -> None:  # noqa: N802
            if Registry.hang and "channels/" in self.path:
                polled.set()
                release.wait(30)
            try:
                data, etag = backend.get(self.path.lstrip("/"))
            except Exception:
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Registry)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    service = make_service(f"http://127.0.0.1:{server.server_address[1]}/", keypair[1])
    try:
        Registry.hang = True
        poll = threading.Thread(target=service.gateway.champion.refresh, daemon=True)
        poll.start()
        assert polled.wait(30)
        async with client(service) as c:
            answers = [await c.post("/v1/route", json={"prompt": p, "suite": s}) for p, s in PROMPTS]
        assert poll.is_alive()  # still waiting on the registry
        assert [a.json()["model"] for a in answers] == [published.route(p, s).model for p, s in PROMPTS]
    finally:
        release.set()
        server.shutdown()
        service.close()


async def test_registry_garbage_keeps_the_last_good_policy(published, registry, keypair) -> None:
    service = make_service(registry, keypair[1])
    (registry / "channels" / "latest.json").write_bytes(b"\x00garbage{")
    assert service.gateway.champion.refresh() is False
    async with client(service) as c:
        r, ready = await c.post("/v1/route", json={"prompt": "p"}), await c.get("/readyz")
        metrics = (await c.get("/metrics")).text
    assert r.json()["policy_version"] == 1 and ready.status_code == 200
    assert re.search(r'routeopt_policy_events_total\{kind="(rejected|unreachable)"\} 1', metrics)
    service.close()


async def test_decisions_are_logged_as_the_embedded_gateway_logs_them(
    published, registry, keypair, tmp_path
) -> None:
    service = make_service(registry, keypair[1], log_dir=str(tmp_path / "log"))
    async with client(service) as c:
        answers = [
            (await c.post("/v1/route", json={"prompt": p, "suite": s, "request_id": f"id-{i}"})).json()
            for i, (p, s) in enumerate(PROMPTS)
        ]
    service.close()  # writes what is queued
    records = [
        json.loads(line)
        for f in sorted((tmp_path / "log").glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    assert [(r["request_id"], r["model"], r["suite"]) for r in records] == [
        (a["decision_id"], a["model"], s) for a, (_, s) in zip(answers, PROMPTS)
    ]
    assert all(r["kind"] == "decision" and "text" not in r for r in records)  # no prompt text without a hook


async def test_a_clients_key_reaches_no_answer_metric_or_log(published, registry, keypair, tmp_path) -> None:
    secret = "sk-live-do-not-leak-4f7a"
    service = make_service(registry, keypair[1], log_dir=str(tmp_path / "log"))
    async with client(service) as c:
        outputs = [
            await c.post(
                "/v1/route",
                json={"prompt": "p", "suite": "sort"},
                headers={"authorization": f"Bearer {secret}", "x-api-key": secret},
            ),
            await c.post("/v1/route", content=b"{bad", headers={"authorization": f"Bearer {secret}"}),
            await c.get("/metrics"),
            await c.get("/v1/status"),
            await c.get("/readyz"),
        ]
    service.close()
    written = "".join(f.read_text() for f in (tmp_path / "log").glob("*.jsonl"))
    assert written and outputs[0].status_code == 200
    for r in outputs:
        assert secret not in r.text and secret not in str(r.headers)
    assert secret not in written


async def test_a_policy_that_fails_verification_leaves_the_service_unready_not_down(
    policies, publish_to, registry, keypair, other_keypair
) -> None:
    publish_to(policies[0], signing_key=other_keypair[0])  # signed, but not by the trusted key
    service = make_service(registry, keypair[1], refresh_s=3600)
    async with client(service) as c:
        ready, routed = await c.get("/readyz"), await c.post("/v1/route", json={"prompt": "p"})
        health = await c.get("/healthz")
    service.close()
    assert health.status_code == 200 and ready.status_code == 503
    assert re.search(r"signed by key \w+, but the trusted key is", ready.json()["reason"])
    assert routed.status_code == 503 and "x-routeopt-model" not in routed.headers


def mixed_request(router) -> tuple[str, str, float]:
    """A request served at a knob point that mixes two rules (its policy_probability below 1)."""
    for target in (0.3, 0.5, 0.6, 0.7, 0.8, 0.85, 0.9, None):
        for i in range(40):
            prompt = f"sort task difficulty {i % 6}: " + "alpha beta " * (i % 7)
            if router.route(prompt, "sort", target).policy_probability < 1:
                return prompt, "sort", target
    raise AssertionError("no request of the test policy lands on a mixed knob point")


async def test_propensity_and_policy_probability_are_the_same_numbers_everywhere(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    """`propensity` (this request's probability of being served the model: 1 without exploration)
    and `policy_probability` (the knob point's mixing share) are one number each, from the
    in-process runtime, the service's JSON and headers, and the decision log."""
    publish_to(policies[0])
    router = load(registry, keypair[1], state_dir=False)
    prompt, suite, target = mixed_request(router)
    bare = router.route(prompt, suite, target)
    service = make_service(registry, keypair[1], log_dir=str(tmp_path / "log"))
    async with client(service) as c:
        r = await c.post(
            "/v1/route",
            json={"prompt": prompt, "suite": suite, "quality_target": target, "request_id": "mixed"},
        )
    service.close()
    (record,) = [
        json.loads(line) for f in (tmp_path / "log").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    got = r.json()
    assert got["model"] == bare.model == record["model"]
    assert (
        bare.propensity
        == got["propensity"]
        == float(r.headers["x-routeopt-propensity"])
        == record["propensity"]
        == 1.0
    )
    assert (
        bare.policy_probability
        == got["policy_probability"]
        == record["policy_probability"]
        == float(r.headers["x-routeopt-policy-probability"])
        < 1
    )


async def test_a_suite_the_policy_does_not_know_is_counted_warned_once_and_logged(
    policies, publish_to, registry, keypair, tmp_path, caplog
) -> None:
    """The policy knows the suites it was trained on (`features.suites`); a request naming
    another routes on its prompt alone, and says so: in /metrics, the status, the decision log
    and one warning per name."""
    publish_to(policies[0])
    service = make_service(registry, keypair[1], log_dir=str(tmp_path / "log"))
    caplog.set_level("WARNING", logger="routeopt.runtime")
    async with client(service) as c:
        for suite in ("invoice-total", "invoice-total", "sort", None, "no-such", "invoice-total"):
            r = await c.post("/v1/route", json={"prompt": "sort task difficulty 2: alpha", "suite": suite})
            assert r.status_code == 200
            assert r.json().get("unknown_suite", False) == (suite in ("invoice-total", "no-such"))
        metrics = (await c.get("/metrics")).text
    status = service.gateway.status().champion
    service.close()
    assert status.unknown_suites == {"invoice-total": 3, "no-such": 1} and status.unknown_suite_requests == 4
    assert 'routeopt_unknown_suite_requests_total{suite="invoice-total"} 3' in metrics
    assert 'routeopt_unknown_suite_requests_total{suite="no-such"} 1' in metrics
    assert "routeopt_unknown_suite_requests_all_total 4" in metrics
    warned = [r.getMessage() for r in caplog.records if "not one the policy was trained on" in r.getMessage()]
    assert len(warned) == 2 and "'invoice-total'" in warned[0] and "'sort'" in warned[0]
    records = [
        json.loads(line) for f in (tmp_path / "log").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert [r.get("unknown_suite", False) for r in records] == [True, True, False, False, True, True]
