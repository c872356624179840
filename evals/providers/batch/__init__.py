"""Provider Batch APIs behind one small interface, one module per provider.

`openai_batches` speaks `/v1/files` + `/v1/batches` (OpenAI, and OpenAI-compatible servers
that serve them, e.g. LiteLLM's proxy); `anthropic_batches` speaks Message Batches. Both go
through the official SDKs, imported on first use. What they return is plain data: the batch's
state, and each result line as an answer or a named error, matched by `custom_id`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import TYPE_CHECKING, Protocol

from routeopt.evals.providers.base import Completion, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate


class BatchGone(Exception):
    """The provider no longer knows a batch id (HTTP 404)."""


@dataclass
class BatchStatus:
    """A batch as the provider reports it."""

    batch_id: str
    state: str  # the provider's own word: validating, in_progress, ended, ...
    ended: bool  # terminal: no line will change any more
    failed: bool = False  # the whole batch was refused (validation, an enqueued-token limit)
    output_file_id: str | None = None
    error_file_id: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)  # "line 3: reason" for a refused batch


@dataclass
class LineResult:
    """One result line: an answer, or why the line has none (`state`)."""

    custom_id: str
    state: str  # answered, errored, expired, cancelled
    completion: Completion | None = None
    error_kind: str | None = None
    message: str | None = None


class BadLine(ValueError):
    """A results line that cannot be read (not JSON, no custom_id)."""


class BatchApi(Protocol):
    """One candidate's Batch API client. No network in __init__."""

    def encode(self, custom_id: str, request: Request) -> dict: ...

    async def upload(self, submission_id: str, lines: list[dict]) -> str | None: ...

    async def create(self, submission_id: str, file_id: str | None, lines: list[dict]) -> BatchStatus: ...

    async def find(
        self, submission_id: str, file_id: str | None, created_after: float, n_requests: int, known: set[str]
    ) -> str | None: ...

    async def retrieve(self, batch_id: str) -> BatchStatus: ...

    async def cancel(self, batch_id: str) -> None: ...

    async def results(self, status: BatchStatus) -> list[tuple[str, int, str]]: ...

    def parse(self, text: str, request: Request | None) -> LineResult: ...

    async def aclose(self) -> None: ...


BATCH_APIS: dict[str, str] = {
    "openai": "routeopt.evals.providers.batch.openai_batches:create",
    "anthropic": "routeopt.evals.providers.batch.anthropic_batches:create",
}


def make_batch_api(candidate: "Candidate") -> BatchApi:
    """The Batch API client of a candidate; a provider without one is named."""
    try:
        target = BATCH_APIS[candidate.provider]
    except KeyError:
        raise ValueError(
            f"candidate {candidate.name!r}: provider {candidate.provider!r} has no "
            f"batch API; known: {sorted(BATCH_APIS)}"
        ) from None
    module_name, _, factory = target.partition(":")
    return getattr(import_module(module_name), factory)(candidate)


__all__ = ["BATCH_APIS", "BadLine", "BatchApi", "BatchGone", "BatchStatus", "LineResult", "make_batch_api"]
