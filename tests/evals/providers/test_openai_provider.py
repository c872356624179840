"""The OpenAI provider against the fake server: the real SDK, the real wire protocol."""

from __future__ import annotations

import math

import pytest

from routeopt.evals.providers import make_provider
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request
from routeopt.evals.providers.openai_provider import OpenAIProvider
from tests.fake_llm import FakeLLM, FaultPlan, fake_candidate, fake_llm  # noqa: F401

SYSTEM = "You are terse. Answer with the number only."


def req(text: str, *, system: str | None = SYSTEM, **settings) -> Request:
    msgs = ((Message("system", system),) if system else ()) + (Message("user", text),)
    return Request(msgs, GenerationSettings(**settings))


@pytest.fixture(params=[True, False], ids=["stream", "plain"])
def provider(request, fake_candidate):
    p = OpenAIProvider(fake_candidate("openai"), stream=request.param)
    yield p


async def test_answer_tokens_and_cached_input(provider, fake_llm):
    first = await provider.generate(req("What is 12 + 30?"))
    second = await provider.generate(req("What is 2 * 21?"))
    await provider.aclose()
    assert first.text == "42" and second.text == "42"
    assert first.finish_reason == "stop"
    prompt_words = len((SYSTEM + "\n" + "What is 12 + 30?").split())
    assert (first.input_tokens, first.output_tokens) == (prompt_words, 1)
    assert first.cached_input_tokens == 0
    assert second.cached_input_tokens == len(SYSTEM.split())  # same system prompt seen before
    assert not first.tokens_estimated
    if provider.stream:
        assert first.ttft_s is not None and 0 < first.ttft_s <= first.latency_s
    else:
        assert first.ttft_s is None


async def test_what_was_sent(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-test-secret-123456")
    fake_llm.expect_api_key = "sk-test-secret-123456"
    p = make_provider(fake_candidate("openai", api_key_env="FAKE_OPENAI_KEY"))
    r = await p.generate(req("say hi", max_tokens=17, temperature=0.0, stop=("ZZZ",), top_p=0.5))
    await p.aclose()
    assert r.text == "echo: say hi"
    (sent,) = fake_llm.requests
    assert sent.path == "/v1/chat/completions"
    assert sent.body["model"] == "fake-openai-model"
    assert sent.body["messages"] == [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "say hi"},
    ]
    assert (sent.body["max_tokens"], sent.body["temperature"]) == (17, 0.0)
    assert (sent.body["stop"], sent.body["top_p"]) == (["ZZZ"], 0.5)
    assert sent.body["stream"] is True
    assert sent.body["stream_options"] == {"include_usage": True}
    assert sent.headers["authorization"] == "Bearer sk-test-secret-123456"  # the key, where it belongs


async def test_streaming_timing_follows_vllm_definitions(fake_llm, fake_candidate):
    fake_llm.first_token_delay_s, fake_llm.token_delay_s = 0.15, 0.03
    p = OpenAIProvider(fake_candidate("openai"), stream=True)
    r = await p.generate(req("one two three four five", system=None))
    await p.aclose()
    assert r.text == "echo: one two three four five"
    assert r.output_tokens == 6
    assert r.ttft_s >= 0.15
    # each gap is measured where the client reads, which a busy machine may delay or bunch;
    # the last chunk cannot arrive before the server sent it: first delay + 5 token delays
    assert len(r.chunk_gaps_s) == 5 and min(r.chunk_gaps_s) >= 0
    assert r.ttft_s + sum(r.chunk_gaps_s) >= 0.15 + 5 * 0.03 - 1e-3
    assert r.tpot_s == pytest.approx((r.latency_s - r.ttft_s) / 5)
    assert r.tpot_s >= 0 and r.latency_s >= 0.15 + 5 * 0.03 - 1e-3


async def test_no_usage_is_estimated_and_marked(provider, fake_llm):
    fake_llm.usage = False
    r = await provider.generate(req("hello there"))
    await provider.aclose()
    assert r.tokens_estimated
    assert r.input_tokens == math.ceil(len(SYSTEM + "\nhello there") / 4)
    assert r.output_tokens == math.ceil(len("echo: hello there") / 4)


