"""JavaScript vs Python on policies trained on every shared set: layers and decisions.

For each shared set, its policy is published through the CLI (benchmarks/js_common.py), then:

- the conformance vectors (~2,000 hostile and synthetic requests, 8 quality targets, exploration
  and canary draws) run in Python (`routeopt.artifacts.serving.loader` as a gateway loads them) and in Node
  (`gateways/js`): mismatches per layer, integer layers included;
- every test-split prompt of the set is routed by both runtimes at 7 targets: identical
  decisions (model, fallbacks, propensity), counted.

    flock /tmp/routeopt-bench.lock python benchmarks/js_conformance.py [--sets routerbench,alpacaeval]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from js_common import build_js, load_average, node, published, requests_file, test_requests

TARGETS = (None, 0.0, 0.8, 0.9, 0.95, 0.99, 1.0)


def python_side(version: Path, public_key: Path, requests: list[dict]) -> tuple[dict, list[dict]]:
    from routeopt.artifacts.serving.loader import load

    start = time.perf_counter()
    router = load(version, public_key=public_key, state_dir=False)
    load_s = time.perf_counter() - start
    decisions = []
    for r in requests:
        d = router.route(r["prompt"], r["suite"], r["quality_target"])
        decisions.append(
            {"id": r["id"], "model": d.model, "fallbacks": list(d.fallbacks), "propensity": d.propensity}
        )
    return {"conformance": router.status().conformance, "load_s": load_s}, decisions


def run_set(name: str) -> dict:
    version, key = published(name)
    requests = test_requests(name, TARGETS)
    py, py_decisions = python_side(version, key, requests)
    js = json.loads(node("bench/conformance.mjs", str(version)))
    with tempfile.TemporaryDirectory() as tmp:
        path = requests_file(requests, Path(tmp))
        js_decisions = [
            json.loads(line)
            for line in node("bench/route.mjs", str(version), str(path), public_key=key).splitlines()
        ]
    same = sum(a == b for a, b in zip(py_decisions, js_decisions))
    return {
        "set": name,
        "vectors": js["requests"],
        "js_ok": js["ok"],
        "js_mismatches": js["mismatches"],
        "js_max_rel": js["maxRelativeError"],
        "python": py["conformance"],
        "prompts": len(requests),
        "identical": same,
        "first_difference": next((b for a, b in zip(py_decisions, js_decisions) if a != b), None),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default="routerbench,alpacaeval,openllm_bbh")
    args = ap.parse_args()
    build_js()
    print(load_average())
    rows = [run_set(name) for name in args.sets.split(",")]
    print(f"{'set':<12} {'vectors':>7} {'JS layers':<40} {'max rel':>8} {'test decisions identical':>26}")
    for r in rows:
        layers = "all agree" if r["js_ok"] else json.dumps({k: v for k, v in r["js_mismatches"].items() if v})
        print(
            f"{r['set']:<12} {r['vectors']:>7} {layers:<40} {r['js_max_rel']:>8.1e} "
            f"{r['identical']:>12} of {r['prompts']:<10}"
        )
        if r["first_difference"]:
            print(f"  first difference: {r['first_difference']}")
        print(f"  Python self-check: {r['python']}")
    print(load_average())


if __name__ == "__main__":
    main()
