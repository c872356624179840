"""A published policy's bytes and its cold load, in Python and in Node.

The set's policy (RouterBench by default) is published through the CLI (benchmarks/js_common.py).

- Size: each file of the version, the policy without its conformance vectors, and what a
  gateway downloads with gzip (level 6, as HTTP servers compress); beside the same policy
  written as format 2 did (JSON arrays: tests/router_training/legacy.py).
- Cold load + verify + self-check: in a fresh process each round (Python with its bytecode
  cache, as an installed package runs, and without, as this machine's environment sets it), the time of
  `routeopt.artifacts.serving.loader.load(version, public_key=...)` (signature, every hash, parse, the
  conformance vectors, a trial decision) and of `Router.open({files, publicKeys})` in Node; and
  the whole process (interpreter start and imports included). Medians of the rounds.

    flock /tmp/routeopt-bench.lock python benchmarks/policy_footprint.py [--set routerbench] [--rounds 3]
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from js_common import ROOT, build_js, load_average, node, published

PY_LOAD = """
import json, sys, time
t0 = time.perf_counter()
from routeopt.artifacts.serving.loader import load
t1 = time.perf_counter()
router = load(sys.argv[1], public_key=sys.argv[2], state_dir=False)
t2 = time.perf_counter()
assert "agree" in router.status().conformance, router.status().conformance
print(json.dumps({"import_ms": (t1 - t0) * 1000, "load_ms": (t2 - t1) * 1000}))
"""


def sizes(version: Path) -> dict[str, tuple[int, int]]:
    return {
        p.name: (p.stat().st_size, len(gzip.compress(p.read_bytes(), 6))) for p in sorted(version.iterdir())
    }


def format_2_sizes(version: Path) -> dict[str, tuple[int, int]]:
    from routeopt.router_training.policy.routing import RoutingPolicy
    from tests.router_training.legacy import save_format_2

    with tempfile.TemporaryDirectory() as tmp:
        save_format_2(RoutingPolicy.load(version), Path(tmp))
        return {
            p.name: (p.stat().st_size, len(gzip.compress(p.read_bytes(), 6)))
            for p in sorted(Path(tmp).iterdir())
        }


def python_load(version: Path, key: Path, bytecode: bool) -> dict:
    """One fresh process. With `bytecode`, the checkout's modules come with their bytecode cache,
    as an installed package's do; without, from a copy with none, compiled in the process (as
    every process compiles them here, where the environment sets PYTHONDONTWRITEBYTECODE)."""
    with tempfile.TemporaryDirectory() as tmp:
        path = ROOT
        if not bytecode:
            path = Path(tmp)
            for package in ("artifacts", "common", "router_training"):
                shutil.copytree(ROOT / package, path / package, ignore=shutil.ignore_patterns("__pycache__"))
        env = {**os.environ, "PYTHONPATH": str(path), "OMP_NUM_THREADS": "1"}
        if bytecode:
            env.pop("PYTHONDONTWRITEBYTECODE", None)
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"
        start = time.perf_counter()
        done = subprocess.run(
            [sys.executable, "-c", PY_LOAD, str(version), str(key)],
            env=env,
            cwd=path,
            capture_output=True,
            text=True,
        )
        total = (time.perf_counter() - start) * 1000
    if done.returncode != 0:
        raise SystemExit(done.stderr)
    return {**json.loads(done.stdout), "process_ms": total}


def node_load(version: Path, key: Path) -> dict:
    start = time.perf_counter()
    out = json.loads(node("bench/open.mjs", str(version), public_key=key))
    return {**out, "process_ms": (time.perf_counter() - start) * 1000}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--set", default="routerbench")
    ap.add_argument("--rounds", type=int, default=3)
    args = ap.parse_args()
    build_js()
    version, key = published(args.set)
    print(load_average())
    now, old = sizes(version), format_2_sizes(version)
    mb = lambda b: f"{b / 1e6:.2f} MB"
    print(f"{args.set} policy, format 3 (this build):")
    for name, (raw, gz) in now.items():
        print(f"  {name:<26} {mb(raw):>10}   gzip {mb(gz):>9}")
    without = sum(r for n, (r, _) in now.items() if n != "conformance.safetensors")
    print(
        f"  {'without the vectors':<26} {mb(without):>10}   gzip {mb(sum(g for n, (_, g) in now.items() if n != 'conformance.safetensors')):>9}"
    )
    print(
        f"  {'a gateway downloads':<26} {mb(sum(r for r, _ in now.values())):>10}   gzip {mb(sum(g for _, g in now.values())):>9}"
    )
    print("the same policy as format 2 wrote it (JSON arrays):")
    for name, (raw, gz) in old.items():
        print(f"  {name:<26} {mb(raw):>10}   gzip {mb(gz):>9}")
    print(
        f"  {'total':<26} {mb(sum(r for r, _ in old.values())):>10}   gzip {mb(sum(g for _, g in old.values())):>9}"
    )
    python_load(version, key, bytecode=True)  # writes the bytecode cache, as installing does
    py = [python_load(version, key, bytecode=True) for _ in range(args.rounds)]
    uncached = [python_load(version, key, bytecode=False) for _ in range(args.rounds)]
    js = [node_load(version, key) for _ in range(args.rounds)]
    med = lambda rows, k: statistics.median(r[k] for r in rows)
    print(f"cold load + verify + self-check, medians of {args.rounds} fresh processes:")
    for name, rows in (("bytecode cached", py), ("no bytecode cache for the checkout", uncached)):
        print(
            f"  Python  load() {med(rows, 'load_ms'):7.0f} ms   (imports {med(rows, 'import_ms'):5.0f} ms, whole process "
            f"{med(rows, 'process_ms'):6.0f} ms)   rounds {[round(r['load_ms']) for r in rows]}   {name}"
        )
    print(
        f"  Node    open() {med(js, 'open_ms'):7.0f} ms   (whole process {med(js, 'process_ms'):6.0f} ms)"
        f"   rounds {[round(r['open_ms']) for r in js]}"
    )
    print(load_average())


if __name__ == "__main__":
    main()
