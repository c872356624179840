"""Single-thread latency of RoutingPolicy.decide() (featurisation included) on RouterBench prompts.

    OMP_NUM_THREADS=1 python benchmarks/router_decide_latency.py [--policy FOLDER] [--n 3000]
        [--estimator linear|lightgbm]

Wall-clock percentiles include time the thread waits for a core on a busy machine; the
thread-CPU percentiles do not. Without --policy it trains one on RouterBench train.parquet first (not timed) and routes the
prompts of test.parquet (about 1,500 characters each).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from router_data import ROOT, data_dir

sys.path.insert(0, str(ROOT))  # measure this checkout's packages, not an installed copy

DATA = data_dir() / "routerbench"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policy", type=Path, default=None)
    ap.add_argument("--n", type=int, default=3000)
    ap.add_argument(
        "--estimator",
        choices=("linear", "lightgbm"),
        default="linear",
        help="Estimator of the policy trained when --policy is not given.",
    )
    args = ap.parse_args()
    from routeopt.router_training.policy.routing import RoutingPolicy

    if args.policy is not None:
        policy = RoutingPolicy.load(args.policy)
    else:
        from routeopt.router_training.train import train_router

        policy = train_router(
            pd.read_parquet(DATA / "train.parquet"), holdout_fraction=0.0, estimator=args.estimator
        ).policy
    test = pd.read_parquet(DATA / "test.parquet").drop_duplicates("request_id")
    prompts, suites = test["prompt"].tolist(), test["suite"].tolist()
    for p, s in zip(prompts[:200], suites[:200]):  # warm-up
        policy.decide(p, s)
    times, cpu = [], []
    for i in range(args.n):
        p, s = prompts[i % len(prompts)], suites[i % len(prompts)]
        t, c = time.perf_counter(), time.thread_time()
        policy.decide(p, s)
        cpu.append(time.thread_time() - c)
        times.append(time.perf_counter() - t)
    us, cpu_us = np.array(times) * 1e6, np.array(cpu) * 1e6
    print(
        f"decide(): scorer={type(policy.scorer).__name__} n={len(us)} candidates={len(policy.candidates)} "
        f"mean_prompt_chars={np.mean([len(p) for p in prompts]):.0f} "
        f"p50_us={np.percentile(us, 50):.0f} p90_us={np.percentile(us, 90):.0f} "
        f"p99_us={np.percentile(us, 99):.0f} | thread-CPU p50_us={np.percentile(cpu_us, 50):.0f} "
        f"p99_us={np.percentile(cpu_us, 99):.0f} (CPU time excludes waiting for a busy core)"
    )


if __name__ == "__main__":
    main()
