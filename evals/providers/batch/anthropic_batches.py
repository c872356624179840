"""Anthropic's Message Batches through the official `anthropic` SDK.

A submission is one `messages.batches.create` call with the same Messages bodies the
synchronous provider sends (prompt-cache marks included: cache reads and writes are billed at
the batch rate's multiples). Results stream as JSONL, in any order, once the batch has ended;
they are read line by line (`with_streaming_response`) so that one bad line is named and the
others kept. Message Batches carry no metadata: a batch created by a run killed before it
recorded the id is found by its creation time and request count, and only when exactly one
unrecorded batch fits (`find`).
"""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

from routeopt.evals.providers.anthropic_provider import AnthropicProvider
from routeopt.evals.providers.base import ProviderError, Request
from routeopt.evals.providers.batch import BadLine, BatchGone, BatchStatus, LineResult
from routeopt.evals.providers.sdk import StreamTimer, map_error

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate

_STATES = {"succeeded": "answered", "errored": "errored", "canceled": "cancelled", "expired": "expired"}


class AnthropicBatches:
    """One candidate's Message Batches."""

    def __init__(self, candidate: "Candidate"):
        self.candidate = candidate
        self.sync = AnthropicProvider(candidate, stream=False)

    def encode(self, custom_id: str, request: Request) -> dict:
        params = self.sync._params(request)
        params.update(params.pop("extra_body", None) or {})
        return {"custom_id": custom_id, "params": params}

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import anthropic

        try:
            return await fn(*args, **kwargs)
        except anthropic.NotFoundError as exc:
            raise BatchGone(str(exc)) from None
        except ProviderError:
            raise
        except Exception as exc:
            raise map_error(exc, anthropic, self.candidate.api_key()) from None

    async def upload(self, submission_id: str, lines: list[dict]) -> str | None:
        return None  # the requests travel in the create call

    async def create(self, submission_id: str, file_id: str | None, lines: list[dict]) -> BatchStatus:
        b = await self._call(self.sync._sdk().messages.batches.create, requests=lines)
        return _status(b)

    async def find(
        self, submission_id: str, file_id: str | None, created_after: float, n_requests: int, known: set[str]
    ) -> str | None:
        page = await self._call(self.sync._sdk().messages.batches.list, limit=100)
        fits = []
        async for b in page:
            created = b.created_at.timestamp() if isinstance(b.created_at, datetime) else 0.0
            if created < created_after - 60:
                break
            total = sum(b.request_counts.model_dump().values())
            if b.id not in known and total == n_requests:
                fits.append(b.id)
        return fits[0] if len(fits) == 1 else None

    async def retrieve(self, batch_id: str) -> BatchStatus:
        return _status(await self._call(self.sync._sdk().messages.batches.retrieve, batch_id))

    async def cancel(self, batch_id: str) -> None:
        await self._call(self.sync._sdk().messages.batches.cancel, batch_id)

    async def results(self, status: BatchStatus) -> list[tuple[str, int, str]]:
        async def read() -> list[tuple[str, int, str]]:
            batches = self.sync._sdk().messages.batches
            out = []
            async with batches.with_streaming_response.results(status.batch_id) as resp:
                n = 0
                async for line in resp.iter_lines():
                    n += 1
                    if line.strip():
                        out.append((status.batch_id, n, line))
            return out

        return await self._call(read)

    def parse(self, text: str, request: Request | None) -> LineResult:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadLine(f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
            raise BadLine("no custom_id")
        cid, result = obj["custom_id"], obj.get("result") or {}
        state = _STATES.get(result.get("type"), "errored")
        if state != "answered":
            inner = (result.get("error") or {}).get("error") or result.get("error") or {}
            return LineResult(
                cid,
                state,
                error_kind="client_error" if state == "errored" else None,
                message=f"{result.get('type')}: {inner.get('type', '')} {inner.get('message', '')}".strip()[
                    :500
                ],
            )
        if request is None:
            return LineResult(cid, "answered")
        from anthropic.types import Message

        try:
            c = AnthropicProvider._whole(
                Message.model_validate(result.get("message")), request, StreamTimer()
            )
        except ProviderError as e:
            return LineResult(cid, "errored", error_kind=e.kind, message=e.message)
        except Exception as exc:
            return LineResult(
                cid,
                "errored",
                error_kind="bad_response",
                message=f"answer does not match the API schema: {exc}"[:500],
            )
        c.latency_s, c.ttft_s, c.chunk_gaps_s = 0.0, None, []
        return LineResult(cid, "answered", completion=c)

    async def aclose(self) -> None:
        await self.sync.aclose()


def _status(b: Any) -> BatchStatus:
    counts = b.request_counts.model_dump() if getattr(b, "request_counts", None) else {}
    return BatchStatus(b.id, b.processing_status, b.processing_status == "ended", counts=counts)


def create(candidate: "Candidate") -> AnthropicBatches:
    """Registry factory (`routeopt.evals.providers.batch.BATCH_APIS`)."""
    return AnthropicBatches(candidate)
