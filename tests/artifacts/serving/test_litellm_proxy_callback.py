"""The LiteLLM proxy callback in a real `litellm --config` proxy, installed with the gateway-only
install: every alias request lands on the deployment of the policy's choice (plain and
streamed), falls back along the policy's order, answers with the decision's headers, and is
logged; bad requests get a clear 400 and other models pass untouched."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from openai import OpenAI

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.serving.route_request import messages_text
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests.artifacts.policies import PROMPTS, SUITES
from tests.fake_llm import FakeLLM, FaultPlan
from tests.gateway_venv import run_gateway_venv
from tests.litellm_proxy import LiteLLMProxy, proxy_venv

pytestmark = pytest.mark.slow  # builds two virtualenvs on first use and starts the real proxy


def _requests(n: int) -> list[tuple[list[dict], str | None, float | None]]:
    """n distinct chat requests spread over the policy's suites, difficulties and targets."""
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    out = []
    for i in range(n):
        suite = (*SUITES, None)[i % 4]
        difficulty = 1 + i % 5
        text = (
            f"{suite or 'add'} task difficulty {difficulty}: "
            + " ".join(words[(i + k) % 5] for k in range(difficulty * 3))
            + f" #{i}"
        )
        messages = [
            {"role": "system", "content": "Answer briefly."},
            {"role": "user", "content": [{"type": "text", "text": text}]}
            if i % 3 == 0
            else {"role": "user", "content": text},
        ]
        out.append((messages, suite, (None, 0.0, 1.0)[i % 3]))
    return out


@pytest.fixture(scope="module")
def setup(tmp_path_factory, policies, keypair):
    """A registry with a signed champion over HTTP, one fake server per deployment, and the proxy
    running the callback from a gateway install layered on the proxy's virtualenv."""
    from routeopt.artifacts.publish.registry import move_channel, publish

    tmp = tmp_path_factory.mktemp("litellm-proxy-callback")
    registry = tmp / "registry"
    publish(
        policies[0],
        registry,
        signing_key=keypair[0],
        lineage={"runs": ["r"]},
        metrics={"pass_rate": 0.9, "cost_usd": 0.01},
    )
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    server, url = serve_in_thread(registry)
    venv = run_gateway_venv(tmp_path_factory, "on-litellm-proxy", base=proxy_venv())
    candidates = policies[0].candidates
    fakes = {c: FakeLLM().start() for c in candidates}
    model_list = [
        {
            "model_name": f"dep-{c}",
            "litellm_params": {
                "model": f"openai/{c}-model",
                "api_base": fakes[c].openai_base_url,
                "api_key": "sk-upstream-test",
            },
        }
        for c in candidates
    ]
    model_list.append(
        {
            "model_name": "other",
            "litellm_params": {
                "model": "openai/other-model",
                "api_base": fakes[candidates[0]].openai_base_url,
                "api_key": "sk-x",
            },
        }
    )
    config = {
        "model_list": model_list,
        "litellm_settings": {
            "callbacks": "routeopt.artifacts.serving.litellm_proxy.handler",
            "num_retries": 0,
        },
        "router_settings": {"num_retries": 0},
        # streamed calls report tokens only when usage is asked for (the logged usage records)
        "general_settings": {"always_include_stream_usage": True},
    }
    env = {
        "ROUTEOPT_POLICY": url,
        "ROUTEOPT_PUBLIC_KEY": str(keypair[1]),
        "ROUTEOPT_REFRESH_S": "1",
        "ROUTEOPT_DECISION_LOG_DIR": str(tmp / "decisions"),
        "ROUTEOPT_STATE_DIR": str(tmp / "state"),
        "ROUTEOPT_DEPLOYMENTS": ",".join(f"{c}=dep-{c}" for c in candidates),
    }
    expected = Gateway(load(registry, keypair[1], state_dir=False))
    try:
        with LiteLLMProxy(config, env=env, python=venv / "bin" / "python") as proxy:
            client = OpenAI(base_url=proxy.base_url, api_key=proxy.master_key, max_retries=0)
            yield {
                "client": client,
                "fakes": fakes,
                "expected": expected,
                "proxy": proxy,
                "log_dir": tmp / "decisions",
            }
    finally:
        server.shutdown()
        for fake in fakes.values():
            fake.stop()


