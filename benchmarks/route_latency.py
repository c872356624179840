"""Gateway routing latency: 10,000 single-request decisions through `routeopt.artifacts.serving.loader`, one thread.

Each timed call is `Router.route(prompt, suite)`: featurisation, prediction and the policy's
choice, exactly what a gateway pays per request. The policy is loaded the way a gateway loads it
(published, signed, verified). Target: p50 < 200 us, p99 < 1 ms.

    python benchmarks/route_latency.py                      # train on the demo fleet's outcomes
    python benchmarks/route_latency.py --policy REGISTRY_OR_VERSION_DIR [--public-key FILE]

Without --policy it trains on the outcomes in the configured DuckDB (the demo fleet) if there are
any, else on RouterBench's train split in ../shared, else on a synthetic fleet. The last line is
`p50_us=N p99_us=N`.
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routeopt.artifacts.publish.registry import publish  # noqa: E402
from routeopt.artifacts.serving.loader import load  # noqa: E402
from routeopt.artifacts.publish.signing_keys import generate_keys  # noqa: E402


def _demo_frame():
    from routeopt.evals.config import ConfigError, default_config_path, load_config
    from routeopt.evals.storage.store import Store

    try:
        db = load_config(default_config_path()).db_path
    except ConfigError:
        return None
    if not db.exists():
        return None
    frame = Store(db, read_only=True).training_frame()
    return frame if len(frame) else None


def _synthetic_frame(n: int = 600, seed: int = 0):
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = ["alpha", "beta", "gamma", "delta", "sort", "reverse", "add", "number", "list", "word"]
    rows = []
    for i in range(n):
        suite = ("reverse", "sort", "add")[i % 3]
        difficulty = int(rng.integers(1, 10))
        prompt = f"difficulty: {difficulty}\n{suite} " + " ".join(rng.choice(words, 4 * difficulty))
        for k, model in enumerate(("zoo-s", "zoo-m", "zoo-l", "zoo-l-int8")):
            passed = rng.random() < min(1.0, 0.3 + 0.2 * k - 0.05 * difficulty + 0.3)
            rows.append(
                {
                    "run_id": "synthetic",
                    "suite": suite,
                    "suite_version": "v1",
                    "item_id": str(i),
                    "request_id": f"{suite}-{i}",
                    "prompt": prompt,
                    "model": model,
                    "score": float(passed),
                    "passed": bool(passed),
                    "cost_usd": 1e-5 * (1 + k) * len(prompt),
                    "input_tokens": None,
                    "output_tokens": None,
                    "latency_s": None,
                    "ttft_s": None,
                }
            )
    return pd.DataFrame(rows)


def training_frame(data: str = "auto") -> tuple[object, str]:
    """Outcomes to train on: the demo fleet's (configured DuckDB), RouterBench's, or synthetic."""
    frame = _demo_frame() if data in ("auto", "demo") else None
    if frame is not None:
        return frame, "demo fleet outcomes (configured DuckDB)"
    if data == "demo":
        raise SystemExit("no demo outcomes: run `routeopt run` first (or pick another --data)")
    routerbench = REPO.parent / "shared" / "data" / "routerbench" / "train.parquet"
    if data in ("auto", "routerbench") and routerbench.exists():
        import pandas as pd

        return pd.read_parquet(routerbench), f"RouterBench train split ({routerbench})"
    return _synthetic_frame(), "synthetic fleet (short prompts)"


def build_policy(workdir: Path, data: str) -> tuple[Path, Path, list[tuple[str, str | None]], str]:
    """Train, publish signed into a temporary registry; returns (registry, public key, prompts, what)."""
    from routeopt.router_training.train import train_router

    frame, what = training_frame(data)
    result = train_router(frame, quality_target=0.95, seed=0)
    private, public = generate_keys(workdir / "keys")
    registry = workdir / "registry"
    publish(result.policy, registry, lineage={"benchmark": what}, metrics=result.metrics, signing_key=private)
    firsts = frame.drop_duplicates("request_id")
    prompts = list(zip(firsts["prompt"].astype(str), firsts["suite"].astype(str)))
    return registry, public, prompts, what


def measure(
    route, prompts: list[tuple[str, str | None]], n: int, warmup: int
) -> tuple[np.ndarray, np.ndarray]:
    """Per-call wall time and this thread's CPU time, in microseconds.

    CPU time excludes the time the OS ran other processes, so on a shared, busy machine it shows
    what the call costs on a quiet core; wall time is what a request would see right here.
    """
    for i in range(warmup):
        route(*prompts[i % len(prompts)])
    wall = np.empty(n, dtype=np.int64)
    cpu = np.empty(n, dtype=np.int64)
    clock, cpu_clock = time.perf_counter_ns, time.thread_time_ns
    gc.disable()
    try:
        for i in range(n):
            prompt, suite = prompts[i % len(prompts)]
            c0, t0 = cpu_clock(), clock()
            route(prompt, suite)
            wall[i], cpu[i] = clock() - t0, cpu_clock() - c0
    finally:
        gc.enable()
    return wall / 1000.0, cpu / 1000.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--policy", help="registry folder/URL or version folder (default: train one)")
    ap.add_argument("--public-key", help="trusted public key for --policy (default: $ROUTEOPT_PUBLIC_KEY)")
    ap.add_argument("--allow-unsigned", action="store_true", help="load --policy without a public key")
    ap.add_argument("--prompts", help="JSONL with {prompt, suite?} to route (default: training prompts)")
    ap.add_argument(
        "--data",
        choices=("auto", "demo", "routerbench", "synthetic"),
        default="auto",
        help="what to train on without --policy (auto: demo, else RouterBench, else synthetic)",
    )
    ap.add_argument("-n", type=int, default=10_000)
    ap.add_argument("--warmup", type=int, default=500)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="route-latency-") as tmp:
        if args.policy:
            router = load(args.policy, args.public_key, allow_unsigned=args.allow_unsigned, state_dir=False)
            what = f"policy {args.policy}"
            prompts = _prompts_from(args.prompts) if args.prompts else _default_prompts(args.data)
        else:
            registry, public, prompts, what = build_policy(Path(tmp), args.data)
            router = load(registry, public, state_dir=False)
        us, cpu_us = measure(router.route, prompts, args.n, args.warmup)
        bare_us, _ = measure(router.policy.decide, prompts, args.n, args.warmup)
    print(
        f"policy version {router.version} ({what}), {len(router.policy.candidates)} candidates, "
        f"mean prompt {np.mean([len(p) for p, _ in prompts]):.0f} chars, load average "
        f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores"
    )
    for name, xs in (("thread CPU time", cpu_us), ("wall time", us)):
        p50, p90, p99 = np.percentile(xs, [50, 90, 99])
        print(
            f"{args.n} decisions, one thread, {name}: mean {xs.mean():.1f} us, p50 {p50:.1f}, "
            f"p90 {p90:.1f}, p99 {p99:.1f}, max {xs.max():.1f}"
        )
    print(
        f"for comparison, RoutingPolicy.decide alone (no loader), wall time: p50 "
        f"{np.percentile(bare_us, 50):.1f}, p99 {np.percentile(bare_us, 99):.1f} us"
    )
    p50, p99 = np.percentile(us, [50, 99])
    print(f"p50_us={p50:.0f} p99_us={p99:.0f}")


def _prompts_from(path: str) -> list[tuple[str, str | None]]:
    import json

    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    return [(r["prompt"], r.get("suite")) for r in rows]


def _default_prompts(data: str) -> list[tuple[str, str | None]]:
    frame, _ = training_frame(data)
    firsts = frame.drop_duplicates("request_id")
    return list(zip(firsts["prompt"].astype(str), firsts["suite"].astype(str)))


if __name__ == "__main__":
    main()
