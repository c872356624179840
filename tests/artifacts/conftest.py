"""Fixtures for the publishing side: real routing policies, keys and an empty registry."""

from __future__ import annotations

import os
from datetime import datetime, timedelta
from pathlib import Path
from typing import Callable

import pytest

from tests.artifacts.policies import make_policy

os.environ.setdefault("OMP_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def policies() -> list:
    """Two different real policies (trained once per session)."""
    return [make_policy(0), make_policy(1)]


@pytest.fixture(scope="session")
def keypair(tmp_path_factory) -> tuple[Path, Path]:
    from routeopt.artifacts.publish.signing_keys import generate_keys

    return generate_keys(tmp_path_factory.mktemp("keys"))


@pytest.fixture(scope="session")
def other_keypair(tmp_path_factory) -> tuple[Path, Path]:
    from routeopt.artifacts.publish.signing_keys import generate_keys

    return generate_keys(tmp_path_factory.mktemp("other-keys"))


@pytest.fixture()
def registry(tmp_path: Path) -> Path:
    return tmp_path / "registry"


@pytest.fixture()
def publish_to(registry: Path, keypair) -> Callable:
    """publish(policy, **kw) into the test registry, signed by default."""
    from routeopt.artifacts.publish.registry import publish

    def go(policy, **kw):
        kw.setdefault("signing_key", keypair[0])
        kw.setdefault("lineage", {"runs": ["run-1"], "suites": {"reverse": "v1"}})
        kw.setdefault("metrics", {"pass_rate": 0.9, "cost_usd": 0.01})
        return publish(policy, registry, **kw)

    return go


@pytest.fixture()
def loader_later(monkeypatch) -> Callable[[timedelta], None]:
    """later(delta): the gateway loader's clocks (time.time and datetime.now) run `delta` ahead
    from now on, so a test sees a policy expire without waiting for it, however busy the machine."""
    import time

    from routeopt.artifacts.serving import loader

    def later(delta: timedelta) -> None:
        ahead = delta.total_seconds()
        monkeypatch.setattr(
            loader,
            "time",
            type(
                "Later",
                (),
                {"time": staticmethod(lambda: time.time() + ahead), "time_ns": staticmethod(time.time_ns)},
            ),
        )
        monkeypatch.setattr(
            loader,
            "datetime",
            type("Later", (datetime,), {"now": classmethod(lambda cls, tz=None: datetime.now(tz) + delta)}),
        )

    return later