def _ask(
    client: OpenAI, i: int, messages: list[dict], suite: str | None, target: float | None, stream: bool
) -> tuple[dict, str]:
    """Send one alias request through the proxy; its response headers and its answer."""
    metadata = {
        k: v for k, v in (("routeopt_suite", suite), ("routeopt_quality_target", target)) if v is not None
    }
    raw = client.chat.completions.with_raw_response.create(
        model="routeopt",
        messages=messages,
        stream=stream,
        extra_headers={"x-request-id": f"r{i}"},
        extra_body={"metadata": metadata},
    )
    parsed = raw.parse()
    text = (
        "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
        if stream
        else parsed.choices[0].message.content
    )
    return dict(raw.headers), text


def _landed(fakes: dict[str, FakeLLM], marker: str) -> list[tuple[str, str]]:
    """(candidate whose server got it, model in the body) for every upstream call carrying
    marker, in the order they arrived."""
    calls = [
        (r.t, c, r.body["model"])
        for c, f in fakes.items()
        for r in f.requests
        if marker in json.dumps(r.body["messages"])
    ]
    return [(c, model) for _, c, model in sorted(calls)]


def test_every_alias_request_lands_on_the_policys_deployment(setup) -> None:
    client, fakes, expected = setup["client"], setup["fakes"], setup["expected"]
    requests = _requests(100)
    chosen = []
    for i, (messages, suite, target) in enumerate(requests):
        want = expected.route(messages_text(messages), suite, target)
        headers, answer = _ask(client, i, messages, suite, target, stream=i % 2 == 1)
        assert answer.startswith("echo: ") and f"#{i}" in answer
        assert (
            headers["x-routeopt-model"] == want.model
            and headers["x-routeopt-deployment"] == f"dep-{want.model}"
        )
        assert headers["x-routeopt-decision-id"] == f"r{i}" and headers["x-routeopt-policy-version"] == "1"
        assert headers["x-routeopt-fallbacks"] == ",".join(want.fallbacks)
        chosen.append(want.model)
    landed = [_landed(fakes, f'#{i}"') for i in range(len(requests))]
    assert landed == [[(m, f"{m}-model")] for m in chosen]  # 100 of 100, each exactly once
    assert len(set(chosen)) >= 2, "the requests should exercise more than one candidate"
    assert all(
        r.headers["authorization"] == "Bearer sk-upstream-test" for f in fakes.values() for r in f.requests
    )


def test_a_failing_choice_falls_back_along_the_policys_order(setup) -> None:
    client, fakes, expected = setup["client"], setup["fakes"], setup["expected"]
    messages, suite, target = _requests(1)[0]
    messages = [{"role": "user", "content": messages[-1]["content"][0]["text"] + " fallback-probe"}]
    want = expected.route(messages_text(messages), suite, target)
    broken = fakes[want.model]
    broken.faults = FaultPlan({"server_error": 1.0})
    try:
        headers, answer = _ask(client, 1000, messages, suite, target, stream=False)
    finally:
        broken.faults = FaultPlan()
    assert "fallback-probe" in answer and headers["x-routeopt-model"] == want.model
    assert [c for c, _ in _landed(fakes, "fallback-probe")] == [want.model, want.fallbacks[0]]


def test_bad_requests_get_a_clear_error_and_other_models_pass_untouched(setup) -> None:
    from openai import BadRequestError

    client, fakes = setup["client"], setup["fakes"]
    with pytest.raises(BadRequestError, match=r"messages\[0\].content is a dict"):
        client.chat.completions.create(
            model="routeopt", messages=[{"role": "user", "content": {"text": "x"}}]
        )
    raw = client.chat.completions.with_raw_response.create(
        model="other", messages=[{"role": "user", "content": "untouched-probe"}]
    )
    assert "x-routeopt-model" not in raw.headers
    assert [m for _, m in _landed(fakes, "untouched-probe")] == ["other-model"]
    ok = client.chat.completions.create(
        model="routeopt", messages=[{"role": "user", "content": PROMPTS[0][0]}]
    )
    assert ok.choices[0].message.content.startswith("echo: ")


