"""The Envoy and Envoy AI Gateway configurations, without the Envoy binary (not installable here):
their structure, and Envoy's HTTP ext_authz contract replayed against the real decision service
exactly as Envoy's source defines it (ext_authz_http_impl.cc: the check request keeps the
method, prefixes the path, carries Host, Method, Path, Authorization, the allowed headers and the
buffered body with its Content-Length; a 200 copies the allowed response headers into the
request and, with clear_route_cache, routes again; a 5xx is an error, any other status a denial
passed to the client)."""

from __future__ import annotations

import json
import re
from typing import Any

import httpx
import pytest
import yaml

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.serving.settings import GatewaySettings
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.serving.decision_service import DecisionService, ServiceOptions
from tests import REPO
from tests.artifacts.policies import PROMPTS

ENVOY = REPO / "gateways" / "envoy"
HCM = "type.googleapis.com/envoy.extensions.filters.network.http_connection_manager.v3.HttpConnectionManager"


def _hcm() -> dict:
    config = yaml.safe_load((ENVOY / "envoy.yaml").read_text())
    (listener,) = config["static_resources"]["listeners"]
    (network_filter,) = listener["filter_chains"][0]["filters"]
    assert network_filter["typed_config"]["@type"] == HCM
    return network_filter["typed_config"]


def _filter(name: str) -> dict:
    return next(f["typed_config"] for f in _hcm()["http_filters"] if f["name"] == name)


def _matches(pattern: dict, value: str) -> bool:
    """Envoy's StringMatcher (exact, prefix, suffix, contains, safe_regex; ignore_case)."""
    if pattern.get("ignore_case"):
        value = value.lower()
    if "exact" in pattern:
        return value == pattern["exact"]
    if "prefix" in pattern:
        return value.startswith(pattern["prefix"])
    if "suffix" in pattern:
        return value.endswith(pattern["suffix"])
    if "contains" in pattern:
        return pattern["contains"] in value
    return re.fullmatch(pattern["safe_regex"]["regex"], value) is not None


class ExtAuthz:
    """Envoy's HTTP ext_authz filter as the shipped config sets it up."""

    ALWAYS = ("host", ":method", ":path", "authorization")  # plus Content-Length, set to the body's

    def __init__(self, config: dict) -> None:
        self.prefix = config["http_service"]["path_prefix"]
        self.allowed = config["allowed_headers"]["patterns"]
        self.upstream = config["http_service"]["authorization_response"]["allowed_upstream_headers"][
            "patterns"
        ]
        self.max_body = config["with_request_body"]["max_request_bytes"]
        self.fail_open = config["failure_mode_allow"]

    def check_request(
        self, method: str, path: str, headers: dict[str, str], body: bytes
    ) -> tuple[str, str, dict, bytes]:
        assert len(body) <= self.max_body  # else Envoy answers 413 itself (allow_partial_message: false)
        headers = {**{k.lower(): v for k, v in headers.items()}, "x-envoy-auth-partial-body": "false"}
        sent = {
            k: v for k, v in headers.items() if k in self.ALWAYS or any(_matches(p, k) for p in self.allowed)
        }
        sent["content-length"] = str(len(body))
        return method, self.prefix + path, sent, body

    def apply(self, response: httpx.Response, headers: dict[str, str]) -> tuple[str, Any]:
        """('allowed', the upstream request's headers) or ('denied', (status, body))."""
        if response.status_code >= 500:
            if self.fail_open:
                return "allowed", headers
            return "denied", (403, b"")
        if response.status_code != 200:
            return "denied", (response.status_code, response.content)
        copied = {k: v for k, v in response.headers.items() if any(_matches(p, k) for p in self.upstream)}
        return "allowed", {**headers, **copied}


def route(headers: dict[str, str], path: str) -> dict:
    """The first route of the shipped route_config that matches (prefix and exact header matches)."""
    for r in _hcm()["route_config"]["virtual_hosts"][0]["routes"]:
        m = r["match"]
        if not path.startswith(m.get("prefix", "")):
            continue
        if all(_matches(h["string_match"], headers.get(h["name"], "\0absent")) for h in m.get("headers", [])):
            return r
    raise AssertionError(f"no route for {path}")


