"""zoo-l served by the local provider, for the tests that compare its answers across settings
(tests/evals/providers/local): import after `pytest.importorskip("torch")`."""

from __future__ import annotations

import asyncio

from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import Request
from routeopt.evals.providers.local.provider import LocalProvider
from tests import REPO

ZOO = REPO / "evals" / "demo" / "zoo"


def zoo_l(prefix_cache: object = False, draft_tokens: int = 0) -> Candidate:
    """zoo-l on the CPU, 64 in flight; with `draft_tokens`, verifying zoo-s's drafts."""
    spec = {"model": str(ZOO / "zoo-s"), "num_speculative_tokens": draft_tokens}
    return Candidate(
        name="zoo-l",
        provider="local",
        model=str(ZOO / "zoo-l"),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=64,
        prefix_cache=prefix_cache,
        **({"speculative": spec} if draft_tokens else {}),
    )


async def serve(candidate: Candidate, requests: list[Request]) -> tuple[list, LocalProvider]:
    """Every request at once; the answers in order, and the provider (closed) for its counters."""
    provider = LocalProvider(candidate)
    try:
        return await asyncio.gather(*(provider.generate(r) for r in requests)), provider
    finally:
        await provider.aclose()