def test_decisions_and_usage_are_logged_under_the_decision_id(setup) -> None:
    """Runs last in this module: it stops the proxy, which writes what its log still holds."""
    setup["proxy"].__exit__(None, None, None)
    records = [
        json.loads(line)
        for f in sorted(Path(setup["log_dir"]).glob("*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    decisions = {r["request_id"]: r for r in records if r["kind"] == "decision"}
    usage = {r["request_id"]: r for r in records if r["kind"] == "usage"}
    expected = setup["expected"]
    for i, (messages, suite, target) in enumerate(_requests(100)):
        assert decisions[f"r{i}"]["model"] == expected.route(messages_text(messages), suite, target).model
        assert decisions[f"r{i}"]["suite"] == suite and decisions[f"r{i}"]["policy_version"] == 1
        assert usage[f"r{i}"]["model"] == decisions[f"r{i}"]["model"] and usage[f"r{i}"]["input_tokens"] > 0
    assert "text" not in decisions["r0"]  # no prompt text without a redaction hook


def test_a_proxy_started_before_any_policy_serves_other_models_and_routes_once_one_loads(
    tmp_path, tmp_path_factory, policies, keypair
) -> None:
    """No policy and no default model: the proxy still starts; alias requests get a clear 503
    until the policy is published, then they are routed; other models are served throughout."""
    from openai import APIStatusError

    from routeopt.artifacts.publish.registry import move_channel, publish

    registry = tmp_path / "registry"
    registry.mkdir()
    server, url = serve_in_thread(registry)
    venv = run_gateway_venv(tmp_path_factory, "on-litellm-proxy", base=proxy_venv())
    fake = FakeLLM().start()
    candidates = policies[0].candidates
    model_list = [
        {
            "model_name": c,
            "litellm_params": {
                "model": f"openai/{c}-model",
                "api_base": fake.openai_base_url,
                "api_key": "sk-x",
            },
        }
        for c in candidates
    ]
    env = {
        "ROUTEOPT_POLICY": url,
        "ROUTEOPT_PUBLIC_KEY": str(keypair[1]),
        "ROUTEOPT_REFRESH_S": "0.2",
        "ROUTEOPT_STATE_DIR": str(tmp_path / "state"),
    }
    config = {
        "model_list": model_list,
        "litellm_settings": {"callbacks": "routeopt.artifacts.serving.litellm_proxy.handler"},
    }
    try:
        with LiteLLMProxy(config, env=env, python=venv / "bin" / "python") as proxy:
            client = OpenAI(base_url=proxy.base_url, api_key=proxy.master_key, max_retries=0)
            with pytest.raises(APIStatusError, match="routeopt cannot route yet") as refused:
                client.chat.completions.create(
                    model="routeopt", messages=[{"role": "user", "content": "early"}]
                )
            assert refused.value.status_code == 503
            direct = client.chat.completions.create(
                model=candidates[0], messages=[{"role": "user", "content": "direct"}]
            )
            assert direct.choices[0].message.content == "echo: direct"
            publish(
                policies[0],
                registry,
                signing_key=keypair[0],
                lineage={"runs": ["r"]},
                metrics={"pass_rate": 0.9, "cost_usd": 0.01},
            )
            move_channel(registry, "champion", 1, signing_key=keypair[0])
            prompt, suite = PROMPTS[1]
            for _ in range(600):  # the handler's loader retries every 0.2 s
                try:
                    raw = client.chat.completions.with_raw_response.create(
                        model="routeopt",
                        messages=[{"role": "user", "content": prompt}],
                        extra_body={"metadata": {"routeopt_suite": suite}},
                    )
                    break
                except APIStatusError as exc:
                    assert exc.status_code == 503
                    time.sleep(0.1)
            want = Gateway(load(registry, keypair[1], state_dir=False)).route(prompt, suite)
            assert (
                raw.headers["x-routeopt-model"] == want.model
                and raw.headers["x-routeopt-policy-version"] == "1"
            )
    finally:
        server.shutdown()
        fake.stop()
