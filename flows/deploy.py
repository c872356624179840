"""Deploy the nightly flow to a Prefect server: a cron schedule, parameters and a work pool.

The deployment points at this checkout (or a git URL) with `flow.from_source`, so a process
worker on the same machine runs the code as it is on disk, and a Kubernetes or Docker worker
clones it. `concurrency_limit=1` keeps two nightly runs from overlapping: they would compete for
the DuckDB file's single writer.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any
from uuid import UUID

REPO_ROOT = Path(__file__).resolve().parent.parent
ENTRYPOINT = "flows/nightly.py:nightly"
DEFAULT_CRON = "0 2 * * *"
DEFAULT_POOL = "routeopt"


@dataclass
class DeploySpec:
    """What `deploy_nightly` registers; the same fields as the deployment in `prefect.yaml`."""

    config_path: str
    name: str = "nightly"
    work_pool: str = DEFAULT_POOL
    pool_type: str = "process"
    cron: str | None = DEFAULT_CRON
    timezone: str = "UTC"
    suites: list[str] | None = None
    candidates: list[str] | None = None
    source: str = str(REPO_ROOT)
    branch: str | None = None
    paused: bool = False
    job_variables: dict[str, Any] | None = None

    def parameters(self) -> dict[str, Any]:
        return {"config_path": self.config_path, "suites": self.suites, "candidates": self.candidates}


def ensure_work_pool(name: str, pool_type: str = "process") -> bool:
    """Create the work pool unless it exists; True if it was created."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectNotFound

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            client.create_work_pool(WorkPoolCreate(name=name, type=pool_type))
            return True
    if pool.type != pool_type:
        raise ValueError(f"work pool {name!r} exists with type {pool.type!r}, not {pool_type!r}")
    return False


def _source(spec: DeploySpec) -> Any:
    """A local folder as is; an http(s)/ssh git URL as a GitRepository (cloned by the worker)."""
    if spec.source.startswith(("https://", "http://", "git@", "ssh://")):
        from prefect.runner.storage import GitRepository

        return GitRepository(url=spec.source, branch=spec.branch)
    path = Path(spec.source).resolve()
    if not (path / ENTRYPOINT.split(":")[0]).exists():
        raise FileNotFoundError(f"{path}: not a routeopt checkout ({ENTRYPOINT.split(':')[0]} is missing)")
    return str(path)


def deploy_nightly(spec: DeploySpec, *, create_pool: bool = True) -> UUID:
    """Register (or update) the `routeopt-nightly/<name>` deployment; returns its id."""
    from prefect import Flow
    from prefect.schedules import Cron

    if create_pool:
        ensure_work_pool(spec.work_pool, spec.pool_type)
    flow = Flow.from_source(source=_source(spec), entrypoint=ENTRYPOINT)
    return flow.deploy(
        name=spec.name,
        work_pool_name=spec.work_pool,
        schedules=[Cron(spec.cron, timezone=spec.timezone)] if spec.cron else None,
        parameters=spec.parameters(),
        concurrency_limit=1,
        paused=spec.paused,
        job_variables=spec.job_variables,
        tags=["routeopt", "nightly"],
        description="Evaluate every suite across every candidate, train the router, publish the policy.",
        build=False,
        push=False,
        print_next_steps=False,
    )
