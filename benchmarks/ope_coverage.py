"""Coverage of the off-policy estimates: how often the 95% interval holds a policy's true value.

Replays a known traffic (RouterBench's test split in ../shared, else a synthetic fleet) through
the gateway under the champion with exploration, once per seed, feeds back the true outcomes, and
estimates a second policy's pass rate and cost per request (`benchmarks/traffic_replay.py`). The
truth comes straight from the data. For each way of knowing the second policy's choices (text
kept, shadow, canary) and each estimator it prints how many seeds' intervals cover the truth,
the mean interval width and the mean effective sample size; also how often the paired
difference from the champion (what the promotion gate uses) covers the true difference.

    python benchmarks/ope_coverage.py --seeds 20 [--data routerbench|synthetic] [--rate 0.1] [--reps 3]

The last lines are `coverage MODE pass_dr=k/n cost_dr=k/n`.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
sys.path.insert(0, str(Path(__file__).resolve().parent))

import traffic_replay as tr  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", choices=("auto", "routerbench", "synthetic"), default="auto")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--rate", type=float, default=0.1, help="exploration rate")
    ap.add_argument("--reps", type=int, default=3, help="times the traffic is replayed per seed")
    ap.add_argument(
        "--second-target",
        type=float,
        default=0.9,
        help="quality target of the evaluated policy (the champion's is 0.95)",
    )
    ap.add_argument("--feedback-share", type=float, default=1.0)
    ap.add_argument("--canary-share", type=float, default=0.2)
    ap.add_argument("--modes", default="text,shadow,canary")
    args = ap.parse_args()
    source = (
        args.data
        if args.data != "auto"
        else ("routerbench" if (tr.ROUTERBENCH / "test.parquet").exists() else "synthetic")
    )
    t0 = time.perf_counter()
    train, fleet, what = tr.load_data(source)
    champion, _ = tr.train_pair(train)
    second = replace(champion, quality_target=args.second_target)
    true_pass, true_cost = tr.truth(second, fleet)
    champ_pass, champ_cost = tr.truth(champion, fleet)
    agree = np.mean(
        [
            a.model == b.model
            for a, b in zip(
                champion.decide_batch(fleet.prompts, fleet.suites),
                second.decide_batch(fleet.prompts, fleet.suites),
            )
        ]
    )
    print(f"{what}; trained in {time.perf_counter() - t0:.0f} s")
    print(f"champion (target 0.95): pass {champ_pass:.4f}, cost/request {champ_cost:.6f} USD")
    print(
        f"evaluated (target {args.second_target}): true pass {true_pass:.4f}, cost/request "
        f"{true_cost:.6f} USD; agrees with the champion on {agree:.1%} of requests"
    )
    print(
        f"exploration rate {args.rate}, {args.reps} replays per seed "
        f"({args.reps * len(fleet.request_ids)} logged requests), feedback on {args.feedback_share:.0%}"
    )
    lines = []
    with tempfile.TemporaryDirectory(prefix="ope-coverage-") as tmp:
        registry = tr.publish_pair(Path(tmp), champion, second)
        for mode in args.modes.split(","):
            stats: dict[tuple[str, str], list[tuple[bool, float, float]]] = {}
            for seed in range(args.seeds):
                path = tr.replay(
                    registry,
                    fleet,
                    Path(tmp),
                    mode=mode,
                    seed=seed,
                    rate=args.rate,
                    reps=args.reps,
                    canary_share=args.canary_share,
                    feedback_share=args.feedback_share,
                )
                est, _, diff = tr.estimate_pair(path, second, 2, mode)
                for what_, truth, table in (
                    ("pass", true_pass, est.pass_rate),
                    ("cost", true_cost, est.cost),
                    ("diff", true_pass - champ_pass, {"pass": diff.pass_rate_diff}),
                    ("diff", true_cost - champ_cost, {"cost": diff.cost_diff}),
                ):
                    for name, e in table.items():
                        stats.setdefault((what_, name), []).append(
                            (
                                e.covers(truth),
                                e.high - e.low,
                                e.ess if what_ != "diff" else est.pass_rate["dr"].ess,
                            )
                        )
                path.unlink()
            print(f"\n{mode}: {args.seeds} seeds")
            print(f"  {'estimate':<12} {'covered':>8} {'mean CI width':>14} {'mean ESS':>9}")
            for (what_, name), rows in stats.items():
                cov = sum(r[0] for r in rows)
                print(
                    f"  {what_ + ' ' + name:<12} {cov:>5}/{len(rows):<2} {np.mean([r[1] for r in rows]):>14.4g} "
                    f"{np.mean([r[2] for r in rows]):>9.1f}"
                )
            dr_p, dr_c, dp = stats[("pass", "dr")], stats[("cost", "dr")], stats[("diff", "pass")]
            lines.append(
                f"coverage {mode} pass_dr={sum(r[0] for r in dr_p)}/{len(dr_p)} "
                f"cost_dr={sum(r[0] for r in dr_c)}/{len(dr_c)} "
                f"pass_diff_vs_champion={sum(r[0] for r in dp)}/{len(dp)}"
            )
    print()
    print("\n".join(lines))


if __name__ == "__main__":
    main()
