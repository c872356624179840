"""How many routing decisions a code change moved: per-request choices on every shared set.

Each set is trained as `routeopt bench router` trains it (its train.parquet as `routeopt import
outcomes` stores it, `train_router` with the defaults), then every complete test request is
routed at the standard targets. Run it once per checkout (PYTHONPATH picks the code) and compare:

    PYTHONPATH=/work/main python benchmarks/policy_format_drift.py --out before.json
    PYTHONPATH=$PWD python benchmarks/policy_format_drift.py --out after.json
    python benchmarks/policy_format_drift.py --compare before.json after.json

Only public entry points are used, so it runs against older checkouts too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from router_data import data_dir  # noqa: E402


def decisions(data: Path) -> dict:
    from routeopt.evals.storage.importer import training_frame_of
    from routeopt.router_training.evaluation.bench import find_sets, knob_choices, read_frame, scoring_data
    from routeopt.router_training.fit.knob_fitting import STANDARD_TARGETS
    from routeopt.router_training.train import train_router

    out = {}
    for name, train_path, test_path in find_sets(data):
        start = time.perf_counter()
        policy = train_router(training_frame_of(train_path)).policy
        test = scoring_data(read_frame(test_path), policy.candidates)
        choices = knob_choices(policy, test, STANDARD_TARGETS)
        out[name] = {
            "candidates": policy.candidates,
            "requests": list(test.request_ids),
            "targets": list(STANDARD_TARGETS),
            "choices": [[policy.candidates[j] for j in c.tolist()] for c in choices],
        }
        print(
            f"{name}: {len(test)} requests x {len(STANDARD_TARGETS)} targets "
            f"({time.perf_counter() - start:.0f} s)",
            flush=True,
        )
    return out


def compare(before: dict, after: dict) -> None:
    for name in sorted(set(before) & set(after)):
        a, b = before[name], after[name]
        assert a["requests"] == b["requests"] and a["targets"] == b["targets"], name
        total = changed = 0
        per_target = []
        for x, ca, cb in zip(a["targets"], a["choices"], b["choices"]):
            moved = sum(p != q for p, q in zip(ca, cb))
            per_target.append(f"{x:g}:{moved}")
            total, changed = total + len(ca), changed + moved
        print(
            f"{name}: {changed} of {total} decisions changed ({changed / total:.2%}); per target "
            + " ".join(per_target)
        )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--out", type=Path)
    ap.add_argument("--compare", nargs=2, type=Path)
    args = ap.parse_args()
    if args.compare:
        compare(*(json.loads(p.read_text()) for p in args.compare))
        return
    if not args.data.is_dir():
        raise SystemExit(f"{args.data}: no shared outcome sets here")
    result = decisions(args.data)
    if args.out:
        args.out.write_text(json.dumps(result))


if __name__ == "__main__":
    main()
