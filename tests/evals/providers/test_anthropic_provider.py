"""The Anthropic provider against the fake server: the real SDK, the real wire protocol."""

from __future__ import annotations

import json
import math

import pytest

from routeopt.evals.providers import make_provider
from routeopt.evals.providers.anthropic_provider import AnthropicProvider
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request
from tests.fake_llm import FaultPlan, fake_candidate, fake_llm  # noqa: F401

SYSTEM = "You are terse. Answer with the number only."


def req(text: str, *, system: str | None = SYSTEM, **settings) -> Request:
    msgs = ((Message("system", system),) if system else ()) + (Message("user", text),)
    return Request(msgs, GenerationSettings(**settings))


@pytest.fixture(params=[True, False], ids=["stream", "plain"])
def provider(request, fake_candidate):
    return AnthropicProvider(fake_candidate("anthropic"), stream=request.param)


async def test_answer_tokens_and_cache_reads(provider):
    first = await provider.generate(req("What is 50 - 8?"))
    second = await provider.generate(req("What is 6 * 7?"))
    await provider.aclose()
    assert (first.text, second.text) == ("42", "42")
    assert first.finish_reason == "end_turn"
    words, system = len((SYSTEM + "\nWhat is 50 - 8?").split()), len(SYSTEM.split())
    # input counts cache reads and writes too (Anthropic's input_tokens excludes them)
    assert (first.input_tokens, first.output_tokens, first.cached_input_tokens) == (words, 1, 0)
    assert first.cache_write_input_tokens == system  # the marked system prompt, written once
    assert second.input_tokens == words and second.cached_input_tokens == system
    assert second.cache_write_input_tokens == 0
    assert not first.tokens_estimated
    assert (first.ttft_s is not None) == provider.stream


