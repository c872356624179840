"""Decision latency of one request: the JavaScript gateway in Node beside Python's, same requests.

The RouterBench policy is published through the CLI (benchmarks/js_common.py); both runtimes
load it from its version folder (verified, self-checked) and route every test-split prompt of
RouterBench (945, about 1,400 characters each) at the policy's own target, one at a time, after
a warm-up (`--warmup` calls, 500 by default). Each round reports p50 and p99 per request; the
figures are medians of the rounds.

    flock /tmp/routeopt-bench.lock python benchmarks/js_latency.py [--rounds 3] [--set routerbench]
    flock /tmp/routeopt-bench.lock python benchmarks/js_latency.py --budget ttft=0.8 --latency-data DIR

With `--budget KIND=SECONDS` (ttft or latency), the policy is trained on the latency-annotated set
`benchmarks/latency_data.py --out DIR` writes (a format 4 policy) and both runtimes route every
request under that budget. `--paired` (with `--budget`) measures what the budget costs Node
alone: each request routed without the budget and with it, back to back, in turn which first
(no Python).
Node also prints each request's median over the rounds, then p50 / p99 over requests: the
decision's own spread, without what the shared machine did to single calls.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np

from js_common import budget_set, build_js, load_average, node, published, requests_file, test_requests


def python_rounds(
    version: Path, key: Path, requests: list[dict], rounds: int, budget: dict[str, float], warmup: int
) -> list[tuple[float, float]]:
    from routeopt.artifacts.serving.loader import load

    router = load(version, public_key=key, state_dir=False)
    for i in range(warmup):
        r = requests[i % len(requests)]
        router.route(r["prompt"], r["suite"], **budget)
    out = []
    for _ in range(rounds):
        times = np.empty(len(requests))
        for i, r in enumerate(requests):
            start = time.perf_counter_ns()
            router.route(r["prompt"], r["suite"], **budget)
            times[i] = (time.perf_counter_ns() - start) / 1000
        out.append((float(np.quantile(times, 0.5)), float(np.quantile(times, 0.99))))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="routerbench")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--budget", help="KIND=SECONDS: route every request under this budget (ttft or latency)")
    ap.add_argument("--latency-data", type=Path, help="the folder latency_data.py --out wrote")
    ap.add_argument(
        "--paired",
        action="store_true",
        help="with --budget: Node routes each request without the budget and with it, back to back",
    )
    ap.add_argument(
        "--warmup",
        type=int,
        default=500,
        help="calls before the rounds, cycling through the requests (V8 keeps re-optimising for a "
        "few thousand: 5000 measures a gateway that has been up a while)",
    )
    args = ap.parse_args()
    name, data, budget = budget_set(args.set, args.budget, args.latency_data)
    build_js()
    version, key = published(name, data)
    requests = test_requests(name, data=data)
    print(load_average())
    with tempfile.TemporaryDirectory() as tmp:
        path = requests_file(requests, Path(tmp))
        js = [
            json.loads(line)
            for line in node(
                "bench/latency.mjs",
                str(version),
                str(path),
                str(args.rounds),
                *([args.budget] if budget else []),
                public_key=key,
                env={"WARMUP": str(args.warmup), **({"PAIRED": "1"} if args.paired else {})},
            ).splitlines()
        ]
    per_request = js.pop()["per_request"]
    py = [] if args.paired else python_rounds(version, key, requests, args.rounds, budget, args.warmup)
    med = lambda xs: statistics.median(xs)
    print(
        f"{name}{' ' + args.budget if budget else ''}: {len(requests)} requests per round, {args.rounds} rounds "
        f"after {args.warmup} warm-up calls (medians of rounds)"
    )
    print(
        f"  JavaScript (Node):  p50 {med([r['p50_us'] for r in js]):7.1f} us   p99 {med([r['p99_us'] for r in js]):7.1f} us   "
        f"rounds {[(round(r['p50_us'], 1), round(r['p99_us'], 1)) for r in js]}"
    )
    if args.paired:
        print(
            f"  JavaScript (Node), {args.budget}, beside the same request without it:  "
            f"p50 {med([r['budget_p50_us'] for r in js]):7.1f} us   p99 {med([r['budget_p99_us'] for r in js]):7.1f} us   "
            f"rounds {[(round(r['budget_p50_us'], 1), round(r['budget_p99_us'], 1)) for r in js]}"
        )
    else:
        print(
            f"  Python:             p50 {med([p for p, _ in py]):7.1f} us   p99 {med([q for _, q in py]):7.1f} us   "
            f"rounds {[(round(p, 1), round(q, 1)) for p, q in py]}"
        )
    print(
        "  Node, each request's median over the rounds, then p50 / p99 over requests: "
        + ", ".join(f"{k.removesuffix('_us')} {v:.1f} us" for k, v in per_request.items())
    )
    print(load_average())


if __name__ == "__main__":
    main()
