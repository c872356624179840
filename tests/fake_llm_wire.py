"""Wire formats of the fake LLM server: OpenAI / Anthropic JSON bodies, SSE events, HTTP/1.1.

Kept apart from `tests.fake_llm` (the server's behaviour) so each stays readable.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, Iterator


@dataclass
class _Http:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes


class _Drop(Exception):
    """Abort the connection without a (complete) response."""


_STATUS_FAULTS: dict[str, tuple[int, str]] = {
    "rate_limit": (429, "rate_limit_error"),
    "server_error": (500, "api_error"),
    "unavailable": (503, "api_error"),
    "overloaded": (529, "overloaded_error"),
    "auth": (401, "authentication_error"),
    "bad_request": (400, "invalid_request_error"),
}
_REASONS = {
    200: "OK",
    400: "Bad Request",
    401: "Unauthorized",
    404: "Not Found",
    429: "Too Many Requests",
    500: "Internal Server Error",
    503: "Service Unavailable",
    529: "Overloaded",
}


def _openai_usage(u: dict) -> dict:
    return {
        "prompt_tokens": u["input"],
        "completion_tokens": u["output"],
        "total_tokens": u["input"] + u["output"],
        "prompt_tokens_details": {"cached_tokens": u["cached"]},
    }


def _anthropic_usage(u: dict) -> dict:
    return {
        "input_tokens": u["input"] - u["cached"] - u["written"],
        "output_tokens": u["output"],
        "cache_read_input_tokens": u["cached"],
        "cache_creation_input_tokens": u["written"],
    }


def _openai_plain(body: dict, text: str, finish: str, u: dict, usage: bool) -> dict:
    out = {
        "id": "chatcmpl-fake",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": finish,
                "logprobs": None,
            }
        ],
    }
    if usage:
        out["usage"] = _openai_usage(u)
    return out


def _anthropic_plain(body: dict, text: str, finish: str, u: dict, usage: bool) -> dict:
    out = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": [{"type": "text", "text": text}],
        "stop_reason": finish,
        "stop_sequence": None,
    }
    out["usage"] = _anthropic_usage(u) if usage else {"input_tokens": 0, "output_tokens": 0}
    return out


def _openai_events(
    body: dict, pieces: list[str], finish: str, u: dict, usage: bool
) -> Iterator[tuple[str, bytes]]:
    """(tag, SSE bytes); tags: 'first' (first content), 'content', 'final', 'tail'."""
    base = {
        "id": "chatcmpl-fake",
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": body.get("model", "fake"),
    }

    def chunk(delta: dict, fin: str | None = None, **extra: Any) -> bytes:
        d = {**base, "choices": [{"index": 0, "delta": delta, "finish_reason": fin}], **extra}
        return f"data: {json.dumps(d)}\n\n".encode()

    yield "head", chunk({"role": "assistant", "content": ""})
    for n, piece in enumerate(pieces):
        yield ("first" if n == 0 else "content"), chunk({"content": piece})
    yield "final", chunk({}, finish)
    if usage and (body.get("stream_options") or {}).get("include_usage"):
        d = {**base, "choices": [], "usage": _openai_usage(u)}
        yield "tail", f"data: {json.dumps(d)}\n\n".encode()
    yield "tail", b"data: [DONE]\n\n"


def _anthropic_events(
    body: dict, pieces: list[str], finish: str, u: dict, usage: bool
) -> Iterator[tuple[str, bytes]]:
    def ev(name: str, d: dict) -> bytes:
        return f"event: {name}\ndata: {json.dumps(d)}\n\n".encode()

    au = _anthropic_usage(u) if usage else {"input_tokens": 0, "output_tokens": 0}
    msg = {
        "id": "msg_fake",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "fake"),
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": {**au, "output_tokens": 1},
    }
    yield "head", ev("message_start", {"type": "message_start", "message": msg})
    yield (
        "head",
        ev(
            "content_block_start",
            {"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}},
        ),
    )
    yield "head", ev("ping", {"type": "ping"})
    for n, piece in enumerate(pieces):
        yield (
            ("first" if n == 0 else "content"),
            ev(
                "content_block_delta",
                {"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": piece}},
            ),
        )
    yield "final", ev("content_block_stop", {"type": "content_block_stop", "index": 0})
    yield (
        "final",
        ev(
            "message_delta",
            {
                "type": "message_delta",
                "delta": {"stop_reason": finish, "stop_sequence": None},
                "usage": {"output_tokens": au["output_tokens"]},
            },
        ),
    )
    yield "tail", ev("message_stop", {"type": "message_stop"})


async def _send_sse(
    writer: asyncio.StreamWriter,
    events: Iterator[tuple[str, bytes]],
    fault: str | None,
    delay: float,
    token_delay: float,
    bad: bytes,
) -> None:
    writer.write(
        b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\n"
        b"Transfer-Encoding: chunked\r\n\r\n"
    )
    sent_content = False
    for tag, data in events:
        if tag in ("first", "content", "final") and not sent_content and delay:
            await asyncio.sleep(delay)
        if tag == "content" and token_delay:
            await asyncio.sleep(token_delay)
        if tag in ("final", "tail") and fault == "truncated":
            break
        if tag in ("content", "final") and fault == "drop" and sent_content:
            await writer.drain()
            raise _Drop()
        if tag in ("content", "final") and fault == "malformed":
            data, fault = bad, None
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        sent_content = sent_content or tag == "first"
        if tag in ("first", "content"):
            await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _read_request(reader: asyncio.StreamReader) -> _Http | None:
    line = await reader.readline()
    if not line:
        return None
    method, path, _ = line.decode("latin-1").split(" ", 2)
    headers: dict[str, str] = {}
    while True:
        h = await reader.readline()
        if h in (b"\r\n", b"\n", b""):
            break
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    n = int(headers.get("content-length", "0"))
    body = await reader.readexactly(n) if n else b""
    return _Http(method, path.split("?", 1)[0], headers, body)


async def _send_raw(
    writer: asyncio.StreamWriter, status: int, data: bytes, ctype: str, extra: dict[str, str] | None = None
) -> None:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}",
        f"Content-Type: {ctype}",
        f"Content-Length: {len(data)}",
    ]
    lines += [f"{k}: {v}" for k, v in (extra or {}).items()]
    writer.write(("\r\n".join(lines) + "\r\n\r\n").encode() + data)
    await writer.drain()


async def _send_json(
    writer: asyncio.StreamWriter, status: int, payload: Any, extra: dict[str, str] | None = None
) -> None:
    await _send_raw(writer, status, json.dumps(payload).encode(), "application/json", extra)


async def _send_error(
    writer: asyncio.StreamWriter,
    kind: str,
    status: int,
    etype: str,
    message: str,
    extra: dict[str, str] | None = None,
) -> None:
    if kind == "anthropic":
        payload: dict = {"type": "error", "error": {"type": etype, "message": message}}
    else:
        payload = {"error": {"message": message, "type": etype, "code": None, "param": None}}
    await _send_json(writer, status, payload, extra)
