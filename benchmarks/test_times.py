"""Wall time of the test suite's tiers at several pytest-xdist worker counts.

    python benchmarks/test_times.py --tiers fast,full --workers 2,3,4 --reps 1 --json times.json

Each run is `python -m pytest -q -p no:cacheprovider [-m "not slow"] -n N` in a fresh Prefect
home; runs are interleaved (tier, then workers, then repetition) so a change in the machine's
load spreads over all of them. Prints one line per run and the medians, and writes every run
(wall and CPU seconds, the passed/failed counts pytest printed, the load average before and
after) with the commit and machine to --json.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TIERS = {"fast": ["-m", "not slow"], "full": []}


def run_once(tier: str, workers: int, timeout_s: float) -> dict:
    env = {
        **os.environ,
        "PREFECT_HOME": tempfile.mkdtemp(prefix="test-times-"),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
    }
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *TIERS[tier], "-n", str(workers)]
    load_before, cpu_before = os.getloadavg()[0], _children_cpu()
    start = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - start
    tail = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {k: int(n) for n, k in re.findall(r"(\d+) (passed|failed|skipped|errors?)", tail)}
    return {
        "tier": tier,
        "workers": workers,
        "wall_s": round(wall, 1),
        "cpu_s": round(_children_cpu() - cpu_before, 1),
        "rc": done.returncode,
        **counts,
        "load_before": round(load_before, 2),
        "load_after": round(os.getloadavg()[0], 2),
    }


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tiers", default="fast,full")
    parser.add_argument("--workers", default="2,3,4", help="pytest-xdist worker counts (0: one process)")
    parser.add_argument("--reps", type=int, default=1)
    parser.add_argument("--timeout-s", type=float, default=3600)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    runs = []
    for rep in range(args.reps):
        for tier in args.tiers.split(","):
            for workers in (int(w) for w in args.workers.split(",")):
                run = run_once(tier, workers, args.timeout_s)
                runs.append({**run, "rep": rep})
                print(json.dumps(runs[-1]), flush=True)
    for tier in args.tiers.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            walls = [r["wall_s"] for r in runs if r["tier"] == tier and r["workers"] == workers]
            print(f"{tier:>4} -n {workers}: median {statistics.median(walls):.0f} s over {len(walls)} run(s)")
    if args.json:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        ).stdout.strip()
        args.json.write_text(
            json.dumps(
                {
                    "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                    "commit": commit,
                    "machine": platform.processor() or platform.machine(),
                    "cpus": len(os.sched_getaffinity(0)),
                    "runs": runs,
                },
                indent=1,
            )
        )
    return runs


if __name__ == "__main__":
    main()
