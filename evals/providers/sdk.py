"""What the OpenAI and Anthropic providers share: timing, token estimates, error mapping.

Timing follows vLLM's serving-benchmark definitions: TTFT is the time from sending the request
to the first chunk with non-empty content; inter-chunk gaps are the times between consecutive
content chunks (vLLM's ITL); TPOT = (latency - TTFT) / (output tokens - 1) (`Completion.tpot_s`).
Non-streamed calls have no TTFT (None): the first token cannot be observed.

What counts as an answer: a stream that ends without its finish chunk / stop reason is
`truncated_stream`; a 200 without choices (content) or with malformed JSON is `bad_response`;
both are retried. A server that answers a stream request with one JSON document instead of
server-sent events (LiteLLM's proxy does, for Anthropic) has sent a non-streamed answer: it is
checked and recorded as one (`json_answer`), with TTFT unknown (`Completion.streamed` False). Empty content that the server marked complete is an answer, and is graded
(usually a fail): it may be what the model really said, and hiding it would flatter the model.
"""

from __future__ import annotations

import email.utils
import importlib
import json
import math
import re
import sys
import time
from types import ModuleType
from typing import TYPE_CHECKING, Any, Mapping

from routeopt.evals.providers.base import CALL_PROGRESS, Completion, ProviderError, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate

# Placeholder key for OpenAI-compatible servers that need none (vLLM, TGI): the SDKs refuse None.
NO_KEY = "not-needed"
_KEYLIKE = re.compile(r"(sk-[A-Za-z0-9_\-]{4,}|sk-ant-[A-Za-z0-9_\-]{4,})")


class SdkProvider:
    """A candidate served through a vendor SDK: the client is created on first use, never at
    import, with the key read from the environment variable the config names."""

    def __init__(self, candidate: "Candidate", *, stream: bool = True):
        self.candidate = candidate
        self.stream = stream
        self._client: Any = None

    def _key(self) -> str:
        key = self.candidate.api_key()
        if self.candidate.api_key_env and not key:
            raise ProviderError(
                "auth",
                f"environment variable {self.candidate.api_key_env} is not set "
                f"(api_key_env of candidate {self.candidate.name!r})",
            )
        return key or NO_KEY

    VENDOR: str  # the SDK's module name, for mapping its exceptions

    def _sdk(self) -> Any:
        raise NotImplementedError

    async def _plain(self, client: Any, request: Request) -> Completion:
        raise NotImplementedError

    async def _streamed(self, client: Any, request: Request) -> Completion:
        raise NotImplementedError

    async def generate(self, request: Request) -> Completion:
        """One call; every SDK exception becomes a ProviderError of the right kind, key redacted."""
        client = self._sdk()
        try:
            if self.stream:
                return await self._streamed(client, request)
            return await self._plain(client, request)
        except ProviderError:
            raise
        except Exception as exc:
            vendor = importlib.import_module(self.VENDOR)
            raise map_error(exc, vendor, self.candidate.api_key()) from None

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.close()
            self._client = None


def estimate_tokens(text: str) -> int:
    """~4 characters per token (OpenAI's rule of thumb for English); used only when the
    server reports no usage, and the row is marked `tokens_estimated`. Offline, no downloads."""
    return math.ceil(len(text) / 4) if text else 0


def redact(text: str, secret: str | None) -> str:
    """Remove the API key (and anything key-shaped) from a message before it is recorded."""
    if secret and secret != NO_KEY:
        text = text.replace(secret, "[redacted]")
    return _KEYLIKE.sub("[redacted]", text)


def retry_after(headers: Mapping[str, str] | None) -> float | None:
    """Seconds to wait from `retry-after-ms` or `retry-after` (seconds or an HTTP date)."""
    if not headers:
        return None
    ms = headers.get("retry-after-ms")
    if ms:
        try:
            return max(0.0, float(ms) / 1000.0)
        except ValueError:
            pass
    value = headers.get("retry-after")
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        parsed = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, parsed.timestamp() - time.time())


async def json_answer(stream: Any) -> dict[str, Any] | None:
    """The body of a stream request's answer when it is one JSON document (Content-Type JSON)
    rather than server-sent events, read and the stream closed; None for an event stream.

    Malformed JSON is `bad_response`, a body cut short a transport error, as for a plain call.
    """
    response = stream.response
    ctype = response.headers.get("content-type", "").split(";")[0].strip().lower()
    if not ctype.endswith("json"):
        return None
    try:
        body = json.loads(await response.aread())
    finally:
        await stream.close()
    if not isinstance(body, dict):
        raise ProviderError(
            "bad_response", f"JSON answer to a stream request is a {type(body).__name__}, not an object"
        )
    return body


