"""Two publishers that reach the commit point together: the race a real deployment hits rarely."""

from __future__ import annotations

import threading
from datetime import datetime, timezone
from typing import Any

from routeopt.artifacts.publish.registry import publish
from routeopt.artifacts.serving.loader import load


class RacingBackend:
    """Wraps a backend so that every publisher waits, with its files written, until all have
    written theirs; only then do they race for the same version number."""

    def __init__(self, inner: Any, parties: int = 2) -> None:
        self.inner, self.location = inner, inner.location
        self.barrier = threading.Barrier(parties, timeout=60)
        self.waited = threading.local()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if key.startswith("index/") and not getattr(self.waited, "done", False):
            self.waited.done = True
            self.barrier.wait()
        return self.inner.put_if_absent(key, data)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def race_two_publishers(backend: Any, policy: Any, private_key: Any) -> list:
    """Publish the same policy, lineage and timestamp twice at once: before each publish got a
    folder of its own, both named the same one and the loser deleted the winner's files."""
    racing, now = RacingBackend(backend), datetime.now(timezone.utc).replace(microsecond=0)
    results: list = []
    errors: list = []

    def one() -> None:
        try:
            results.append(
                publish(
                    policy, racing, lineage={"runs": ["r1"]}, metrics={}, signing_key=private_key, now=now
                )
            )
        except Exception as exc:  # reported by the caller's assertion
            errors.append(exc)

    threads = [threading.Thread(target=one) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    return sorted(results, key=lambda v: v.version)


def assert_every_version_serves(source: str, versions: list, public_key: Any) -> None:
    """Each published version still verifies and routes: nothing of it was deleted."""
    for v in versions:
        router = load(f"{source.rstrip('/')}/{v.path}", public_key)
        assert router.version == v.version and router.route("add 2 and 3").model
