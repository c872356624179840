"""The test helper that runs a real LiteLLM proxy: it answers through the OpenAI SDK, both from a
`mock_response` deployment and from a deployment that forwards to the project's fake server; and
a batch candidate whose Batch API is the proxy's (`files_settings`, no database)."""

from __future__ import annotations

import pytest
from openai import OpenAI

from routeopt.evals.config import Candidate
from routeopt.evals.execution.batch import custom_id, latency_sample
from routeopt.evals.storage.batches import BatchRecords
from routeopt.evals.storage.store import Store
from routeopt.evals.suite.spec import load_suite
from tests.evals.execution.test_batch import N, rows, run_batches
from tests.fake_batches import FakeBatchLLM
from tests.fake_llm import FakeLLM, write_arithmetic_suite
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


def test_a_batch_candidate_through_the_proxy_gets_its_rows(tmp_path, monkeypatch) -> None:
    """The proxy passes `/v1/files` and `/v1/batches` through to the provider that its
    `files_settings` names, with no database; the latency sample goes through its model_list."""
    suite = load_suite(write_arithmetic_suite(tmp_path / "suites", N))
    with FakeBatchLLM(phase_s=0.03) as fake:
        upstream = {"api_base": fake.openai_base_url, "api_key": "sk-upstream-batches"}
        config = {
            "model_list": [
                {"model_name": "m-openai", "litellm_params": {"model": "openai/m-openai", **upstream}}
            ],
            "files_settings": [{"custom_llm_provider": "openai", **upstream}],
        }
        with LiteLLMProxy(config) as proxy, Store(tmp_path / "o.duckdb") as store:
            monkeypatch.setenv("PROXY_KEY", proxy.master_key)
            cand = Candidate(
                name="b-openai",
                provider="openai",
                model="m-openai",
                base_url=proxy.base_url,
                api_key_env="PROXY_KEY",
                input_price_per_mtok=3.0,
                output_price_per_mtok=15.0,
                timeout_s=30,
                max_retries=2,
                batch={"poll_interval_s": 0.05, "latency_sample": 2},
            )
            try:
                run_batches(store, suite, cand)
            except AssertionError as failed:  # what the proxy said, for a failure seen once under load
                raise AssertionError(f"{failed}\nthe proxy's log:\n{proxy.log()[-6000:]}") from failed
            got = rows(store)
            jobs = BatchRecords(store).jobs("run-b")
    assert len(got) == N and got.passed.all()
    assert got.call_mode.value_counts().to_dict() == {"batch": N - 2, "sync": 2}
    assert [j.state for j in jobs] == ["harvested"]
    sent = fake.batches[jobs[0].batch_id]  # the provider's batch id comes back unchanged
    assert sorted(ln["custom_id"] for ln in sent.lines) == sorted(
        custom_id("run-b", suite.name, i, cand.name, 1)
        for i in {it.id for it in suite.items} - latency_sample(suite, 2)
    )
    assert "routeopt_submission" in sent.metadata
    batch_calls = [r for r in fake.requests if r.path.startswith(("/v1/files", "/v1/batches"))]
    assert batch_calls and {r.headers["authorization"] for r in batch_calls} == {"Bearer sk-upstream-batches"}
