"""kill -9 of a batch run at random moments, then resumed: nothing lost, nothing paid twice."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import httpx

from routeopt.evals.storage.store import Store
from tests.batch_driver import fleet
from tests.fake_llm import write_arithmetic_suite

REPO = Path(__file__).resolve().parents[3]
N = 40


class Server:
    """The fake Batch APIs in their own process: they outlive the runs that are killed."""

    def __init__(self, *args: str):
        env = {**os.environ, "PYTHONPATH": str(REPO)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_batches", *args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env=env,
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        assert line.startswith("PORT "), line
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"

    def get(self, path: str) -> list:
        return httpx.get(self.url + path, timeout=30).json()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def driver(config: Path, db: Path, run_id: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.batch_driver", str(config), str(db), run_id],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def kill_and_resume(config: Path, db: Path, kills: int, seed: int, window_s: float) -> int:
    """Start the run, kill -9 it `kills` times at random moments, then let it finish; returns
    how many times it was started."""
    rng = random.Random(seed)
    starts = 0
    for _ in range(kills):
        proc = driver(config, db, "run-k")
        starts += 1
        time.sleep(rng.uniform(0.2, window_s))
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    proc = driver(config, db, "run-k")
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return starts + 1


def check(server: Server, db: Path) -> dict:
    billed = server.get("/_fake/billed")
    batches = server.get("/_fake/batches")
    with Store(db, read_only=True) as store:
        rows = store.query(
            "SELECT candidate, call_mode, item_id, passed FROM outcomes WHERE run_id = 'run-k'"
        )
        jobs = store.query("SELECT batch_id FROM batch_jobs WHERE run_id = 'run-k' AND batch_id IS NOT NULL")
        planned = store.query("SELECT count(*) n FROM batch_jobs WHERE run_id = 'run-k'").n[0]
    return {
        "rows": len(rows),
        "passed": int(rows.passed.sum()),
        "twice": [k for k, n in billed if n > 1],
        "billed": sum(n for _, n in billed),
        "batches_server": len(batches),
        "batches_recorded": len(set(jobs.batch_id)),
        "batches_planned": int(planned),
        "unrecorded": sorted({b["id"] for b in batches} - set(jobs.batch_id)),
        "modes": dict(Counter(rows.call_mode)),
    }


def test_kill_9_at_random_moments_then_resume(tmp_path):
    server = Server("--phase-s", "0.4", "--seed", "3")
    try:
        write_arithmetic_suite(tmp_path / "suites", N)
        config = fleet(
            tmp_path,
            {"openai": server.url + "/v1", "anthropic": server.url},
            batch=True,
            poll_s=0.05,
            extra={"max_requests": 7},
        )
        db = tmp_path / "out" / "routeopt.duckdb"
        kill_and_resume(config, db, kills=4, seed=11, window_s=2.5)
        got = check(server, db)
    finally:
        server.stop()
    assert got["rows"] == 2 * N and got["passed"] == 2 * N, got
    assert got["twice"] == [] and got["billed"] == 2 * N, got
    assert (
        got["unrecorded"] == [] and got["batches_server"] == got["batches_recorded"] == got["batches_planned"]
    ), got
    assert got["modes"]["batch"] == 2 * (N - 2), got
