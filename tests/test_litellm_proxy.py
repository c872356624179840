"""The test helper that runs a real LiteLLM proxy: it answers through the OpenAI SDK, both from a
`mock_response` deployment and from a deployment that forwards to the project's fake server."""

from __future__ import annotations

import pytest
from openai import OpenAI

from tests.fake_llm import FakeLLM
from tests.litellm_proxy import LiteLLMProxy

pytestmark = pytest.mark.slow  # the proxy's first start builds its virtualenv (about a minute)


def test_a_real_litellm_proxy_forwards_to_the_fake_server() -> None:
    with FakeLLM() as fake:
        config = {
            "model_list": [
                {
                    "model_name": "mocked",
                    "litellm_params": {
                        "model": "openai/gpt-4o-mini",
                        "mock_response": "mocked answer",
                        "api_key": "sk-x",
                    },
                },
                {
                    "model_name": "forwarded",
                    "litellm_params": {
                        "model": "openai/echo-model",
                        "api_base": fake.openai_base_url,
                        "api_key": "sk-upstream-test",
                    },
                },
            ]
        }
        with LiteLLMProxy(config) as proxy:
            client = OpenAI(base_url=proxy.base_url, api_key=proxy.master_key, max_retries=0)
            mocked = client.chat.completions.create(
                model="mocked", messages=[{"role": "user", "content": "hi"}]
            )
            forwarded = client.chat.completions.create(
                model="forwarded", messages=[{"role": "user", "content": "hello proxy"}]
            )
    assert mocked.choices[0].message.content == "mocked answer"
    assert forwarded.choices[0].message.content == "echo: hello proxy"
    assert fake.requests and fake.requests[-1].headers["authorization"] == "Bearer sk-upstream-test"