def test_the_envoy_config_is_well_formed() -> None:
    config = yaml.safe_load((ENVOY / "envoy.yaml").read_text())
    clusters = {c["name"] for c in config["static_resources"]["clusters"]}
    hcm = _hcm()
    names = [f["name"] for f in hcm["http_filters"]]
    assert names == [
        "envoy.filters.http.header_mutation",
        "envoy.filters.http.ext_authz",
        "envoy.filters.http.lua",
        "envoy.filters.http.router",
    ]
    for f in hcm["http_filters"]:
        assert f["typed_config"]["@type"].startswith("type.googleapis.com/envoy.extensions.filters.http.")
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    assert {r["route"]["cluster"] for r in routes} <= clusters
    authz = _filter("envoy.filters.http.ext_authz")
    assert authz["http_service"]["server_uri"]["cluster"] in clusters
    assert authz["clear_route_cache"] is True and authz["with_request_body"]["allow_partial_message"] is False
    assert authz["with_request_body"]["max_request_bytes"] == ServiceOptions().max_body_bytes
    assert "x-routeopt-model" in _filter("envoy.filters.http.lua")["default_source_code"]["inline_string"]
    assert _filter("envoy.filters.http.header_mutation")["mutations"]["request_mutations"] == [
        {"remove": "x-routeopt-model"}
    ]


@pytest.fixture()
def service(policies, publish_to, registry, keypair):
    publish_to(policies[0])
    s = DecisionService(GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=0))
    s.start()
    yield s
    s.close()


def _client(service: DecisionService) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=service), base_url="http://routeopt:8700")


async def test_envoys_ext_authz_contract_routes_each_request_to_the_policys_cluster(
    service, registry, keypair
) -> None:
    authz = ExtAuthz(_filter("envoy.filters.http.ext_authz"))
    expected = Gateway(load(registry, keypair[1], state_dir=False))
    async with _client(service) as c:
        for i, (prompt, suite) in enumerate(PROMPTS * 3):
            chat = {
                "model": "routeopt",
                "stream": i % 2 == 1,
                "messages": [{"role": "user", "content": prompt}],
            }
            client_headers = {
                "content-type": "application/json",
                "authorization": "Bearer sk-client",
                "x-request-id": f"envoy-{i}",
                "x-forwarded-for": "10.0.0.1",
                **({"x-routeopt-suite": suite} if suite else {}),
            }
            body = json.dumps(chat).encode()
            method, path, headers, sent = authz.check_request(
                "POST", "/v1/chat/completions", client_headers, body
            )
            assert "x-forwarded-for" not in headers  # not an allowed header
            answer = await c.request(method, path, headers=headers, content=sent)
            outcome, upstream_headers = authz.apply(answer, client_headers)
            want = expected.route(prompt, suite)
            assert outcome == "allowed"
            assert upstream_headers["x-routeopt-model"] == want.model
            assert upstream_headers["x-routeopt-decision-id"] == f"envoy-{i}"
            assert route(upstream_headers, "/v1/chat/completions")["route"]["cluster"] == f"{want.model}_llm"


async def test_a_bad_request_is_denied_with_the_services_error(service) -> None:
    authz = ExtAuthz(_filter("envoy.filters.http.ext_authz"))
    async with _client(service) as c:
        method, path, headers, body = authz.check_request(
            "POST",
            "/v1/chat/completions",
            {"content-type": "application/json"},
            b'{"model": "routeopt", "messages": 5}',
        )
        outcome, (status, content) = authz.apply(
            await c.request(method, path, headers=headers, content=body), {}
        )
    assert outcome == "denied" and status == 400 and b"messages is a int" in content


