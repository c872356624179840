"""Preflight against the wire-protocol fake server and the zoo checkpoints: what a probe sends,
what it costs, and which answers stop a candidate."""

from __future__ import annotations

import pytest

from routeopt.evals.config import Candidate
from routeopt.evals.execution.preflight import probe, run_preflight, unset_keys, verdict_of
from routeopt.evals.providers.base import ProviderError
from tests import REPO
from tests.fake_llm import FakeLLM, FaultPlan, fake_candidate, fake_llm  # noqa: F401
from tests.litellm_proxy import free_port

ZOO = REPO / "evals" / "demo" / "zoo"


@pytest.mark.parametrize("provider", ["openai", "anthropic"])
@pytest.mark.parametrize("stream", [True, False])
async def test_a_healthy_candidate_answers_one_token_and_the_probe_is_costed(
    fake_llm, fake_candidate, provider, stream
):
    cand = fake_candidate(provider, stream=stream, input_price_per_mtok=1.0, output_price_per_mtok=2.0)
    p = await probe(cand)
    (sent,) = fake_llm.requests
    assert sent.body["max_tokens"] == 1 and bool(sent.body.get("stream")) is stream
    assert p.verdict == "ok" and not p.broken and p.error is None and p.streamed is stream
    # the fake server counts words: "Reply with the word OK." is 5 input tokens, 1 output
    assert (p.input_tokens, p.output_tokens) == (5, 1)
    assert p.cost_usd == pytest.approx((5 * 1.0 + 1 * 2.0) / 1e6)
    assert p.line().startswith(f"candidate {cand.name} ({cand.base_url}): answered in ")


async def test_a_refused_key_is_broken_named_by_status_and_url_and_never_echoed(
    fake_llm, fake_candidate, monkeypatch
):
    monkeypatch.setenv("PF_KEY", "sk-revoked-0123456789")
    fake_llm.expect_api_key = "sk-current"
    p = await probe(fake_candidate("openai", api_key_env="PF_KEY"))
    assert p.verdict == "broken" and (p.error_kind, p.status) == ("auth", 401)
    assert p.error.startswith("HTTP 401: Incorrect API key provided: [redacted]")
    assert p.error.endswith(f"(POST {fake_llm.openai_base_url}/chat/completions)")
    assert "0123456789" not in p.line() and p.cost_usd == 0.0


async def test_a_wrong_path_and_a_dead_port_are_broken(fake_llm, fake_candidate):
    wrong_path = await probe(fake_candidate("openai", base_url=fake_llm.url + "/v2"))
    assert (wrong_path.verdict, wrong_path.error_kind, wrong_path.status) == ("broken", "config", 404)
    assert (
        f"HTTP 404: no route /v2/chat/completions (POST {fake_llm.url}/v2/chat/completions)"
        == wrong_path.error
    )
    dead = f"http://127.0.0.1:{free_port()}/v1"
    refused = await probe(fake_candidate("openai", base_url=dead))
    assert (refused.verdict, refused.error_kind, refused.status) == ("broken", "connection", None)
    assert refused.line().startswith(f"candidate fake-openai ({dead}): Connection error.")
    assert refused.error.endswith(f"(POST {dead}/chat/completions)")


async def test_an_unset_key_variable_is_broken_without_a_call(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.delenv("PF_UNSET_KEY", raising=False)
    cand = fake_candidate("anthropic", api_key_env="PF_UNSET_KEY")
    assert unset_keys([cand, fake_candidate("openai")]) == {
        "fake-anthropic": "candidate fake-anthropic: $PF_UNSET_KEY is not set"
    }
    p = await probe(cand)
    assert (p.verdict, p.error_kind, p.error) == (
        "broken",
        "auth",
        "candidate fake-anthropic: $PF_UNSET_KEY is not set",
    )
    assert fake_llm.requests == []


@pytest.mark.parametrize(
    "fault,kind",
    [
        ("server_error", "server_error"),
        ("rate_limit", "rate_limited"),
        ("bad_request", "client_error"),
        ("hang", "timeout"),
    ],
)
async def test_faults_that_say_nothing_about_the_configuration_are_unsure(fake_candidate, fault, kind):
    with FakeLLM(faults=FaultPlan({fault: 1.0}, hang_s=5.0)) as server:
        p = await probe(fake_candidate("openai", base_url=server.openai_base_url), timeout_s=0.5)
        assert len(server.requests) == 1  # probes are not retried, a refused connection aside
    assert (p.verdict, p.error_kind) == ("unsure", kind) and not p.broken


@pytest.mark.parametrize(
    "message,verdict",
    [
        (
            "HTTP 400: No connected db. [no_db_connection] (POST http://proxy:4000/v1/chat/completions)",
            "broken",
        ),
        (
            "HTTP 400: /chat/completions: Invalid model name passed in model=big-hundredd. (POST http://p/v1/chat/completions)",
            "broken",
        ),
        ("HTTP 400: The model `gpt-5o` does not exist", "broken"),
        (
            "HTTP 400: injected fault: bad_request (POST http://p/model/key/chat/completions)",
            "unsure",
        ),  # the URL is not the body
        ("HTTP 422: temperature must be between 0 and 2", "unsure"),
    ],
)
def test_a_4xx_is_broken_when_its_body_names_the_model_the_key_or_the_route(message, verdict):
    assert verdict_of(ProviderError("client_error", message, status=400)) == verdict


@pytest.mark.skipif(not (ZOO / "zoo-s" / "config.json").exists(), reason="zoo checkpoints not built")
def test_local_candidates_load_and_generate_one_token_and_pay_their_gpu_time(tmp_path):
    good = Candidate(name="zoo-s", provider="local", model=str(ZOO / "zoo-s"), gpu_hour_usd=0.5)
    stated = Candidate(
        name="zoo-s-stated",
        provider="local",
        model=str(ZOO / "zoo-s"),
        gpu_hour_usd=0.5,
        gpu_tokens_per_s=1000,
    )
    missing = Candidate(
        name="gone", provider="local", model=str(tmp_path / "no-such-model"), gpu_hour_usd=0.5
    )
    ok, at_stated, bad = run_preflight([good, stated, missing])
    assert ok.verdict == "ok" and ok.output_tokens == 1 and ok.endpoint == f"local:{ZOO / 'zoo-s'}:fp32"
    assert ok.cost_usd == pytest.approx(0.5 / 3600 * ok.latency_s)  # the GPU time it held
    per_token = 0.5 / 3600 / 1000  # a GPU priced at a stated throughput: its tokens
    assert at_stated.cost_usd == pytest.approx((at_stated.input_tokens + 1) * per_token)
    assert (bad.verdict, bad.error_kind) == ("broken", "config")
    assert bad.error == f"candidate 'gone': checkpoint not found: {tmp_path / 'no-such-model'}"


async def test_a_connection_the_server_drops_is_unsure_unlike_one_never_made(fake_candidate):
    with FakeLLM(faults=FaultPlan({"drop": 1.0})) as server:
        p = await probe(fake_candidate("openai", base_url=server.openai_base_url, stream=False))
        assert len(server.requests) == 2  # a connection error is tried once more
    assert (p.verdict, p.error_kind) == ("unsure", "connection") and "ConnectError" not in p.error
