"""Co-located self-hosted candidates: side by side (as before device slots) versus one at a time.

Runs the demo fleet (`routeopt.yaml`: four local candidates on one device) on one suite through
`evaluate_pair`, each candidate in its own thread as the nightly flow runs them, twice per
repeat: with the device slots disabled (every candidate at once) and enabled (the default: one
candidate on the device at a time). Prints, per mode, the medians over the repeats of each
candidate's p50 latency and GPU-hour cost and of the total wall time.

Usage: `nice python benchmarks/colocation.py [--suite add] [--repeats 3]`.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routeopt.evals.config import load_config  # noqa: E402
from routeopt.evals.execution import runner  # noqa: E402
from routeopt.evals.execution.limits import reset_shared_limits, shared_device_slot  # noqa: E402
from routeopt.evals.storage.store import Outcome  # noqa: E402
from routeopt.evals.suite.spec import load_suite  # noqa: E402


async def run_fleet(suite, candidates) -> tuple[float, dict[str, tuple[float, float]]]:
    """(total wall, {candidate: (p50 latency s, cost $)}) of one run of every candidate."""
    rows: list[Outcome] = []
    t0 = time.perf_counter()
    await asyncio.gather(
        *(
            asyncio.to_thread(asyncio.run, runner.evaluate_pair(suite, c, "bench", rows.extend))
            for c in candidates
        )
    )
    wall = time.perf_counter() - t0
    out = {}
    for c in candidates:
        mine = [r for r in rows if r.candidate == c.name and r.latency_s is not None]
        out[c.name] = (statistics.median(r.latency_s for r in mine), sum(r.cost_usd or 0 for r in mine))
    return wall, out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--suite", default="add")
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    cfg = load_config(REPO / "evals" / "demo" / "routeopt.yaml")
    suite = load_suite(cfg.suites_dir / f"{args.suite}.yaml", config=cfg)
    modes = {"side by side": lambda c: None, "one at a time": shared_device_slot}
    results: dict[str, list] = {m: [] for m in modes}
    asyncio.run(run_fleet(suite, cfg.candidates))  # warm-up: model loads, imports
    for _ in range(args.repeats):
        for mode, slot in modes.items():
            reset_shared_limits()
            runner.shared_device_slot = slot
            results[mode].append(asyncio.run(run_fleet(suite, cfg.candidates)))
    print(
        f"{len(cfg.candidates)} candidates x {len(suite.items)} items of {args.suite}, "
        f"medians of {args.repeats} runs"
    )
    for mode, runs in results.items():
        wall = statistics.median(w for w, _ in runs)
        print(f"{mode}: wall {wall:.1f}s")
        for c in cfg.candidates:
            p50 = statistics.median(per[c.name][0] for _, per in runs)
            cost = statistics.median(per[c.name][1] for _, per in runs)
            print(f"    {c.name:12s} p50 latency {p50:.3f}s  cost ${cost:.6f}")


if __name__ == "__main__":
    main()
