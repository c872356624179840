"""OpenAI's Batch API (`/v1/files` + `/v1/batches`) through the official `openai` SDK.

Any OpenAI-compatible server that serves both routes works by pointing `base_url` at it.
A submission is one JSONL file (`purpose="batch"`) of `/v1/chat/completions` requests, the
same bodies the synchronous provider sends (without streaming); the batch carries our
submission id in `metadata`, so a run killed between creating a batch and recording its id
finds it again (`find`). Results come as an output file (answers) and an error file (lines that
failed, expired or were cancelled), in any order.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from routeopt.evals.providers.base import ProviderError, Request
from routeopt.evals.providers.batch import BadLine, BatchGone, BatchStatus, LineResult
from routeopt.evals.providers.openai_provider import OpenAIProvider
from routeopt.evals.providers.sdk import StreamTimer, _status_error, map_error

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate

ENDPOINT = "/v1/chat/completions"
_ENDED = {"completed", "expired", "cancelled", "failed"}
_LINE_STATES = {"batch_expired": "expired", "batch_cancelled": "cancelled"}


class OpenAIBatches:
    """One candidate's batches on an OpenAI-compatible server."""

    def __init__(self, candidate: "Candidate"):
        self.candidate = candidate
        self.sync = OpenAIProvider(candidate, stream=False)  # its client and request bodies

    def encode(self, custom_id: str, request: Request) -> dict:
        return {"custom_id": custom_id, "method": "POST", "url": ENDPOINT, "body": self.sync._params(request)}

    async def _call(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        import openai

        try:
            return await fn(*args, **kwargs)
        except openai.NotFoundError as exc:
            raise BatchGone(str(exc)) from None
        except ProviderError:
            raise
        except Exception as exc:
            raise map_error(exc, openai, self.candidate.api_key()) from None

    async def upload(self, submission_id: str, lines: list[dict]) -> str | None:
        data = "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines).encode()
        client = self.sync._sdk()
        f = await self._call(client.files.create, file=(f"{submission_id}.jsonl", data), purpose="batch")
        return f.id

    async def create(self, submission_id: str, file_id: str | None, lines: list[dict]) -> BatchStatus:
        client = self.sync._sdk()
        b = await self._call(
            client.batches.create,
            input_file_id=file_id,
            endpoint=ENDPOINT,
            completion_window="24h",
            metadata={"routeopt_submission": submission_id},
        )
        return _status(b)

    async def find(
        self, submission_id: str, file_id: str | None, created_after: float, n_requests: int, known: set[str]
    ) -> str | None:
        """The batch created for this submission, by the id in its metadata."""
        client = self.sync._sdk()
        page = await self._call(client.batches.list, limit=100)
        async for b in page:
            if (b.metadata or {}).get("routeopt_submission") == submission_id:
                return b.id
            if b.created_at < created_after - 3600:
                break
        return None

    async def retrieve(self, batch_id: str) -> BatchStatus:
        return _status(await self._call(self.sync._sdk().batches.retrieve, batch_id))

    async def cancel(self, batch_id: str) -> None:
        await self._call(self.sync._sdk().batches.cancel, batch_id)

    async def results(self, status: BatchStatus) -> list[tuple[str, int, str]]:
        """(file id, line number, text) of every line of the output and error files."""
        out: list[tuple[str, int, str]] = []
        for file_id in (status.output_file_id, status.error_file_id):
            if not file_id:
                continue
            content = await self._call(self.sync._sdk().files.content, file_id)
            text = content.content.decode("utf-8", errors="replace")
            out += [(file_id, n, line) for n, line in enumerate(text.splitlines(), 1) if line.strip()]
        return out

    def parse(self, text: str, request: Request | None) -> LineResult:
        try:
            obj = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BadLine(f"not JSON ({exc.msg})") from None
        if not isinstance(obj, dict) or not isinstance(obj.get("custom_id"), str):
            raise BadLine("no custom_id")
        cid = obj["custom_id"]
        err = obj.get("error")
        if err:
            code = str(err.get("code") or "")
            return LineResult(
                cid,
                _LINE_STATES.get(code, "errored"),
                error_kind="server_error",
                message=f"{code}: {err.get('message')}",
            )
        response = obj.get("response") or {}
        status, body = int(response.get("status_code") or 0), response.get("body") or {}
        if status != 200:
            message = (body.get("error") or {}).get("message") if isinstance(body, dict) else None
            e = _status_error(status, str(message or body)[:500], None)
            return LineResult(cid, "errored", error_kind=e.kind, message=e.message)
        if request is None:
            return LineResult(cid, "answered")
        from openai.types.chat import ChatCompletion

        try:
            c = OpenAIProvider._whole(ChatCompletion.model_validate(body), request, StreamTimer())
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
    errors = []
    for e in (getattr(b.errors, "data", None) or []) if getattr(b, "errors", None) else []:
        where = f"line {e.line}" if getattr(e, "line", None) is not None else "batch"
        errors.append(f"{where}: {e.code}: {e.message}")
    return BatchStatus(
        b.id,
        b.status,
        b.status in _ENDED,
        failed=b.status == "failed",
        output_file_id=b.output_file_id,
        error_file_id=b.error_file_id,
        counts=counts,
        errors=errors,
    )


def create(candidate: "Candidate") -> OpenAIBatches:
    """Registry factory (`routeopt.evals.providers.batch.BATCH_APIS`)."""
    return OpenAIBatches(candidate)