async def test_what_was_sent(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-test-secret-987")
    fake_llm.expect_api_key = "sk-ant-test-secret-987"
    p = make_provider(fake_candidate("anthropic", api_key_env="FAKE_ANTHROPIC_KEY"))
    r = await p.generate(req("say hi", max_tokens=21, stop=("QQ",), top_p=0.9))
    await p.aclose()
    assert r.text == "echo: say hi"
    (sent,) = fake_llm.requests
    assert sent.path == "/v1/messages"
    assert sent.body["system"] == [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    assert sent.body["messages"] == [{"role": "user", "content": "say hi"}]
    assert (sent.body["model"], sent.body["max_tokens"]) == ("fake-anthropic-model", 21)
    assert (sent.body["temperature"], sent.body["top_p"]) == (0.0, 0.9)
    assert sent.body["stop_sequences"] == ["QQ"] and sent.body["stream"] is True
    assert "anthropic-version" in sent.headers
    # The key reached the server (SDKs send it as x-api-key or, lately, a bearer token).
    sent_key = sent.headers.get("x-api-key") or sent.headers["authorization"].removeprefix("Bearer ")
    assert sent_key == "sk-ant-test-secret-987"


async def test_streaming_timing(fake_llm, fake_candidate):
    fake_llm.first_token_delay_s, fake_llm.token_delay_s = 0.15, 0.03
    p = AnthropicProvider(fake_candidate("anthropic"), stream=True)
    r = await p.generate(req("one two three four", system=None))
    await p.aclose()
    assert r.output_tokens == 5 and r.ttft_s >= 0.15
    # each gap is measured where the client reads, which a busy machine may delay or bunch;
    # the last chunk cannot arrive before the server sent it: first delay + 4 token delays
    assert len(r.chunk_gaps_s) == 4 and min(r.chunk_gaps_s) >= 0
    assert r.ttft_s + sum(r.chunk_gaps_s) >= 0.15 + 4 * 0.03 - 1e-3
    assert r.tpot_s == pytest.approx((r.latency_s - r.ttft_s) / 4)


async def test_no_usage_is_estimated(provider, fake_llm):
    fake_llm.usage = False
    r = await provider.generate(req("hello there"))
    await provider.aclose()
    assert r.tokens_estimated
    assert r.output_tokens == math.ceil(len("echo: hello there") / 4)


async def test_stop_sequence_and_max_tokens(provider):
    stopped = await provider.generate(req("alpha STOP beta", stop=("STOP",)))
    capped = await provider.generate(req("a b c d e f g", max_tokens=2))
    await provider.aclose()
    assert (stopped.text, stopped.finish_reason) == ("echo: alpha ", "stop_sequence")
    assert (capped.text, capped.finish_reason) == ("echo: a ", "max_tokens")


async def test_empty_content_is_an_answer(provider):
    r = await provider.generate(req("anything [[fault:empty]]"))
    await provider.aclose()
    assert (r.text, r.finish_reason) == ("", "end_turn")


@pytest.mark.parametrize(
    "fault,kind",
    [
        ("rate_limit", "rate_limited"),
        ("server_error", "server_error"),
        ("overloaded", "server_error"),
        ("auth", "auth"),
        ("bad_request", "client_error"),
        ("drop", "connection"),
        ("hang", "timeout"),
        ("malformed", "bad_response"),
    ],
)
async def test_faults_map_to_error_kinds(provider, fake_llm, fault, kind):
    provider.candidate = provider.candidate.model_copy(update={"timeout_s": 0.3})
    with pytest.raises(ProviderError) as info:
        await provider.generate(req(f"q r s [[fault:{fault}]]"))
    await provider.aclose()
    assert info.value.kind == kind
    assert len(fake_llm.requests) == 1


async def test_truncated(provider):
    with pytest.raises(ProviderError) as info:
        await provider.generate(req("a b c [[fault:truncated]]"))
    await provider.aclose()
    assert info.value.kind == ("truncated_stream" if provider.stream else "connection")


async def test_plain_without_content_is_bad_response(fake_candidate):
    p = AnthropicProvider(fake_candidate("anthropic"), stream=False)
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q [[fault:no_choices]]"))
    await p.aclose()
    assert info.value.kind == "bad_response"


async def test_retry_after(fake_llm, fake_candidate):
    fake_llm.faults = FaultPlan(retry_after_s=3, retry_after_header="retry-after")
    p = AnthropicProvider(fake_candidate("anthropic"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q [[fault:rate_limit]]"))
    await p.aclose()
    assert info.value.retry_after_s == pytest.approx(3)


async def test_wrong_key_is_redacted_and_missing_key_sends_nothing(fake_llm, fake_candidate, monkeypatch):
    monkeypatch.setenv("FAKE_ANTHROPIC_KEY", "sk-ant-wrong-abcdef")
    fake_llm.expect_api_key = "sk-ant-right"
    p = make_provider(fake_candidate("anthropic", api_key_env="FAKE_ANTHROPIC_KEY"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q"))
    await p.aclose()
    assert info.value.kind == "auth" and "sk-ant-wrong-abcdef" not in str(info.value)
    monkeypatch.delenv("FAKE_ANTHROPIC_KEY")
    fake_llm.reset()
    p = make_provider(fake_candidate("anthropic", api_key_env="FAKE_ANTHROPIC_KEY"))
    with pytest.raises(ProviderError) as info:
        await p.generate(req("q"))
    assert info.value.kind == "auth" and "FAKE_ANTHROPIC_KEY" in info.value.message
    assert fake_llm.requests == []


FEW_SHOT = (
    Message("system", SYSTEM),
    Message("user", "What is 1 + 1?"),
    Message("assistant", "2"),
    Message("user", "What is 2 + 3?"),
    Message("assistant", "5"),
)


def few_shot_req(question: str) -> Request:
    """A suite's request: system prompt and two few-shot turns shared, then the item."""
    return Request(FEW_SHOT + (Message("user", question),), shared_messages=len(FEW_SHOT))


async def test_the_shared_prefix_is_marked_and_cache_tokens_are_recorded(provider, fake_llm):
    first = await provider.generate(few_shot_req("What is 4 + 4?"))
    second = await provider.generate(few_shot_req("What is 6 + 1?"))
    await provider.aclose()
    assert (first.text, second.text) == ("8", "7")
    for sent in fake_llm.requests:  # breakpoints on the system prompt and the last shot only
        assert sent.body["system"][0]["cache_control"] == {"type": "ephemeral"}
        msgs = sent.body["messages"]
        assert [m["content"] for m in msgs[:3]] == ["What is 1 + 1?", "2", "What is 2 + 3?"]
        assert msgs[3] == {
            "role": "assistant",
            "content": [{"type": "text", "text": "5", "cache_control": {"type": "ephemeral"}}],
        }
        assert isinstance(msgs[4]["content"], str)
    shared = len(" ".join(m.content for m in FEW_SHOT).split())
    words = shared + len("What is 4 + 4?".split())
    assert (first.input_tokens, first.cache_write_input_tokens, first.cached_input_tokens) == (
        words,
        shared,
        0,
    )
    assert (second.input_tokens, second.cache_write_input_tokens, second.cached_input_tokens) == (
        words,
        0,
        shared,
    )


async def test_prefix_cache_off_marks_nothing(fake_llm, fake_candidate):
    p = AnthropicProvider(fake_candidate("anthropic", prefix_cache=False))
    results = [await p.generate(few_shot_req(q)) for q in ("What is 4 + 4?", "What is 6 + 1?")]
    await p.aclose()
    assert "cache_control" not in json.dumps([r.body for r in fake_llm.requests])
    assert fake_llm.requests[0].body["system"] == SYSTEM
    assert [(r.cached_input_tokens, r.cache_write_input_tokens) for r in results] == [(0, 0)] * 2


async def test_a_request_of_unknown_sharing_marks_only_the_system_prompt(fake_llm, fake_candidate):
    p = AnthropicProvider(fake_candidate("anthropic"))
    await p.generate(Request(FEW_SHOT + (Message("user", "What is 4 + 4?"),)))
    await p.aclose()
    (sent,) = fake_llm.requests
    assert "cache_control" in sent.body["system"][0]
    assert "cache_control" not in json.dumps(sent.body["messages"])
