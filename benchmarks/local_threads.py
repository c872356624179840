"""torch's CPU threads when several local models are evaluated side by side: each engine with
the cores' default share (min(cores, 4) threads each) against `sharing_cpu` (cores / engines).

The demo fleet (routeopt.yaml: 5 local candidates) answers every item of the demo suites, the
five engines at once with up to 64 requests in flight each, as `routeopt run` schedules them
(a candidate's suites one after another, candidates side by side); models are loaded before the
clock starts. Each round runs both settings in fresh processes, interleaved; the figures are
medians of the rounds' wall and CPU (user + system) seconds.

    flock /tmp/routeopt-bench.lock python benchmarks/local_threads.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


async def _fleet(share: bool) -> dict[str, float]:
    import torch

    from routeopt.evals.config import load_config
    from routeopt.evals.providers.base import GenerationSettings, Message, Request
    from routeopt.evals.providers.local.provider import LocalProvider, sharing_cpu
    from routeopt.evals.suite.spec import load_suite

    cfg = load_config(REPO / "evals" / "demo" / "routeopt.yaml")
    suites = [
        load_suite(p)
        for p in sorted((REPO / "evals" / "suites").glob("*.yaml"))
        if p.stem in ("add", "reverse", "sort")
    ]
    with sharing_cpu(len(cfg.candidates) if share else 1):
        providers = [LocalProvider(c) for c in cfg.candidates]
        for p in providers:
            p._load()

        async def candidate(p: LocalProvider) -> None:
            for s in suites:
                gate = asyncio.Semaphore(p.max_batch)
                settings = GenerationSettings(max_tokens=s.spec.generation.max_tokens)

                async def one(item: object) -> None:
                    async with gate:
                        await p.generate(Request((Message("user", s.prompt_text(item)),), settings))

                await asyncio.gather(*(one(it) for it in s.items))

        before = resource.getrusage(resource.RUSAGE_SELF)
        start = time.perf_counter()
        await asyncio.gather(*(candidate(p) for p in providers))
        wall = time.perf_counter() - start
        after = resource.getrusage(resource.RUSAGE_SELF)
        for p in providers:
            await p.aclose()
    return {
        "wall_s": wall,
        "threads": torch.get_num_threads(),
        "cpu_s": after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--child", choices=["each", "share"], help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        print(json.dumps(asyncio.run(_fleet(args.child == "share"))))
        return
    env = {k: v for k, v in os.environ.items() if k != "ROUTEOPT_TORCH_THREADS"}
    runs: dict[str, list[dict[str, float]]] = {"each": [], "share": []}
    for r in range(args.rounds):
        for mode in runs:
            out = subprocess.run(
                [sys.executable, __file__, "--child", mode],
                env=env,
                check=True,
                capture_output=True,
                text=True,
            ).stdout
            runs[mode].append(json.loads(out.strip().splitlines()[-1]))
            m = runs[mode][-1]
            print(
                f"round {r + 1}: {mode:<5} {m['threads']} threads: wall {m['wall_s']:.1f} s, "
                f"CPU {m['cpu_s']:.1f} s (load {os.getloadavg()[0]:.1f})",
                flush=True,
            )
    med = {
        mode: {k: statistics.median(x[k] for x in xs) for k in ("wall_s", "cpu_s")}
        for mode, xs in runs.items()
    }
    print(
        f"medians: min(cores, 4) threads each: wall {med['each']['wall_s']:.1f} s, CPU {med['each']['cpu_s']:.1f} s; "
        f"shared (cores / engines): wall {med['share']['wall_s']:.1f} s, CPU {med['share']['cpu_s']:.1f} s; "
        f"ratio shared/each wall {med['share']['wall_s'] / med['each']['wall_s']:.2f}"
    )


if __name__ == "__main__":
    main()
