"""What a gateway routes on: the prompt, suite, request id and quality target of one request.

Every gateway front end reads a request the same way, so the same request gets the same decision
whether it arrives at the decision service (`routeopt.artifacts.serving.decision_service`), the LiteLLM proxy callback
(`routeopt.artifacts.serving.litellm_proxy`) or the LiteLLM SDK adapter (`routeopt.artifacts.serving.litellm_adapter`):

- the prompt is `prompt` (a string, or a list of strings joined by newlines), or the text of
  OpenAI-style `messages` (string contents and the `text` of content parts, one message per
  line; images and other parts carry no text), the text routeopt trains on;
- the suite, request id, quality target and latency budget come from the body's own fields
  (`suite`, `request_id`, `quality_target`, `ttft_budget_s` or `latency_budget_s`), else from its
  `metadata` (the same names with `routeopt_` before them, the keys the LiteLLM adapter reads),
  else from headers (`x-routeopt-suite`, `x-request-id`, `x-routeopt-quality-target`,
  `x-routeopt-ttft-budget-s`, `x-routeopt-latency-budget-s`);
- a body whose `model` names something other than the alias is not routed: it goes to the model
  it names (a passthrough).

A malformed request raises `BadRequest` with one sentence naming the field; nothing here guesses.
Standard library only.
"""

from __future__ import annotations

import math
from collections.abc import Mapping  # typing.Mapping checks isinstance twice as slowly
from dataclasses import dataclass
from typing import Any

ALIAS = "routeopt"
SUITE_KEY = "routeopt_suite"
TARGET_KEY = "routeopt_quality_target"
REQUEST_ID_KEY = "routeopt_request_id"
SUITE_HEADER = "x-routeopt-suite"
REQUEST_ID_HEADER = "x-request-id"
TARGET_HEADER = "x-routeopt-quality-target"
BUDGETS = ("ttft_budget_s", "latency_budget_s")  # body field; metadata key routeopt_<field>; header below
BUDGET_HEADERS = {
    "ttft_budget_s": "x-routeopt-ttft-budget-s",
    "latency_budget_s": "x-routeopt-latency-budget-s",
}
MAX_ID_CHARS = 256  # request ids land in headers and logs: a bounded, printable token


class BadRequest(ValueError):
    """The request cannot be routed as sent; the message names the field and what is wrong."""


@dataclass(frozen=True)
class RouteRequest:
    """One request to route. `passthrough` is the model a request named instead of the alias."""

    prompt: str
    suite: str | None = None
    request_id: str | None = None
    quality_target: float | None = None
    passthrough: str | None = None
    ttft_budget_s: float | None = None
    latency_budget_s: float | None = None

    def budgets(self) -> dict[str, float | None]:
        """The budget keyword arguments of `Gateway.route`."""
        return {"ttft_budget_s": self.ttft_budget_s, "latency_budget_s": self.latency_budget_s}


def _part_text(part: Any, where: str) -> str:
    if not isinstance(part, Mapping):
        raise BadRequest(f"{where} is a {type(part).__name__}, not a content part object")
    text = part.get("text")
    if text is None:
        return ""  # an image, audio or file part: no text to route on
    if not isinstance(text, str):
        raise BadRequest(f"{where}.text is a {type(text).__name__}, not a string")
    return text


def messages_text(messages: Any) -> str:
    """The text of OpenAI-style chat messages: one line per message that has any text."""
    if not isinstance(messages, list):
        raise BadRequest(f"messages is a {type(messages).__name__}, not a list")
    if not messages:
        raise BadRequest("messages is empty: give at least one message")
    lines = []
    for i, message in enumerate(messages):
        if not isinstance(message, Mapping):
            raise BadRequest(f"messages[{i}] is a {type(message).__name__}, not an object")
        content = message.get("content")
        if isinstance(content, list):
            content = "".join(_part_text(p, f"messages[{i}].content[{j}]") for j, p in enumerate(content))
        elif content is not None and not isinstance(content, str):
            raise BadRequest(
                f"messages[{i}].content is a {type(content).__name__}, not a string, a list of parts or null"
            )
        if content:
            lines.append(content)
    return "\n".join(lines)


