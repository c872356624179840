"""Decision latency of one request in Python, per engine: the WebAssembly kernel (wasmtime, the
`fast` extra) and the numpy steps it falls back to; with `--budget`, also under a latency budget.

The RouterBench policy is published through the CLI (benchmarks/js_common.py) and loaded from its
version folder (verified, self-checked) as a gateway loads it; every test-split prompt of
RouterBench (952) is routed with `route(prompt, suite)` one at a time after a warm-up. Each round
reports p50 and p99 per request; the figures are medians of the rounds. The engines alternate by
round, so a change in the machine's load falls on both.

With `--budget KIND=SECONDS` (ttft or latency) the policy is trained on the latency-annotated set
that `benchmarks/latency_data.py --out DIR` writes (`--latency-data DIR`), a format 4 policy, and
each round routes every prompt without a budget and then with it.

    flock /tmp/routeopt-bench.lock python benchmarks/python_decision.py [--rounds 3] [--set routerbench] [--json out.json]
    flock /tmp/routeopt-bench.lock python benchmarks/python_decision.py --budget ttft=0.8 --latency-data DIR
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

import numpy as np

from js_common import budget_set, load_average, published, test_requests

ENGINES = ("webassembly", "numpy")


def router_for(engine: str, version: Path, key: Path):  # noqa: ANN201  (a loader.Router)
    from routeopt.artifacts.serving.loader import load

    os.environ["ROUTEOPT_ENGINE"] = engine
    router = load(version, public_key=key, state_dir=False)
    got = router._active.policy.engine_in_use
    if got != engine:
        raise SystemExit(f"asked for the {engine} engine, got {got} (is the 'fast' extra installed?)")
    return router


def one_round(router, requests: list[dict], budget: dict[str, float]) -> tuple[float, float]:  # noqa: ANN001
    times = np.empty(len(requests))
    for i, r in enumerate(requests):
        start = time.perf_counter_ns()
        router.route(r["prompt"], r["suite"], **budget)
        times[i] = (time.perf_counter_ns() - start) / 1000
    return float(np.quantile(times, 0.5)), float(np.quantile(times, 0.99))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="routerbench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", help="KIND=SECONDS: also route under this budget (ttft or latency)")
    ap.add_argument("--latency-data", type=Path, help="the folder latency_data.py --out wrote")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    name, data, budget = budget_set(args.set, args.budget, args.latency_data)
    version, key = published(name, data)
    requests = test_requests(name, data=data)
    routers = {e: router_for(e, version, key) for e in ENGINES}
    cases = {"no budget": {}, **({args.budget: budget} if budget else {})}
    for router in routers.values():
        for asked in cases.values():
            for r in requests[:500]:
                router.route(r["prompt"], r["suite"], **asked)
    print(load_average())
    rounds: dict[tuple[str, str], list[tuple[float, float]]] = {(e, c): [] for e in ENGINES for c in cases}
    for _ in range(args.rounds):
        for engine, router in routers.items():
            for case, asked in cases.items():
                rounds[engine, case].append(one_round(router, requests, asked))
    print(load_average())
    print(f"{name}: {len(requests)} requests per round, {args.rounds} rounds (medians of rounds)")
    out: dict[str, dict] = {}
    for (engine, case), rs in rounds.items():
        p50, p99 = statistics.median(p for p, _ in rs), statistics.median(q for _, q in rs)
        out.setdefault(engine, {})[case] = {"p50_us": p50, "p99_us": p99, "rounds": rs}
        shown = [(round(p, 1), round(q, 1)) for p, q in rs]
        print(f"  {engine:12s} {case:14s} p50 {p50:7.1f} us   p99 {p99:7.1f} us   rounds {shown}")
    if args.json:
        args.json.write_text(json.dumps({"set": name, "requests": len(requests), **out}, indent=2))


if __name__ == "__main__":
    main()
