"""Two decision services on one share, as `routeopt-gateway serve --workers 2` runs them, each
with an ASGI client: for tests of what workers share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from routeopt.artifacts.serving.decision_service import DecisionService, SharedObservations, WorkerShare
from routeopt.artifacts.serving.service_metrics import SharedMetrics
from routeopt.artifacts.serving.settings import GatewaySettings


@asynccontextmanager
async def two_workers(
    registry: Path, public_key: Path, observations: SharedObservations | None = None
) -> AsyncIterator[tuple[list[DecisionService], list[httpx.AsyncClient]]]:
    """The started services and their clients; closed on the way out."""
    share = (observations or SharedObservations(), SharedMetrics(2))
    settings = GatewaySettings(source=str(registry), public_keys=(str(public_key),), refresh_s=0)
    workers = [DecisionService(settings, shared=WorkerShare(*share, i)) for i in range(2)]
    clients = [httpx.AsyncClient(transport=httpx.ASGITransport(app=w), base_url="http://r") for w in workers]
    try:
        for w in workers:
            w.start()
        yield workers, clients
    finally:
        for c in clients:
            await c.aclose()
        for w in workers:
            w.close()