def prompt_of(body: Mapping[str, Any]) -> str:
    """The prompt of a request body: `prompt` or `messages`, exactly one of them."""
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt and has_messages:
        raise BadRequest("give prompt or messages, not both")
    if has_messages:
        return messages_text(body["messages"])
    if not has_prompt:
        raise BadRequest("no prompt: give prompt (a string) or messages (OpenAI chat messages)")
    prompt = body["prompt"]
    if isinstance(prompt, list) and all(isinstance(p, str) for p in prompt):
        return "\n".join(prompt)
    if not isinstance(prompt, str):
        raise BadRequest(f"prompt is a {type(prompt).__name__}, not a string or a list of strings")
    return prompt


def _pick(
    body: Mapping[str, Any], field: str, key: str, headers: Mapping[str, str], header: str
) -> tuple[Any, str]:
    """The first of body[field], body.metadata[key], headers[header], with where it came from."""
    if body.get(field) is not None:
        return body[field], field
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping) and metadata.get(key) is not None:
        return metadata[key], f"metadata.{key}"
    if headers.get(header):
        return headers[header], f"header {header}"
    return None, field


def _text_field(value: Any, where: str, limit: int | None = None) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str):
        raise BadRequest(f"{where} is a {type(value).__name__}, not a string")
    if limit is not None and (len(value) > limit or not value.isprintable()):
        raise BadRequest(f"{where} must be at most {limit} printable characters")
    return value


def quality_target_of(value: Any, where: str = "quality_target") -> float | None:
    """A quality target as the policy takes it: a finite number >= 0 (or None for the policy's own)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequest(f"{where} is a boolean, not a number")
    try:
        target = float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{where} is {value!r}, not a number") from None
    if not math.isfinite(target) or target < 0:
        raise BadRequest(f"{where} must be a finite number >= 0, got {value!r}")
    return target


def budget_of(value: Any, where: str) -> float | None:
    """A latency budget: a positive, finite number of seconds (or None for none)."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise BadRequest(f"{where} is a boolean, not a number of seconds")
    try:
        budget = float(value)
    except (TypeError, ValueError):
        raise BadRequest(f"{where} is {value!r}, not a number of seconds") from None
    if not math.isfinite(budget) or budget <= 0:
        raise BadRequest(f"{where} must be a positive number of seconds, got {value!r}")
    return budget


def route_request(body: Any, headers: Mapping[str, str] | None = None, *, alias: str = ALIAS) -> RouteRequest:
    """Read one request (a parsed JSON body and lower-case headers) or raise BadRequest."""
    if not isinstance(body, Mapping):
        raise BadRequest(f"the body is a JSON {type(body).__name__}, not an object")
    headers = headers or {}
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise BadRequest(f"model is a {type(model).__name__}, not a string")
    passthrough = model if model and model != alias else None
    suite, where = _pick(body, "suite", SUITE_KEY, headers, SUITE_HEADER)
    rid, rid_where = _pick(body, "request_id", REQUEST_ID_KEY, headers, REQUEST_ID_HEADER)
    target, target_where = _pick(body, "quality_target", TARGET_KEY, headers, TARGET_HEADER)
    budgets = {
        name: budget_of(*_pick(body, name, "routeopt_" + name, headers, BUDGET_HEADERS[name]))
        for name in BUDGETS
    }
    if all(v is not None for v in budgets.values()):
        raise BadRequest("give ttft_budget_s or latency_budget_s, not both")
    return RouteRequest(
        prompt="" if passthrough else prompt_of(body),
        suite=_text_field(suite, where, MAX_ID_CHARS) or None,
        request_id=_text_field(rid, rid_where, MAX_ID_CHARS) or None,
        quality_target=quality_target_of(target, target_where),
        passthrough=passthrough,
        **budgets,
    )
