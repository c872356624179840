"""Does the shift monitor see the project's own shifts, and stay quiet without one?

For each set under --data, the training split trains the policy `routeopt train` publishes (its
metrics carry the monitor's reference sketch). Then, per seed, --logged requests are drawn with
replacement from the test split as it is (`none`) and from each shifted test set
(`routeopt.router_training.evaluation.shifts`, drawn with that seed), and logged as the gateway logs them: suite,
prompt length, and the model the policy chose at its target (`decide_batch`, as the gateway's
`policy_model`). `routeopt.router_training.live.shift_monitor.detect_shift` compares them with the sketch.

Prints per set and shift how many seeds flagged a shift, the median adjusted p-value and the
features that moved most often. Asked of it: every shift flagged (p < 0.01) with 2,000 logged
requests; the unshifted replay quiet in at least 19 of 20 seeds.

    OMP_NUM_THREADS=1 python benchmarks/shift_monitor.py [--data ../shared/data] [--seeds 20] [--logged 2000]
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router_data import data_dir  # noqa: E402


def logged_requests(policy, data, routed: list[str], idx: np.ndarray):
    """The monitor's view of the requests `idx` routed by `policy` at its own target (`routed`:
    its decision for every request of `data`, made once: a decision is a function of the request)."""
    from routeopt.router_training.live.shift_monitor import Logged

    return Logged(
        [data.suites[i] for i in idx],
        np.array([len(data.prompts[i]) for i in idx]),
        [policy.quality_target] * len(idx),
        [routed[i] for i in idx],
        [str(data.request_ids[i]) for i in idx],
    )  # what the log's prompt_hash tells apart


def run_set(name: str, folder: Path, seeds: int, n: int) -> list[dict]:
    from routeopt.evals.storage.importer import training_frame_of
    from routeopt.router_training.evaluation.baselines import ReferenceRouter
    from routeopt.router_training.evaluation.bench import scoring_data
    from routeopt.router_training.fit.data import routing_data
    from routeopt.router_training.live.shift_monitor import detect_shift
    from routeopt.router_training.evaluation.shift_bench import difficulty
    from routeopt.router_training.evaluation.shifts import SHIFTS, shifted
    from routeopt.router_training.train import train_router

    frame = training_frame_of(folder / "train.parquet")
    policy = train_router(frame).policy
    test = scoring_data(pd.read_parquet(folder / "test.parquet"), policy.candidates)
    hardness = difficulty(ReferenceRouter().fit(routing_data(frame, candidates=policy.candidates)), test)
    routed = [d.model for d in policy.decide_batch(test.prompts, test.suites)]
    rows = []
    for shift in ("none", *SHIFTS):
        flagged, p, moved = 0, [], Counter()
        for seed in range(seeds):
            if shift == "none":
                pool = np.arange(len(test))
            else:
                s = shifted(shift, test, hardness, seed=seed)
                if s is None:
                    break
                pool = s.keep
            idx = np.random.default_rng(seed).choice(pool, size=n, replace=True)
            report = detect_shift(
                policy.metrics["shift_reference"], logged_requests(policy, test, routed, idx)
            )
            flagged += report.shifted
            p.append(report.p_value)
            moved.update(f.feature for f in report.moved())
        if p:
            rows.append(
                {
                    "set": name,
                    "shift": shift,
                    "seeds": len(p),
                    "flagged": flagged,
                    "median_p": float(np.median(p)),
                    "max_p": float(np.max(p)),
                    "moved": ", ".join(f"{k} x{v}" for k, v in moved.most_common(3)),
                }
            )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--sets", default="", help="Comma-separated set names (default: all).")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--logged", type=int, default=2000, help="Logged requests per replay.")
    args = ap.parse_args()
    names = [s for s in args.sets.split(",") if s] or sorted(
        d.name for d in args.data.iterdir() if (d / "train.parquet").is_file()
    )
    print(f"{'set':<13}{'shift':<8}{'flagged':>10}{'median p':>11}{'max p':>10}  features that moved (seeds)")
    for name in names:
        for r in run_set(name, args.data / name, args.seeds, args.logged):
            print(
                f"{r['set']:<13}{r['shift']:<8}{r['flagged']:>5}/{r['seeds']:<4}{r['median_p']:>11.2g}"
                f"{r['max_p']:>10.2g}  {r['moved']}",
                flush=True,
            )


if __name__ == "__main__":
    main()
