"""The one small interface every model provider implements, and the types it speaks.

Providers turn a `Request` into a `Completion`, measuring time to first token and latency the
way serving benchmarks do (vLLM's definitions: TTFT = first non-empty content chunk minus send
time; TPOT = (latency - TTFT) / (output tokens - 1)). A provider raises `ProviderError` for
anything that is not a complete answer, so the runner can retry, back off or record it.
"""

from __future__ import annotations

from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

Role = Literal["system", "user", "assistant"]


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True)
class GenerationSettings:
    max_tokens: int = 256
    temperature: float = 0.0
    stop: tuple[str, ...] = ()
    top_p: float | None = None

    @property
    def deterministic(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class Request:
    messages: tuple[Message, ...]
    settings: GenerationSettings = GenerationSettings()
    # How many leading messages every request of its suite shares (system prompt, few-shot
    # turns): the prefix a provider's prompt cache may keep. None: unknown (the system prompt).
    shared_messages: int | None = None

    @property
    def shared_chat(self) -> int | None:
        """How many leading non-system messages are shared (None: unknown)."""
        if self.shared_messages is None:
            return None
        return sum(1 for m in self.messages[: self.shared_messages] if m.role != "system")

    @property
    def system(self) -> str | None:
        parts = [m.content for m in self.messages if m.role == "system"]
        return "\n\n".join(parts) if parts else None

    @property
    def chat(self) -> list[dict[str, str]]:
        """Messages without the system prompt, as wire-format dicts."""
        return [{"role": m.role, "content": m.content} for m in self.messages if m.role != "system"]

    @property
    def prompt_text(self) -> str:
        """All message text, for routing features and token estimates."""
        return "\n".join(m.content for m in self.messages)


@dataclass
class Completion:
    text: str
    finish_reason: str
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None  # input read from a prompt/prefix cache
    cache_write_input_tokens: int | None = None  # input written to a prompt cache (Anthropic)
    tokens_estimated: bool = False
    ttft_s: float | None = None
    latency_s: float = 0.0
    chunk_gaps_s: list[float] = field(default_factory=list)
    draft_tokens: int | None = None  # speculative decoding: tokens a draft model proposed
    accepted_draft_tokens: int | None = None  # of which the target accepted
    # True: the answer arrived as a stream, so TTFT was observed. False: as one body (a plain
    # call, or a server that answered a stream request with JSON), so TTFT and TPOT are
    # unknown (None), never made up. None: not recorded (older cache entries).
    streamed: bool | None = None

    @property
    def tpot_s(self) -> float | None:
        """Per-request time per output token after the first (vLLM's TPOT)."""
        if self.ttft_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.latency_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass
class CallProgress:
    """What one call had received when it ended, so that a call that fails after the server
    began to answer can be priced: servers bill the prompt and every token they generated,
    whether or not the answer arrived whole. Filled by the SDK providers (`StreamTimer`)."""

    started: bool = False  # the server answered 200 and began its response
    input_tokens: int | None = None  # as the server reported them, if it did
    output_tokens: int | None = None
    output_chars: int = 0  # content received so far (tokens estimated from it)


CALL_PROGRESS: ContextVar[CallProgress | None] = ContextVar("routeopt_call_progress", default=None)
"""Set by the runner around one provider call; providers record into it when it is set."""


ErrorKind = Literal[
    "rate_limited",
    "server_error",
    "connection",
    "timeout",
    "bad_response",
    "truncated_stream",
    "empty_content",
    "client_error",
    "auth",
    "config",
    "circuit_open",
    "budget",
    "internal",
]

RETRYABLE: frozenset[str] = frozenset(
    {"rate_limited", "server_error", "connection", "timeout", "bad_response", "truncated_stream"}
)


class ProviderError(Exception):
    """A call that produced no usable completion; `kind` says which fault it was."""

    def __init__(
        self, kind: ErrorKind, message: str, retry_after_s: float | None = None, status: int | None = None
    ):
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message
        self.retry_after_s = retry_after_s
        self.status = status  # the HTTP status the server answered with, if it answered one

    @property
    def retryable(self) -> bool:
        return self.kind in RETRYABLE


@runtime_checkable
class Provider(Protocol):
    """An async model client. Created per candidate; no network or heavy work in __init__."""

    async def generate(self, request: Request) -> Completion: ...

    async def aclose(self) -> None: ...