class StreamTimer:
    """Collects TTFT and inter-chunk gaps of the non-empty content chunks of one call, and
    records what has arrived in the runner's `CallProgress` (if any), for pricing failures."""

    def __init__(self) -> None:
        self.sent = time.perf_counter()
        self.ttft_s: float | None = None
        self.gaps: list[float] = []
        self._last: float | None = None
        self.progress = CALL_PROGRESS.get()

    def began(self) -> None:
        """The server answered and began its response (a stream event or a 200 body)."""
        if self.progress is not None:
            self.progress.started = True

    def reported(self, input_tokens: int | None, output_tokens: int | None = None) -> None:
        """Token counts the server reported before the call ended (usage events, a 200 body)."""
        if self.progress is not None:
            self.progress.started = True
            if input_tokens:
                self.progress.input_tokens = input_tokens
            if output_tokens is not None:
                self.progress.output_tokens = output_tokens

    def content(self, piece: str = "") -> None:
        if self.progress is not None:
            self.progress.started = True
            self.progress.output_chars += len(piece)
        now = time.perf_counter()
        if self.ttft_s is None:
            self.ttft_s = now - self.sent
        else:
            assert self._last is not None
            self.gaps.append(now - self._last)
        self._last = now

    def latency(self) -> float:
        return time.perf_counter() - self.sent

    def completion(
        self, request: Request, text: str, finish: str, tokens: tuple[int, int, int] | None, *, streamed: bool
    ) -> Completion:
        """The call's Completion: `tokens` = (input, output, cached input) as the server
        reported them, or None when it reported none, and then estimated (and marked so)."""
        c = Completion(
            text=text,
            finish_reason=finish,
            latency_s=self.latency(),
            ttft_s=self.ttft_s if streamed else None,
            chunk_gaps_s=self.gaps,
            streamed=streamed,
        )
        if tokens is not None:
            c.input_tokens, c.output_tokens, c.cached_input_tokens = tokens
        else:
            c.input_tokens = estimate_tokens(request.prompt_text)
            c.output_tokens = estimate_tokens(text)
            c.cached_input_tokens = 0
            c.tokens_estimated = True
        return c


def _status_error(status: int, message: str, headers: Mapping[str, str] | None) -> ProviderError:
    text = f"HTTP {status}: {message}"
    if status == 429:
        return ProviderError("rate_limited", text, retry_after(headers), status=status)
    if status in (401, 403):
        return ProviderError("auth", text, status=status)
    if status == 408:
        return ProviderError("timeout", text, status=status)
    if status == 404:  # no such model or route: the candidate's model/base_url is wrong
        return ProviderError("config", text, status=status)
    if status >= 500:
        return ProviderError("server_error", text, retry_after(headers), status=status)
    return ProviderError("client_error", text, status=status)


def transport(sdk: ModuleType) -> ModuleType:
    """The HTTP library an SDK is built on (httpx, or httpx2 in later openai and anthropic
    releases): the package of its default client's base class. Its errors can surface raw from
    a stream, and routeopt depends on it only through the SDK, so it is never named here."""
    base = next(c for c in sdk.DefaultAsyncHttpxClient.__mro__ if c.__module__.split(".")[0] != sdk.__name__)
    return sys.modules[base.__module__.split(".")[0]]


def map_error(exc: BaseException, sdk: ModuleType, secret: str | None) -> ProviderError:
    """Translate an SDK / transport exception into the ProviderError kind the runner acts on."""
    err = _map(exc, sdk, (transport(sdk),))
    err.message = redact(err.message, secret)[:2000]
    err.args = (f"{err.kind}: {err.message}",)
    return err


def _map(exc: BaseException, sdk: ModuleType, transports: tuple[ModuleType, ...]) -> ProviderError:
    cause = f" ({type(exc.__cause__).__name__}: {exc.__cause__})" if exc.__cause__ else ""
    if isinstance(exc, sdk.APIStatusError):
        headers = exc.response.headers if exc.response is not None else None
        return _status_error(exc.status_code, _body_message(exc) + _sent_to(exc), headers)
    if isinstance(exc, sdk.APITimeoutError):
        return ProviderError("timeout", f"request timed out{cause}{_sent_to(exc)}")
    if isinstance(exc, sdk.APIConnectionError):
        return ProviderError("connection", f"{exc}{cause}{_sent_to(exc)}")
    if isinstance(exc, sdk.APIResponseValidationError):
        return ProviderError("bad_response", f"response did not match the API schema: {exc}")
    if isinstance(exc, sdk.APIError):  # e.g. an error event inside a stream
        return ProviderError("server_error", f"error in response: {exc}")
    if isinstance(exc, (json.JSONDecodeError, UnicodeDecodeError)):
        return ProviderError("bad_response", f"response is not valid JSON: {exc}")
    for t in transports:
        if isinstance(exc, t.TimeoutException):
            return ProviderError("timeout", f"{type(exc).__name__}: {exc}")
        if isinstance(exc, t.TransportError):
            return ProviderError("connection", f"{type(exc).__name__}: {exc}")
    return ProviderError("internal", f"{type(exc).__name__}: {exc}")


def _body_message(exc: Any) -> str:
    """What the server said: the body's error message and its type or code (LiteLLM's proxy
    answers a key it cannot check with `No connected db.` typed `no_db_connection`), else its
    `detail` (FastAPI's 404), else the SDK's text."""
    body = getattr(exc, "body", None)
    if isinstance(body, dict):
        inner = body.get("error", body)
        if isinstance(inner, dict) and inner.get("message"):
            tag = next(
                (
                    str(inner[k])
                    for k in ("type", "code")
                    if inner.get(k) and str(inner[k]) not in str(inner["message"])
                ),
                "",
            )
            return str(inner["message"]) + (f" [{tag}]" if tag else "")
        if isinstance(inner, str) and inner:
            return inner
        if body.get("detail"):
            return str(body["detail"])
    if isinstance(body, str) and body.strip():
        return body.strip()[:500]
    return str(getattr(exc, "message", exc))


def _sent_to(exc: Any) -> str:
    """' (POST <url>)': where the failed request went, so an error names the endpoint that
    refused it. The query string is left out (some APIs take a key there)."""
    try:
        request = exc.request
        url = request.url.copy_with(query=None, fragment=None)
        return f" ({request.method} {url})"
    except Exception:  # no request attached (an error raised before sending)
        return ""
