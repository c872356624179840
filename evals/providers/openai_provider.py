"""OpenAI Chat Completions through the official `openai` SDK; any OpenAI-compatible server
(vLLM, TGI, llama.cpp) works by pointing the candidate's `base_url` at it.

Streams by default, measuring TTFT and inter-chunk gaps the way vLLM's benchmarks do (see
`routeopt.evals.providers.sdk`). The SDK's own retries are off (`max_retries=0`): the runner retries,
with backoff, limits and a circuit breaker it can account for. A stream that ends without a
finish reason is a `truncated_stream` error, never an empty answer; one JSON body sent for a
stream request is a non-streamed answer (`routeopt.evals.providers.sdk.json_answer`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from routeopt.evals.providers.sdk import SdkProvider, StreamTimer, json_answer
from routeopt.evals.providers.base import Completion, ProviderError, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate


class OpenAIProvider(SdkProvider):
    """One candidate's Chat Completions client (OpenAI, vLLM, TGI: any compatible server)."""

    VENDOR = "openai"

    def _sdk(self) -> Any:
        if self._client is None:
            import openai

            self._client = openai.AsyncOpenAI(
                api_key=self._key(),
                base_url=self.candidate.base_url,
                max_retries=0,
                timeout=self.candidate.timeout_s,
            )
        return self._client

    def _params(self, request: Request) -> dict[str, Any]:
        s = request.settings
        params: dict[str, Any] = {
            "model": self.candidate.model,
            "messages": [{"role": m.role, "content": m.content} for m in request.messages],
            "max_tokens": s.max_tokens,
            "temperature": s.temperature,
        }
        if s.stop:
            params["stop"] = list(s.stop)
        if s.top_p is not None:
            params["top_p"] = s.top_p
        return params

    async def _plain(self, client: Any, request: Request) -> Completion:
        timer = StreamTimer()
        resp = await client.chat.completions.create(**self._params(request))
        return self._whole(resp, request, timer)

    @staticmethod
    def _whole(resp: Any, request: Request, timer: StreamTimer) -> Completion:
        """A non-streamed answer: a plain call's, or one JSON body sent for a stream request."""
        usage = _tokens(getattr(resp, "usage", None))
        timer.reported(*(usage[:2] if usage else (None, None)))
        if not getattr(resp, "choices", None):
            raise ProviderError("bad_response", "200 response without choices")
        choice = resp.choices[0]
        if choice.finish_reason is None or choice.message is None:
            raise ProviderError("bad_response", "choice without message or finish_reason")
        return timer.completion(
            request, choice.message.content or "", choice.finish_reason, usage, streamed=False
        )

    async def _streamed(self, client: Any, request: Request) -> Completion:
        timer = StreamTimer()
        stream = await client.chat.completions.create(
            **self._params(request), stream=True, stream_options={"include_usage": True}
        )
        body = await json_answer(stream)
        if body is not None:
            from openai.types.chat import ChatCompletion

            return self._whole(ChatCompletion.model_construct(**body), request, timer)
        parts: list[str] = []
        finish: str | None = None
        usage = None
        chunks = 0
        try:
            async for chunk in stream:
                chunks += 1
                timer.began()
                if getattr(chunk, "usage", None):
                    usage = chunk.usage
                    timer.reported(*(_tokens(usage) or (None, None))[:2])
                for choice in chunk.choices or []:
                    if choice.index != 0:
                        continue
                    piece = choice.delta.content if choice.delta is not None else None
                    if piece:
                        timer.content(piece)
                        parts.append(piece)
                    if choice.finish_reason:
                        finish = choice.finish_reason
        finally:
            await stream.close()
        if finish is None:
            raise ProviderError(
                "truncated_stream", f"stream ended after {chunks} chunks without a finish_reason"
            )
        return timer.completion(request, "".join(parts), finish, _tokens(usage), streamed=True)

    async def prepare(self) -> None:
        """Import the SDK and build the client before the first timed call (imports are slow)."""
        try:
            client = self._sdk()
        except ProviderError:
            return  # a missing key is reported by each call
        from openai.types.chat import ChatCompletion, ChatCompletionChunk  # noqa: F401

        client.chat.completions  # noqa: B018 - resources load lazily on first access


def _tokens(usage: Any) -> tuple[int, int, int] | None:
    """(input, output, cached input) from an OpenAI usage object; None if it has no counts."""
    if usage is None or getattr(usage, "completion_tokens", None) is None:
        return None
    details = getattr(usage, "prompt_tokens_details", None)
    return usage.prompt_tokens, usage.completion_tokens, getattr(details, "cached_tokens", None) or 0


def create(candidate: "Candidate") -> OpenAIProvider:
    """Registry factory (`routeopt.evals.providers.PROVIDERS`)."""
    return OpenAIProvider(candidate, stream=candidate.stream)
