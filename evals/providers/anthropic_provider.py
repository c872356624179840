"""Anthropic Messages through the official `anthropic` SDK; the system prompt goes in `system=`.

Streams by default (raw events: message_start ... message_stop), measuring TTFT and
inter-chunk gaps as vLLM's benchmarks define them (see `routeopt.evals.providers.sdk`). A stream without
`message_stop` or a stop reason is a `truncated_stream` error; one JSON body sent for a stream
request is a non-streamed answer (`routeopt.evals.providers.sdk.json_answer`). The SDK's retries are
off; the runner retries. This SDK version has no `temperature`/`top_p` arguments, so they are sent in
`extra_body` (the Messages API accepts both), keeping evals deterministic.

Prompt caching: unless the candidate's `prefix_cache.enabled` is false, the prefix a request
shares with the other requests of its suite (`Request.shared_messages`) is marked with
`cache_control` (ephemeral, 5 minutes): the system prompt, and the last shared chat message
(the end of the suite's few-shot turns). Anthropic caches
prefixes above a minimum length (1,024 or 2,048 tokens by model) and ignores shorter marks.

Token accounting: Anthropic's `input_tokens` excludes cache reads and writes; `Completion`
counts all input, so input = input_tokens + cache_read + cache_creation, cached input =
`cache_read_input_tokens` and cache-write input = `cache_creation_input_tokens`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from routeopt.evals.providers.sdk import SdkProvider, StreamTimer, json_answer
from routeopt.evals.providers.base import Completion, ProviderError, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate


class AnthropicProvider(SdkProvider):
    """One candidate's Anthropic Messages client."""

    VENDOR = "anthropic"

    def _sdk(self) -> Any:
        if self._client is None:
            import anthropic

            kwargs: dict[str, Any] = {}
            if self.candidate.base_url:
                kwargs["base_url"] = self.candidate.base_url
            self._client = anthropic.AsyncAnthropic(
                api_key=self._key(), max_retries=0, timeout=self.candidate.timeout_s, **kwargs
            )
        return self._client

    def _params(self, request: Request) -> dict[str, Any]:
        s = request.settings
        cache = self.candidate.prefix_cache.enabled
        params: dict[str, Any] = {
            "model": self.candidate.model,
            "max_tokens": s.max_tokens,
            "messages": _mark_shared(request) if cache else request.chat,
        }
        if request.system:
            shared_system = request.shared_messages is None or any(
                m.role == "system" for m in request.messages[: request.shared_messages]
            )
            params["system"] = [_cached_text(request.system)] if cache and shared_system else request.system
        if s.stop:
            params["stop_sequences"] = list(s.stop)
        extra: dict[str, Any] = {"temperature": s.temperature}
        if s.top_p is not None:
            extra["top_p"] = s.top_p
        params["extra_body"] = extra
        return params

    async def _plain(self, client: Any, request: Request) -> Completion:
        timer = StreamTimer()
        msg = await client.messages.create(**self._params(request))
        return self._whole(msg, request, timer)

    @staticmethod
    def _whole(msg: Any, request: Request, timer: StreamTimer) -> Completion:
        """A non-streamed answer: a plain call's, or one JSON body sent for a stream request
        (LiteLLM's proxy answers streamed Messages requests so)."""
        blocks = getattr(msg, "content", None)
        if blocks is None or getattr(msg, "stop_reason", None) is None:
            timer.began()
            raise ProviderError("bad_response", "200 response without content or stop_reason")
        text = "".join(getattr(b, "text", "") or "" for b in blocks if getattr(b, "type", "") == "text")
        usage = _Usage()
        usage.start(getattr(msg, "usage", None))
        timer.reported(usage.input, usage.output)
        return usage.with_writes(
            timer.completion(request, text, msg.stop_reason, usage.tokens(), streamed=False)
        )

    async def _streamed(self, client: Any, request: Request) -> Completion:
        timer = StreamTimer()
        stream = await client.messages.create(**self._params(request), stream=True)
        body = await json_answer(stream)
        if body is not None:
            from anthropic.types import Message

            return self._whole(Message.model_construct(**body), request, timer)
        parts: list[str] = []
        usage = _Usage()
        stop_reason: str | None = None
        stopped = False
        events = 0
        try:
            async for ev in stream:
                events += 1
                timer.began()
                if ev.type == "message_start":
                    usage.start(ev.message.usage)
                    timer.reported(usage.input, None)
                elif ev.type == "content_block_delta" and getattr(ev.delta, "type", "") == "text_delta":
                    if ev.delta.text:
                        timer.content(ev.delta.text)
                        parts.append(ev.delta.text)
                elif ev.type == "message_delta":
                    stop_reason = ev.delta.stop_reason or stop_reason
                    usage.delta(getattr(ev, "usage", None))
                    timer.reported(None, usage.output)
                elif ev.type == "message_stop":
                    stopped = True
        finally:
            await stream.close()
        if not stopped or stop_reason is None:
            raise ProviderError(
                "truncated_stream", f"stream ended after {events} events without message_stop/stop_reason"
            )
        return usage.with_writes(
            timer.completion(request, "".join(parts), stop_reason, usage.tokens(), streamed=True)
        )

    async def prepare(self) -> None:
        """Import the SDK and build the client before the first timed call (imports are slow)."""
        try:
            client = self._sdk()
        except ProviderError:
            return  # a missing key is reported by each call
        from anthropic.types import Message, RawMessageStreamEvent  # noqa: F401

        client.messages  # noqa: B018 - resources load lazily on first access


class _Usage:
    """Accumulates Anthropic usage from message_start and message_delta."""

    def __init__(self) -> None:
        self.input: int | None = None
        self.cached = 0
        self.written = 0
        self.output: int | None = None

    def start(self, u: Any) -> None:
        if u is None:
            return
        read = getattr(u, "cache_read_input_tokens", None) or 0
        write = getattr(u, "cache_creation_input_tokens", None) or 0
        self.input = (getattr(u, "input_tokens", None) or 0) + read + write
        self.cached, self.written = read, write
        self.output = getattr(u, "output_tokens", None)

    def delta(self, u: Any) -> None:
        if u is not None and getattr(u, "output_tokens", None) is not None:
            self.output = u.output_tokens

    def tokens(self) -> tuple[int, int, int] | None:
        """(input, output, cached input), or None when the server reported no usage (zeros)."""
        if self.input and self.output is not None:
            return self.input, self.output, self.cached
        return None

    def with_writes(self, c: Completion) -> Completion:
        """The completion with its cache-write tokens (unknown when usage was estimated)."""
        c.cache_write_input_tokens = None if c.tokens_estimated else self.written
        return c


_EPHEMERAL = {"type": "ephemeral"}


def _cached_text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text, "cache_control": _EPHEMERAL}


def _mark_shared(request: Request) -> list[dict[str, Any]]:
    """The chat with a cache breakpoint on its last shared message (the end of a suite's
    few-shot turns), when the request says which messages its suite shares."""
    chat = request.chat
    n = request.shared_chat
    if not n or n > len(chat):
        return chat
    end = chat[n - 1]
    return [*chat[: n - 1], {"role": end["role"], "content": [_cached_text(end["content"])]}, *chat[n:]]


def create(candidate: "Candidate") -> AnthropicProvider:
    """Registry factory (`routeopt.evals.providers.PROVIDERS`)."""
    return AnthropicProvider(candidate, stream=candidate.stream)