async def test_stop_and_length_finish_reasons(provider):
    stopped = await provider.generate(req("alpha STOP beta", stop=("STOP",)))
    capped = await provider.generate(req("a b c d e f g", max_tokens=3))
    await provider.aclose()
    assert stopped.text == "echo: alpha " and stopped.finish_reason == "stop"
    assert capped.text == "echo: a b " and capped.finish_reason == "length"


async def test_empty_content_with_finish_reason_is_an_answer(provider):
    r = await provider.generate(req("anything [[fault:empty]]"))
    await provider.aclose()
    assert (r.text, r.finish_reason) == ("", "stop")


FAULT_KINDS = [
    ("rate_limit", "rate_limited"),
    ("server_error", "server_error"),
    ("unavailable", "server_error"),
    ("auth", "auth"),
    ("bad_request", "client_error"),
    ("drop", "connection"),
    ("hang", "timeout"),
    ("malformed", "bad_response"),
]


@pytest.mark.parametrize("fault,kind", FAULT_KINDS)
async def test_faults_map_to_error_kinds(provider, fake_llm, fault, kind):
    provider.candidate = provider.candidate.model_copy(update={"timeout_s": 0.3})
    with pytest.raises(ProviderError) as info:
        await provider.generate(req(f"q [[fault:{fault}]]"))
    await provider.aclose()
    assert info.value.kind == kind
    assert len(fake_llm.requests) == 1  # the SDK's own retries are off


async def test_truncated(provider):
    with pytest.raises(ProviderError) as info:
        await provider.generate(req("a b c [[fault:truncated]]"))
    await provider.aclose()
    # a stream without its finish chunk is never an empty or partial answer
    assert info.value.kind == ("truncated_stream" if provider.stream else "connection")


async def test_plain_response_without_choices_is_bad_response(fake_candidate):
    p = OpenAIProvider(fake_candidate("openai"), stream=False)
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q [[fault:no_choices]]"))
    await p.aclose()
    assert info.value.kind == "bad_response"


@pytest.mark.parametrize("header,expected", [("retry-after", 2.5), ("retry-after-ms", 0.25)])
async def test_retry_after_headers(fake_llm, fake_candidate, header, expected):
    fake_llm.faults = FaultPlan(retry_after_s=expected, retry_after_header=header)
    p = OpenAIProvider(fake_candidate("openai"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q [[fault:rate_limit]]"))
    await p.aclose()
    assert info.value.retryable and info.value.retry_after_s == pytest.approx(expected)


async def test_missing_key_env_is_auth_error_and_sends_nothing(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.delenv("ROUTEOPT_TEST_MISSING_KEY", raising=False)
    p = make_provider(fake_candidate("openai", api_key_env="ROUTEOPT_TEST_MISSING_KEY"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q"))
    await p.aclose()
    assert info.value.kind == "auth" and "ROUTEOPT_TEST_MISSING_KEY" in info.value.message
    assert fake_llm.requests == []


async def test_wrong_key_echoed_by_server_is_redacted(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.setenv("FAKE_OPENAI_KEY", "sk-wrong-key-abcdef")
    fake_llm.expect_api_key = "sk-right"
    p = make_provider(fake_candidate("openai", api_key_env="FAKE_OPENAI_KEY"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q"))
    await p.aclose()
    assert info.value.kind == "auth"
    assert "sk-wrong-key-abcdef" not in str(info.value) and "[redacted]" in info.value.message


async def test_candidate_stream_flag_selects_plain_requests(fake_llm, fake_candidate):
    p = make_provider(fake_candidate("openai", stream=False))
    r = await p.generate(req("What is 1 + 1?"))
    await p.aclose()
    (sent,) = fake_llm.requests
    assert r.text == "2" and r.ttft_s is None
    assert "stream" not in sent.body and "stream_options" not in sent.body
