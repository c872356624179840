"""Shared provider helpers: Retry-After parsing, key redaction, token estimates, error mapping."""

from __future__ import annotations

import email.utils
import json
import time

import openai
import pytest
from hypothesis import given
from hypothesis import strategies as st

from evals.providers.sdk import estimate_tokens, map_error, redact, retry_after


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


@pytest.mark.parametrize("status,kind", [(401, "auth"), (403, "auth"), (404, "config"),
                                         (400, "client_error"), (408, "timeout"),
                                         (429, "rate_limited"), (502, "server_error")])
def test_status_codes(status, kind):
    import httpx2

    resp = httpx2.Response(status, headers={"retry-after": "1"},
                           request=httpx2.Request("POST", "http://x/v1/chat/completions"))
    exc = openai.APIStatusError("err sk-live-secret99", response=resp, body=None)
    err = map_error(exc, openai, None)
    assert err.kind == kind and "sk-live-secret99" not in err.message
    assert (err.retry_after_s == 1.0) == (kind == "rate_limited" or kind == "server_error")
