"""The nightly's spans, in OpenTelemetry's GenAI conventions: one `chat {model}` span per call.

A graded item's span covers its call (every attempt), its grading, and the judge's calls, which
are child `chat {model}` spans of their own (`routeopt.role` = `judge`); the item's span gets
the grade (`routeopt.grade.passed`, `gen_ai.evaluation.score.value`) once grading is done, and
an event where the answer was complete, so the call's own time stays visible. Attributes come
from what the outcome row records: tokens, finish reason, TTFT, cost in USD, attempts, prompt
and response caches. Keys, prompts and answers never become attributes (error messages are
already redacted by the providers). Only called while tracing is on (`routeopt.common.tracing`).
"""

from __future__ import annotations

import urllib.parse
from typing import Any

from routeopt.common import tracing
from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import Completion, Request

_PROVIDER_NAMES = {"openai": "openai", "anthropic": "anthropic", "local": "routeopt.local"}


def call_attributes(candidate: Candidate, role: str) -> dict[str, Any]:
    """What is known of a call before it is made."""
    attrs: dict[str, Any] = {
        "openinference.span.kind": "LLM",  # how OpenInference backends (Phoenix) class the span
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": _PROVIDER_NAMES.get(candidate.provider, candidate.provider),
        "gen_ai.request.model": candidate.model,
        "gen_ai.request.stream": bool(getattr(candidate, "stream", True)),
        "routeopt.candidate": candidate.name,
        "routeopt.role": role,
    }
    if candidate.base_url:
        url = urllib.parse.urlsplit(candidate.base_url)
        if url.hostname:  # never the userinfo part of a URL
            attrs["server.address"] = url.hostname
            attrs["server.port"] = url.port or (443 if url.scheme == "https" else 80)
    return attrs


def start_call(candidate: Candidate, role: str, extra: dict[str, Any] | None = None) -> Any:
    """A `chat {model}` client span, a child of the current span (None with tracing off)."""
    return tracing.start_span(
        f"chat {candidate.model}",
        kind="client",
        attributes={**call_attributes(candidate, role), **(extra or {})},
    )


def request_attributes(request: Request) -> dict[str, Any]:
    s = request.settings
    attrs: dict[str, Any] = {
        "gen_ai.request.max_tokens": s.max_tokens,
        "gen_ai.request.temperature": s.temperature,
    }
    if s.top_p is not None:
        attrs["gen_ai.request.top_p"] = s.top_p
    if s.stop:
        attrs["gen_ai.request.stop_sequences"] = list(s.stop)
    return attrs


def completion_attributes(c: Completion) -> dict[str, Any]:
    """Usage, finish reason and timing of an answer."""
    attrs: dict[str, Any] = {
        "gen_ai.response.finish_reasons": [c.finish_reason],
        "routeopt.latency_s": c.latency_s,
    }
    for key, value in (
        ("gen_ai.usage.input_tokens", c.input_tokens),
        ("gen_ai.usage.output_tokens", c.output_tokens),
        ("gen_ai.usage.cache_read.input_tokens", c.cached_input_tokens),
        ("gen_ai.usage.cache_creation.input_tokens", c.cache_write_input_tokens),
        ("gen_ai.response.time_to_first_chunk", c.ttft_s),
        ("routeopt.tpot_s", c.tpot_s),
        ("routeopt.streamed", c.streamed),
    ):
        if value is not None:
            attrs[key] = value
    if c.tokens_estimated:
        attrs["routeopt.tokens_estimated"] = True
    return attrs


def record_call(
    span: Any,
    completion: Completion | None,
    error: Any,
    attempts: int,
    cost_usd: float | None,
    *,
    response_cache: bool = False,
) -> None:
    """What one call (all its attempts) came to; an error sets the span's status."""
    if span is None:
        return
    attrs: dict[str, Any] = {
        "routeopt.attempts": attempts,
        "routeopt.retries": max(0, attempts - 1),
        "routeopt.response_cache.hit": response_cache,
    }
    if cost_usd is not None:
        attrs["routeopt.cost_usd"] = cost_usd
    if completion is not None:
        attrs.update(completion_attributes(completion))
    span.set_attributes(attrs)
    if completion is not None and completion.ttft_s is not None:
        span.add_event("gen_ai.first_token", {"gen_ai.response.time_to_first_chunk": completion.ttft_s})
    if completion is not None:
        span.add_event("routeopt.answered", {"routeopt.latency_s": completion.latency_s})
    if error is not None:
        tracing.set_error(span, error.kind, error.message)


def record_attempt_failed(span: Any, kind: str, message: str, delay_s: float | None) -> None:
    """An attempt that failed (the call retried, or gave up); the message is the redacted one."""
    if span is not None:
        attrs: dict[str, Any] = {"error.type": kind, "routeopt.error.message": message[:300]}
        if delay_s is not None:
            attrs["routeopt.retry.delay_s"] = delay_s
        span.add_event("routeopt.attempt_failed", attrs)


def record_outcome(span: Any, row: Any) -> None:
    """The graded item: pass/fail, score and the grader's cost, or the error that ended it."""
    if span is None:
        return
    attrs: dict[str, Any] = {"routeopt.item_id": row.item_id, "routeopt.suite": row.suite}
    if row.passed is not None:
        attrs["routeopt.grade.passed"] = bool(row.passed)
        attrs["gen_ai.evaluation.score.label"] = "pass" if row.passed else "fail"
    if row.score is not None:
        attrs["gen_ai.evaluation.score.value"] = float(row.score)
    if row.judge_cost_usd is not None:
        attrs["routeopt.judge.cost_usd"] = row.judge_cost_usd
    if row.cached:
        attrs["routeopt.response_cache.hit"] = True
    span.set_attributes(attrs)
    if row.error_kind is not None:
        tracing.set_error(span, row.error_kind, row.error)
