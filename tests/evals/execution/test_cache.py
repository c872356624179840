"""The response cache is opened by many pairs at once: threads of one run, and Dask workers."""

from __future__ import annotations

import multiprocessing
import threading
from pathlib import Path

from routeopt.evals.execution.cache import ResponseCache
from routeopt.evals.providers.base import Completion


def _open_and_put(where: str, key: str) -> None:
    cache = ResponseCache(where)
    cache.put(key, "run-1", Completion(text=key, finish_reason="stop"))


def test_many_threads_open_a_new_cache_at_once(tmp_path: Path):
    """SQLite refuses the WAL switch at once (no busy wait) when two connections race for it;
    before the fix about one trial in thirty failed with "database is locked"."""
    for trial in range(40):
        where = str(tmp_path / f"t{trial}")
        barrier, errors = threading.Barrier(8), []

        def go(i: int) -> None:
            barrier.wait()
            try:
                _open_and_put(where, f"k{i}")
            except Exception as e:  # noqa: BLE001 - collected and asserted below
                errors.append(e)

        threads = [threading.Thread(target=go, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        assert len(ResponseCache(where)) == 8


def test_processes_open_the_same_cache(tmp_path: Path):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_open_and_put, args=(str(tmp_path), f"k{i}")) for i in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
    assert [p.exitcode for p in procs] == [0] * 4
    cache = ResponseCache(tmp_path)
    assert len(cache) == 4
    assert all(cache.get(f"k{i}", "run-1").completion.text == f"k{i}" for i in range(4))
