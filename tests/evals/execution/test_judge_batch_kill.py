"""kill -9 of a judged batch run while its judge's batches are in flight, then resumed: no judge
line lost, none paid twice, every batch the provider holds recorded."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

from routeopt.evals.storage.store import Store
from tests.batch_driver import fleet
from tests.evals.execution.test_batch_kill import REPO, Server
from tests.fake_batches import JUDGE_RUBRIC
from tests.fake_llm import write_arithmetic_suite

N = 30
JUDGE = "judge-fake"


def driver(config: Path, db: Path) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests.batch_driver", str(config), str(db), "run-k", "gpt,claude"],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def judge_batches(server: Server) -> list[dict]:
    return [b for b in server.get("/_fake/batches") if b["model"] == JUDGE]


def kill_in_the_judge_stage(server: Server, config: Path, db: Path, kills: int, seed: int) -> int:
    """The first kill lands while the answers' batches run; each later one at a random moment
    once the judge has a batch more than before (between creating and recording it, too).
    Returns how many kills hit a run with judge batches in flight."""
    rng = random.Random(seed)
    in_judge_stage = 0
    for k in range(kills):
        proc = driver(config, db)
        if k == 0:
            time.sleep(rng.uniform(0.2, 0.8))
        else:
            before, deadline = len(judge_batches(server)), time.time() + 60
            while len(judge_batches(server)) <= before and proc.poll() is None and time.time() < deadline:
                time.sleep(0.01)
            time.sleep(rng.uniform(0.0, 0.6))
        if proc.poll() is None:
            in_judge_stage += any(b["state"] not in ("completed", "ended") for b in judge_batches(server))
            os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    proc = driver(config, db)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    return in_judge_stage


def test_kill_9_while_the_judge_batches_then_resume(tmp_path):
    server = Server("--phase-s", "0.3", "--seed", "5")
    try:
        suite = write_arithmetic_suite(tmp_path / "suites", N)
        spec = json.loads(suite.read_text())
        spec["grader"] = {"type": "judge", "candidate": "judge", "rubric": JUDGE_RUBRIC}
        suite.write_text(json.dumps(spec))
        config = fleet(
            tmp_path,
            {"openai": server.url + "/v1", "anthropic": server.url},
            batch=True,
            poll_s=0.05,
            extra={"max_requests": 8},
            judge=True,
        )
        db = tmp_path / "out" / "routeopt.duckdb"
        hits = kill_in_the_judge_stage(server, config, db, kills=4, seed=7)
        billed = server.get("/_fake/billed")
        batches = server.get("/_fake/batches")
    finally:
        server.stop()
    with Store(db, read_only=True) as store:
        rows = store.query("SELECT * FROM outcomes WHERE run_id = 'run-k'")
        jobs = store.query("SELECT batch_id, judge_for FROM batch_jobs WHERE run_id = 'run-k'")
        replies = store.query("SELECT mode FROM judge_replies WHERE run_id = 'run-k'")
        lines = (
            store.query("SELECT state, count(*) n FROM batch_lines WHERE judge_for IS NOT NULL GROUP BY 1")
            .set_index("state")
            .n
        )
    assert hits >= 1, "no kill landed while the judge's batches were in flight"
    # every row graded by the judge, the batch-answered ones from the judge's batches only
    assert len(rows) == 2 * N and rows.error_kind.isna().all() and rows.passed.all(), rows.error
    batched = rows[rows.call_mode == "batch"]
    assert len(batched) == 2 * (N - 2) and (batched.judge_call_mode == "batch").all()
    assert Counter(replies["mode"]) == {"batch": 2 * (N - 2)} and lines.get("answered") == 2 * (N - 2)
    # nothing paid twice: answers and judge calls; every judge batch the server holds recorded
    # (both candidates answer every item alike, so the judge is asked each prompt twice, once
    # per candidate's row: a third time would be a line paid twice)
    assert [k for k, n in billed if n > (2 if k[0] == JUDGE else 1)] == []
    assert Counter(n for (model, _), n in billed if model == JUDGE) == {2: N}
    assert sum(n for _, n in billed) == 4 * N
    recorded = set(jobs.batch_id.dropna())
    assert {b["id"] for b in batches} == recorded
    assert len(set(jobs[jobs.judge_for.notna()].batch_id.dropna())) == len(
        [b for b in batches if b["model"] == JUDGE]
    )
