"""gateways/litellm/config.yaml started as shipped by the real LiteLLM proxy (only environment
variables differ): it starts, routes the `routeopt` alias onto the demo's deployments, warns at
start-up and on every swap about policy candidates without a deployment, and its answers say when
a fallback served instead of the policy's choice."""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
from openai import OpenAI

from routeopt.artifacts.publish.registry import move_channel, publish
from routeopt.artifacts.publish.registry_server import serve_in_thread
from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.serving.loader import load
from tests import REPO
from tests.fake_llm import FakeLLM
from tests.gateway_venv import run_gateway_venv
from tests.litellm_proxy import LiteLLMProxy, proxy_venv

pytestmark = pytest.mark.slow  # builds a virtualenv on first use and starts the real proxy
CONFIG = REPO / "gateways" / "litellm" / "config.yaml"
MAPPED = {"small": "zoo-s", "medium": "zoo-m"}  # the test policies' `large` has no deployment
WARNING = re.compile(r"routeopt policy version (\d+): candidates \['large'\] have no deployment")


def _wait_for(predicate, timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, f"waited {timeout_s:.0f} s for {what}"
        time.sleep(0.25)


def _large_prompt(gateway: Gateway) -> str:
    for i in range(200):
        prompt = f"sort task difficulty {1 + i % 5}: " + "gamma delta " * (i % 12)
        if gateway.route(prompt, "sort", 1.0).model == "large":
            return prompt
    pytest.fail("no test prompt makes the policy choose `large`")


def test_the_shipped_config_starts_routes_and_names_missing_deployments(
    tmp_path: Path, tmp_path_factory: pytest.TempPathFactory, policies, keypair
) -> None:
    registry = tmp_path / "registry"
    for policy in policies:
        publish(policy, registry, signing_key=keypair[0], lineage={}, metrics={})
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    server, url = serve_in_thread(registry)
    fake = FakeLLM().start()
    venv = run_gateway_venv(tmp_path_factory, "on-litellm-proxy", base=proxy_venv())
    env = {
        "LITELLM_MASTER_KEY": "sk-shipped-config-test",
        "MODELS_API_BASE": fake.openai_base_url,
        "MODELS_API_KEY": "sk-upstream",
        "ROUTEOPT_POLICY": url,
        "ROUTEOPT_PUBLIC_KEY": str(keypair[1]),
        "ROUTEOPT_REFRESH_S": "1",
        "ROUTEOPT_STATE_DIR": str(tmp_path / "state"),
        "ROUTEOPT_DEPLOYMENTS": ",".join(f"{c}={d}" for c, d in MAPPED.items()),
    }
    expected = Gateway(load(registry, keypair[1], state_dir=False))
    try:
        with LiteLLMProxy(CONFIG, env=env, python=venv / "bin" / "python") as proxy:
            _wait_for(lambda: WARNING.search(proxy.log()), 60, "the start-up warning")
            client = OpenAI(base_url=proxy.base_url, api_key="sk-shipped-config-test", max_retries=0)

            def ask(prompt: str) -> dict:
                raw = client.chat.completions.with_raw_response.create(
                    model="routeopt",
                    messages=[{"role": "user", "content": prompt}],
                    extra_body={"metadata": {"routeopt_suite": "sort", "routeopt_quality_target": 1.0}},
                )
                raw.parse()
                return dict(raw.headers)

            small = next(
                p
                for p in (f"sort task difficulty 1: alpha {i}" for i in range(50))
                if expected.route(p, "sort").model != "large"
            )
            plain = client.chat.completions.with_raw_response.create(
                model="routeopt",
                messages=[{"role": "user", "content": small}],
                extra_body={"metadata": {"routeopt_suite": "sort"}},
            )
            plain.parse()
            want = expected.route(small, "sort")
            assert plain.headers["x-routeopt-model"] == plain.headers["x-routeopt-served-model"] == want.model
            assert plain.headers["x-routeopt-deployment"] == MAPPED[want.model]
            assert "x-routeopt-fallback" not in plain.headers
            assert fake.requests[-1].body["model"] == MAPPED[want.model]

            prompt = _large_prompt(expected)
            headers = ask(prompt)
            assert headers["x-routeopt-model"] == "large"
            served = headers["x-routeopt-served-model"]
            assert served in MAPPED and headers["x-routeopt-deployment"] == MAPPED[served]
            assert headers["x-routeopt-fallback"] == "no deployment for 'large' (model_name 'large')"
            assert fake.requests[-1].body["model"] == MAPPED[served]

            move_channel(registry, "champion", 2, signing_key=keypair[0])
            _wait_for(
                lambda: [m.group(1) for m in WARNING.finditer(proxy.log())] == ["1", "2"],
                60,
                f"the warning after the swap to version 2:\n{proxy.log()[-3000:]}",
            )
            assert ask(prompt)["x-routeopt-policy-version"] == "2"
    finally:
        server.shutdown()
        fake.stop()
