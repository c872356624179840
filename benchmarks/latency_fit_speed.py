"""Time the latency section's fitting (`latency_policy`) on a real store, and hash what it made.

Runs `routeopt train` on the store (publishing into a throwaway registry), keeps the inputs of
each `latency_policy` call it makes (one for the held-out policy, one for the refit), then times
each call again `--reps` times and prints the median with a digest of its output (tiers, arrays,
metrics): two commits that print the same digest made the same latency section.

    routeopt run                                   # in an empty folder: the demo's store
    python benchmarks/latency_fit_speed.py --db .routeopt/routeopt.duckdb --reps 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np


def capture(db: Path, tmp: Path) -> list[tuple[tuple, dict]]:
    """The arguments of every latency_policy call `routeopt train --db DB` makes."""
    from routeopt.artifacts.publish.signing_keys import generate_keys
    from routeopt.flows.cli import cli
    from routeopt.router_training.fit import latency_fitting

    calls: list[tuple[tuple, dict]] = []
    real = latency_fitting.latency_policy

    def keep(*args, **kwargs):  # type: ignore[no-untyped-def]
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    key, _ = generate_keys(tmp)
    latency_fitting.latency_policy = keep
    try:
        train = ["train", "--db", str(db), "--registry", str(tmp / "registry"), "--signing-key", str(key)]
        cli.main(train, prog_name="routeopt", standalone_mode=False)
    finally:
        latency_fitting.latency_policy = real
    return calls


def digest(made: tuple) -> str:
    policy, metrics = made
    h = hashlib.sha256()
    if policy is not None:
        h.update(json.dumps(policy.header(), sort_keys=True, default=str).encode())
        for name, array in sorted(policy.arrays().items()):
            h.update(name.encode() + np.ascontiguousarray(array).tobytes())
        h.update(json.dumps([t.to_dict() for t in policy.tiers], sort_keys=True, default=str).encode())
    h.update(json.dumps(metrics, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--db", type=Path, required=True, help="a store whose outcomes measured latency")
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    from routeopt.router_training.fit.latency_fitting import latency_policy

    with tempfile.TemporaryDirectory(prefix="latency-fit-") as tmp:
        calls = capture(args.db.resolve(), Path(tmp))
    if not calls:
        sys.exit(f"{args.db}: training fitted no latency section (no measured TTFT or latency)")
    for i, (a, kw) in enumerate(calls):
        times, made = [], None
        for _ in range(args.reps):
            start = time.perf_counter()
            made = latency_policy(*a, **kw)
            times.append(time.perf_counter() - start)
        tiers = len(made[0].tiers) if made[0] is not None else 0
        print(
            f"call {i + 1}: {len(a[0].Y)} calibration requests, "
            f"{tiers} tiers: median {statistics.median(times):.2f} s over {args.reps} "
            f"(min {min(times):.2f}), digest {digest(made)}"
        )


if __name__ == "__main__":
    main()
