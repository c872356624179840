"""Live latency in a replay: one candidate's latency triples for ten minutes; how fast does a
gateway move its requests, and back, and what happens to quality?

A policy is trained (as `routeopt train` does) on the latency-annotated training split. Its
Router (the Python gateway runtime, `routeopt.artifacts.serving.loader`) then serves the test
prompts in a loop at `--rate` requests per second for 30 minutes of simulated time (a clock
the router is given, so the replay is exact and quick) under a TTFT budget: the smallest
certified budget whose tier serves target 0.9. Each served call's TTFT is the recorded one of
(request, served model), three times that for the slowed candidate from minute 10 to minute
20, and is fed back with `Router.observe` beside the p95 the decision predicted for it. The
slowed candidate is the one whose requests the move rule can most often send elsewhere.
Reported: the slowed candidate's share of the requests the policy gives it that the rule can
move (three times slower, to a fallback that stays within the tier's mask and is at least as
likely to pass; the others stay, quality first), per phase, the seconds until that share first fell below a tenth
of what it was before and until it was back, the over-budget share of served calls, and the
pass rate of served requests (recorded outcomes) beside the promise's floor.

    python benchmarks/latency_data.py --set routerbench --out DIR
    flock /tmp/routeopt-bench.lock python benchmarks/live_latency.py --data DIR/routerbench-latency
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import pandas as pd

from routeopt.router_training.fit.data import routing_data
from routeopt.router_training.policy.live import live_move
from routeopt.router_training.train import train_router

TARGET = 0.9
SLOW_FROM, SLOW_TO, END = 600.0, 1200.0, 1800.0


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--rate", type=float, default=5.0, help="requests per second")
    ap.add_argument("--out", type=Path, default=None, help="write the per-request trace here (JSONL)")
    args = ap.parse_args()
    train, test = (pd.read_parquet(args.data / f"{s}.parquet") for s in ("train", "test"))
    policy = train_router(train, quality_target=TARGET, seed=0).policy
    lat = policy.latency
    budget = next(
        b for b in lat.budgets("ttft") if TARGET <= lat.tier_for("ttft", b).knob.certified_up_to() + 1e-12
    )
    data = routing_data(test, candidates=policy.candidates).complete()
    names = policy.candidates
    ttft = data.latency["ttft"]
    decisions = policy.decide_batch(data.prompts, data.suites, ttft_budget_s=budget)
    can_move = [
        live_move(
            d.model,
            d.fallbacks,
            names,
            d.pass_probabilities,
            d.budget.predicted_s,
            d.budget.limit_s,
            {d.model: 3.0},
        )
        is not None
        for d in decisions
    ]
    movable = [d.model for d, ok in zip(decisions, can_move) if ok]
    slow = max(set(movable), key=movable.count)
    ref = names.index(policy.reference_model)
    floor = TARGET * float(np.mean(data.Y[:, ref]))

    with _router(policy) as (router, clock):
        rows = []
        n = int(END * args.rate)
        for step in range(n):
            t = step / args.rate
            clock.now = t
            i = step % len(data)
            d = router.route(data.prompts[i], data.suites[i], ttft_budget_s=budget)
            j = names.index(d.model)
            seconds = float(ttft[i, j]) * (3.0 if d.model == slow and SLOW_FROM <= t < SLOW_TO else 1.0)
            router.observe(d.model, ttft_s=seconds, predicted_ttft_s=d.budget["predicted_s"][d.model], at=t)
            rows.append(
                (
                    t,
                    i,
                    decisions[i].model == slow,
                    decisions[i].model == slow and can_move[i],
                    d.model == slow,
                    d.live is not None,
                    seconds > budget,
                    data.Y[i, j],
                )
            )
    trace = pd.DataFrame(
        rows, columns=["t", "i", "policy_slow", "movable", "served_slow", "moved", "over", "passed"]
    )
    if args.out:
        trace.to_json(args.out, orient="records", lines=True)
    mine = trace[trace["movable"]]
    phase = pd.cut(mine["t"], [0, SLOW_FROM, SLOW_TO, END], right=False, labels=["before", "slowed", "after"])
    share = mine.groupby(phase, observed=True)["served_slow"].mean()
    base = float(share["before"])
    buckets = mine.assign(b=(mine["t"] // 5) * 5).groupby("b")["served_slow"].mean()
    gone = buckets[(buckets.index >= SLOW_FROM) & (buckets < 0.1 * base)]
    back = buckets[(buckets.index >= SLOW_TO) & (buckets >= 0.9 * base)]
    by_phase = trace.assign(
        phase=pd.cut(
            trace["t"], [0, SLOW_FROM, SLOW_TO, END], right=False, labels=["before", "slowed", "after"]
        )
    )
    summary = {
        "budget_s": budget,
        "slowed": slow,
        "requests": len(trace),
        "its_requests": int(sum(d.model == slow for d in decisions)),
        "of_which_movable": int(sum(ok for d, ok in zip(decisions, can_move) if d.model == slow)),
        "share_of_its_movable_requests_served_by_it": {k: round(float(v), 3) for k, v in share.items()},
        "seconds_until_moved": None if gone.empty else float(gone.index[0] - SLOW_FROM + 5),
        "seconds_until_back": None if back.empty else float(back.index[0] - SLOW_TO + 5),
        "over_budget": {
            k: round(float(v), 3) for k, v in by_phase.groupby("phase", observed=True)["over"].mean().items()
        },
        "pass_rate": {
            k: round(float(v), 3)
            for k, v in by_phase.groupby("phase", observed=True)["passed"].mean().items()
        },
        "floor": round(floor, 3),
        "moved": int(trace["moved"].sum()),
    }
    print(json.dumps(summary, indent=1))


class _router:
    """A Router over a registry holding the one policy (unsigned), on a simulated clock."""

    def __init__(self, policy) -> None:
        import tempfile

        self.tmp = tempfile.TemporaryDirectory()
        self.policy = policy

    def __enter__(self):
        from routeopt.artifacts.publish.registry import publish
        from routeopt.artifacts.serving.loader import load

        registry = Path(self.tmp.name) / "registry"
        publish(self.policy, registry, lineage={}, metrics={}, allow_unsigned=True)
        clock = Clock()
        router = load(registry, allow_unsigned=True, state_dir=False, clock=clock)
        return router, clock

    def __exit__(self, *exc) -> None:
        self.tmp.cleanup()


if __name__ == "__main__":
    main()
