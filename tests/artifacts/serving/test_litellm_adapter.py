"""The LiteLLM adapter with the real `litellm` Router talking to a local OpenAI-protocol server."""

from __future__ import annotations

import pytest

from routeopt.artifacts.serving.loader import load
from tests.artifacts.policies import PROMPTS
from tests.fake_llm import FakeLLM


@pytest.fixture(scope="module")
def adapter():
    """The adapter, imported here rather than at collection: importing litellm takes seconds in
    every worker. (It sets LITELLM_LOCAL_MODEL_COST_MAP first: no price-map download.)"""
    return pytest.importorskip(
        "routeopt.artifacts.serving.litellm_adapter", reason="needs litellm (extra 'gateway')"
    )


pytestmark = pytest.mark.slow  # importing litellm alone takes ~15 s on the shared CI cores


@pytest.fixture()
def fake():
    with FakeLLM() as server:
        yield server


def _litellm_router(fake: FakeLLM, names: list[str]):
    from litellm import Router as LiteLLMRouter

    model_list = [
        {
            "model_name": n,
            "litellm_params": {
                "model": f"openai/{n}-model",
                "api_base": fake.openai_base_url,
                "api_key": "sk-test-not-a-secret",
            },
        }
        for n in names
    ]
    return LiteLLMRouter(model_list=model_list, num_retries=0)


@pytest.fixture()
def policy_router(policies, publish_to, registry, keypair):
    publish_to(policies[0])
    return load(registry, keypair[1])


async def test_routes_each_request_to_the_policys_choice(adapter, fake, policies, policy_router) -> None:
    router = _litellm_router(fake, policies[0].candidates)
    adapter.install(router, policy_router)
    expected = []
    for target in (0.0, 1.0):
        for prompt, suite in PROMPTS:
            metadata = {"routeopt_suite": suite, "routeopt_quality_target": target}
            resp = await router.acompletion(
                model="routeopt", messages=[{"role": "user", "content": prompt}], metadata=metadata
            )
            want = policies[0].decide(prompt, suite, quality_target=target).model
            expected.append(f"{want}-model")
            assert resp.choices[0].message.content == f"echo: {prompt.strip()}"
            assert metadata[adapter.DECISION_KEY]["model"] == want
            assert metadata[adapter.DECISION_KEY]["policy_version"] == 1
    assert [r.body["model"] for r in fake.requests] == expected
    assert len(set(expected)) >= 2, "the policy should pick differently at targets 0 and 1"
    assert all(r.body["messages"][-1]["content"] for r in fake.requests)


async def test_falls_back_when_the_choice_has_no_deployment(adapter, fake, policies, policy_router) -> None:
    prompt, suite = PROMPTS[0]
    decision = policies[0].decide(prompt, suite)
    router = _litellm_router(fake, [c for c in policies[0].candidates if c != decision.model])
    adapter.install(router, policy_router)
    other = {"routeopt_suite": suite}
    await router.acompletion(model="routeopt", messages=[{"role": "user", "content": prompt}], metadata=other)
    assert fake.requests[-1].body["model"] == f"{decision.fallbacks[0]}-model"


def test_sync_completion_and_other_models_pass_through(adapter, fake, policies, policy_router) -> None:
    router = _litellm_router(fake, policies[0].candidates)
    adapter.install(router, policy_router)
    router.completion(model="routeopt", messages=[{"role": "user", "content": "What is 2 + 3?"}])
    assert fake.requests[-1].body["model"] == f"{policies[0].decide('What is 2 + 3?').model}-model"
    resp = router.completion(model="large", messages=[{"role": "user", "content": "What is 2 + 3?"}])
    assert resp.choices[0].message.content == "5" and fake.requests[-1].body["model"] == "large-model"


async def test_no_deployment_at_all_is_a_clear_error(adapter, fake, policy_router) -> None:
    router = _litellm_router(fake, ["unrelated"])
    adapter.install(router, policy_router)
    with pytest.raises(Exception, match="no LiteLLM deployment named any of"):
        await router.acompletion(model="routeopt", messages=[{"role": "user", "content": "hi"}])
    assert adapter.NoDeployment.__mro__[1] is LookupError


async def test_default_model_serves_while_no_policy_is_valid(
    adapter, fake, policies, publish_to, registry, keypair
) -> None:
    """An expired policy: requests go to the default model's deployment, and the metadata says
    why; a default model without a deployment is a clear error naming it."""
    from datetime import datetime, timedelta, timezone

    publish_to(policies[0], now=datetime.now(timezone.utc) - timedelta(days=2), expires_in=timedelta(days=1))
    gateway = load(registry, keypair[1], default_model="fallback")
    router = _litellm_router(fake, [*policies[0].candidates, "fallback"])
    adapter.install(router, gateway)
    metadata: dict = {}
    resp = await router.acompletion(
        model="routeopt", messages=[{"role": "user", "content": "What is 2 + 3?"}], metadata=metadata
    )
    assert resp.choices[0].message.content == "5" and fake.requests[-1].body["model"] == "fallback-model"
    assert metadata[adapter.DECISION_KEY]["policy_version"] == 0
    assert "version 1 expired at" in metadata[adapter.DECISION_KEY]["default_reason"]
    bare = _litellm_router(fake, policies[0].candidates)
    adapter.install(bare, gateway)
    with pytest.raises(
        Exception, match="serves its default model 'fallback' .*no LiteLLM deployment is named"
    ):
        await bare.acompletion(model="routeopt", messages=[{"role": "user", "content": "hi"}])


async def test_a_gateway_logs_each_request_under_its_request_id(
    adapter, fake, policies, policy_router, tmp_path
) -> None:
    import json

    from routeopt.artifacts.serving.gateway import DecisionLog, Gateway

    log = DecisionLog(tmp_path, flush_s=0.05)
    router = _litellm_router(fake, policies[0].candidates)
    adapter.install(router, Gateway(policy_router, log=log))
    prompt, suite = PROMPTS[1]
    metadata = {"routeopt_suite": suite, "routeopt_request_id": "order-17"}
    await router.acompletion(
        model="routeopt", messages=[{"role": "user", "content": prompt}], metadata=metadata
    )
    other = {"routeopt_suite": suite}
    await router.acompletion(model="routeopt", messages=[{"role": "user", "content": prompt}], metadata=other)
    log.close()
    records = [json.loads(line) for f in tmp_path.glob("*.jsonl") for line in f.read_text().splitlines()]
    assert (
        metadata[adapter.DECISION_KEY]["request_id"] == "order-17"
        and metadata[adapter.DECISION_KEY]["propensity"] == 1.0
    )
    assert records[0]["request_id"] == "order-17" and records[0]["suite"] == suite
    assert (
        records[1]["request_id"] == other[adapter.DECISION_KEY]["request_id"] != "order-17"
    )  # the gateway's
    assert [r.body["model"] for r in fake.requests] == [f"{records[0]['model']}-model"] * 2