async def test_an_unready_service_leaves_envoy_on_the_default_route(registry, keypair) -> None:
    unready = DecisionService(
        GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=3600)
    )
    unready.start()  # nothing published: not ready, answers 503
    authz = ExtAuthz(_filter("envoy.filters.http.ext_authz"))
    try:
        async with _client(unready) as c:
            client_headers = {"content-type": "application/json"}
            method, path, headers, body = authz.check_request(
                "POST", "/v1/chat/completions", client_headers, b'{"model": "routeopt", "prompt": "p"}'
            )
            answer = await c.request(method, path, headers=headers, content=body)
    finally:
        unready.close()
    assert answer.status_code == 503
    outcome, upstream_headers = authz.apply(answer, client_headers)
    chosen = route(upstream_headers, "/v1/chat/completions")
    assert outcome == "allowed" and "headers" not in chosen["match"]
    assert {h["header"]["key"]: h["header"]["value"] for h in chosen["request_headers_to_add"]} == {
        "x-routeopt-model": chosen["route"]["cluster"].removesuffix("_llm"),
        "x-routeopt-default-reason": "decision service unavailable",
    }


def _ai_gateway() -> dict[tuple[str, str], dict]:
    docs = [d for d in yaml.safe_load_all((ENVOY / "ai-gateway.yaml").read_text()) if d]
    return {(d["kind"], d["metadata"]["name"]): d for d in docs}


def test_the_ai_gateway_objects_refer_to_each_other_and_to_the_service() -> None:
    objects = _ai_gateway()
    deployment, service = objects[("Deployment", "routeopt")], objects[("Service", "routeopt")]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert (
        args[:2] == ["routeopt-gateway", "serve"]
        and args[args.index("--model-header") + 1] == "x-ai-eg-model"
    )
    port = int(args[args.index("--port") + 1])
    assert service["spec"]["ports"][0]["targetPort"] == port
    ext = objects[("SecurityPolicy", "routeopt")]["spec"]["extAuth"]
    (ref,) = ext["http"]["backendRefs"]
    assert (ref["name"], ref["port"]) == ("routeopt", service["spec"]["ports"][0]["port"])
    assert ext["http"]["path"] == "/v1/route" and ext["recomputeRoute"] is True
    assert "x-ai-eg-model" in ext["http"]["headersToBackend"]
    assert {"x-request-id", "x-routeopt-suite", "x-routeopt-quality-target"} <= set(ext["headersToExtAuth"])
    assert ext["bodyToExtAuth"]["maxRequestBytes"] == ServiceOptions().max_body_bytes
    route_name = objects[("SecurityPolicy", "routeopt")]["spec"]["targetRefs"][0]["name"]
    rules = objects[("AIGatewayRoute", route_name)]["spec"]["rules"]
    for rule in rules:
        (header,) = rule["matches"][0]["headers"]
        assert header["name"] == "x-ai-eg-model"
        for backend in rule["backendRefs"]:
            ai_backend = objects[("AIServiceBackend", backend["name"])]
            assert ("Backend", ai_backend["spec"]["backendRef"]["name"]) in objects
            assert backend["modelNameOverride"]
    values = [r["matches"][0]["headers"][0]["value"] for r in rules]
    assert values[-1] == "routeopt"  # an undecided request still has a rule: the default model


async def test_the_service_sets_the_ai_gateways_model_header(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    s = DecisionService(
        GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=0),
        options=ServiceOptions(model_headers=("x-ai-eg-model",)),
    )
    s.start()
    ext = _ai_gateway()[("SecurityPolicy", "routeopt")]["spec"]["extAuth"]
    rules = _ai_gateway()[("AIGatewayRoute", "llm")]["spec"]["rules"]
    try:
        async with _client(s) as c:
            answer = await c.post(
                ext["http"]["path"] + "/v1/chat/completions",
                json={
                    "model": "routeopt",
                    "messages": [{"role": "user", "content": PROMPTS[1][0]}],
                    "metadata": {"routeopt_suite": PROMPTS[1][1]},
                },
            )
    finally:
        s.close()
    copied = {k: v for k, v in answer.headers.items() if k in ext["http"]["headersToBackend"]}
    assert copied["x-ai-eg-model"] == copied["x-routeopt-model"] == answer.json()["model"]
    matching = [r for r in rules if r["matches"][0]["headers"][0]["value"] == copied["x-ai-eg-model"]]
    assert len(matching) == 1  # exactly one AIGatewayRoute rule serves the chosen candidate
