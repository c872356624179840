"""Shared provider helpers: Retry-After parsing, key redaction, token estimates, error mapping."""

from __future__ import annotations

import email.utils
import json
import time

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from routeopt.evals.providers.sdk import estimate_tokens, map_error, redact, retry_after, transport


def test_retry_after_forms():
    assert retry_after({"retry-after-ms": "250", "retry-after": "9"}) == 0.25  # ms wins
    assert retry_after({"retry-after": "3"}) == 3.0
    date = email.utils.formatdate(time.time() + 20, usegmt=True)
    assert 17 <= retry_after({"retry-after": date}) <= 20.5
    assert retry_after({"retry-after": "soon"}) is None
    assert retry_after({}) is None and retry_after(None) is None


@given(st.text())
def test_estimate_is_about_four_chars_per_token(text):
    n = estimate_tokens(text)
    assert n == -(-len(text) // 4) and (n > 0) == bool(text)


def test_redact_removes_the_key_and_key_shaped_strings():
    msg = "Incorrect API key provided: my-own-secret; also sk-proj-abcdef123 and sk-ant-api03-xyz12"
    out = redact(msg, "my-own-secret")
    assert "my-own-secret" not in out and "sk-proj-abcdef123" not in out
    assert "sk-ant-api03-xyz12" not in out and out.count("[redacted]") == 3


def test_unknown_exceptions_are_internal_and_json_errors_bad_response():
    assert map_error(RuntimeError("boom"), openai, None).kind == "internal"
    try:
        json.loads("{")
    except json.JSONDecodeError as exc:
        assert map_error(exc, openai, None).kind == "bad_response"


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
def test_raw_transport_errors_are_mapped_for_the_library_the_sdk_is_built_on(vendor):
    """Errors raised mid-stream reach the provider unwrapped, as the SDK's HTTP library's own."""
    import importlib

    sdk = importlib.import_module(vendor)
    http = transport(sdk)
    assert isinstance(sdk.DefaultAsyncHttpxClient(), http.AsyncClient)
    request = http.Request("POST", "http://x/v1/messages")
    assert map_error(http.ReadTimeout("slow", request=request), sdk, None).kind == "timeout"
    assert map_error(http.RemoteProtocolError("peer closed", request=request), sdk, None).kind == "connection"


@pytest.mark.parametrize(
    "status,kind",
    [
        (401, "auth"),
        (403, "auth"),
        (404, "config"),
        (400, "client_error"),
        (408, "timeout"),
        (429, "rate_limited"),
        (502, "server_error"),
    ],
)
def test_status_codes(status, kind):
    http = transport(openai)
    resp = http.Response(
        status, headers={"retry-after": "1"}, request=http.Request("POST", "http://x/v1/chat/completions")
    )
    exc = openai.APIStatusError("err sk-live-secret99", response=resp, body=None)
    err = map_error(exc, openai, None)
    assert err.kind == kind and "sk-live-secret99" not in err.message
    assert (err.retry_after_s == 1.0) == (kind == "rate_limited" or kind == "server_error")


@pytest.mark.parametrize(
    "body,said",
    [
        ({"detail": "Not Found"}, "HTTP 404: Not Found"),  # FastAPI's 404 (LiteLLM's proxy, a wrong path)
        (
            {"message": "No connected db.", "type": "no_db_connection", "code": "400"},
            "HTTP 404: No connected db. [no_db_connection]",
        ),  # LiteLLM's proxy, a key it cannot check
        (
            {"error": {"message": "model not found", "code": "model_not_found"}},
            "HTTP 404: model not found [model_not_found]",
        ),
        (None, "HTTP 404: Error code: 404"),
    ],
)
def test_a_status_error_says_what_the_server_said_and_where_it_was_sent(body, said):
    """The message names the endpoint (without its query string, where some APIs take a key)
    and the body's own words, so a wrong URL or key is recognisable on screen."""
    http = transport(openai)
    request = http.Request("POST", "http://proxy:4000/v2/chat/completions?key=sk-in-query-123")
    exc = openai.NotFoundError("Error code: 404", response=http.Response(404, request=request), body=body)
    err = map_error(exc, openai, None)
    assert err.kind == "config" and err.status == 404
    assert err.message == f"{said} (POST http://proxy:4000/v2/chat/completions)"
    refused = map_error(openai.APIConnectionError(request=request), openai, None)
    assert refused.kind == "connection" and refused.status is None
    assert refused.message.endswith("(POST http://proxy:4000/v2/chat/completions)")
    assert "sk-in-query" not in err.message + refused.message


# --- a stream request answered with one JSON body (LiteLLM's proxy does, for Anthropic) -------


def _json_server_provider(fake_llm, fake_candidate, vendor: str):
    from routeopt.evals.providers import make_provider

    fake_llm.stream_as_json = True
    return make_provider(fake_candidate(vendor, stream=True))


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_one_json_body_for_a_stream_request_is_an_answer_with_unknown_ttft(
    fake_llm, fake_candidate, vendor
):
    from routeopt.evals.providers.base import GenerationSettings, Message, Request

    p = _json_server_provider(fake_llm, fake_candidate, vendor)
    fake_llm.first_token_delay_s = 0.2  # the whole body arrives after it: no first token to time
    request = Request(
        (Message("system", "Be terse."), Message("user", "What is 50 - 8?")), GenerationSettings(max_tokens=8)
    )
    c = await p.generate(request)
    await p.aclose()
    (sent,) = fake_llm.requests
    assert sent.body["stream"] is True  # it was asked for a stream...
    assert c.text == "42"  # ...and the JSON answer is recorded as what it is
    assert c.finish_reason == ("stop" if vendor == "openai" else "end_turn")
    assert c.streamed is False and c.ttft_s is None and c.tpot_s is None and c.chunk_gaps_s == []
    assert c.latency_s >= 0.2
    assert (c.input_tokens, c.output_tokens) == (len("Be terse. What is 50 - 8?".split()), 1)
    assert not c.tokens_estimated


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
@pytest.mark.parametrize(
    "fault,kind", [("malformed", "bad_response"), ("no_choices", "bad_response"), ("truncated", "connection")]
)
async def test_a_broken_json_body_for_a_stream_request_is_still_an_error(
    fake_llm, fake_candidate, vendor, fault, kind
):
    p = _json_server_provider(fake_llm, fake_candidate, vendor)
    from routeopt.evals.providers.base import Message, ProviderError, Request

    with pytest.raises(ProviderError) as info:
        await p.generate(Request((Message("user", f"What is 1 + 1? [[fault:{fault}]]"),)))
    await p.aclose()
    assert info.value.kind == kind


@pytest.mark.parametrize("vendor", ["openai", "anthropic"])
async def test_a_real_stream_is_timed_and_a_cut_one_still_truncated(fake_llm, fake_candidate, vendor):
    from routeopt.evals.providers import make_provider
    from routeopt.evals.providers.base import Message, ProviderError, Request

    p = make_provider(fake_candidate(vendor, stream=True))
    c = await p.generate(Request((Message("user", "What is 2 + 2?"),)))
    assert c.streamed is True and c.ttft_s is not None
    with pytest.raises(ProviderError) as info:
        await p.generate(Request((Message("user", "What is 2 + 2? [[fault:truncated]]"),)))
    await p.aclose()
    assert info.value.kind == "truncated_stream"
