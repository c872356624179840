"""Latency budgets on held-out requests: is the certified over-budget share kept, and at what cost?

For each seed, a policy is trained (as `routeopt train` does) on a latency-annotated training
split and decides every request of the test split at quality target 0.9 under a TTFT p95
budget B: the budget the same policy's own choice without a budget misses on 20% of the
training requests (so the budget binds), and 1.25, 1.5 and 2 times that. Reported per seed, then as medians:

- the test requests over budget (measured TTFT > B) beside the certified rate (alpha), and the
  pass rate beside the promise's floor (0.9 x the reference candidate's test pass rate);
- the cost beside the same policy's knob at the same target with every candidate whose test
  TTFT exceeds B on more than alpha of the requests struck out (a static exclusion, which needs
  the test outcomes to know which), and beside the cheapest policy that meets the same budget
  and floor chosen with the test outcomes themselves (that knob, at the cheapest target whose
  test pass rate keeps the floor: an oracle no router can beat);
- the best pass rate within the budget that any rule pricing lateness on the policy's own pass
  predictions reaches (`attainable`): where it is below the floor, no policy built on these
  predictions can keep both, however it trades them;
- the same figures without a budget, for contrast.

Inputs: `python benchmarks/latency_data.py --set routerbench --out DIR` writes
DIR/routerbench-latency/{train,test}.parquet.

    flock /tmp/routeopt-bench.lock python benchmarks/latency_budgets.py --data DIR/routerbench-latency [--seeds 3]

`--cv 0.5,1 [--folds 6]` chooses `Design.budget_margin` on the training requests alone: each
fold is a 70/30 hash split of them, measured as above, per margin (`inf`: masks at the budget;
`0.5/open`: margin 0.5 with `Design.budget_open_mask` on, a mask may open to every candidate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np
import pandas as pd

from routeopt.router_training.fit.data import routing_data
from routeopt.router_training.policy.knob import point_choice, request_unit
from routeopt.router_training.train import Design, train_router

TARGET = 0.9
MISSED = 0.2  # the share of training requests the unbudgeted policy's choice misses the budget on
MORE = (1.25, 1.5, 2.0)  # and looser budgets, as multiples of that one, for the trade-off


def binding_budget(policy, train: pd.DataFrame, kind: str = "ttft") -> float:
    """The budget the policy's own choice at TARGET, without a budget, misses on MISSED of the
    training requests (measured seconds of the candidate it picks)."""
    data = routing_data(train, candidates=policy.candidates)
    P, Cp = policy.predict(data.prompts, data.suites)
    pick = policy.select(P, Cp, data.prompts, data.suites, TARGET)[0]
    seconds = data.latency[kind][np.arange(len(data)), pick]
    return float(np.nanquantile(seconds, 1 - MISSED))


def outcomes(data, pick: np.ndarray, budget: float, kind: str = "ttft") -> dict[str, float]:
    rows = np.arange(len(data))
    seconds = data.latency[kind][rows, pick]
    measured = ~np.isnan(seconds)
    return {
        "pass_rate": float(np.mean(data.Y[rows, pick])),
        "cost": float(np.mean(data.C[rows, pick])),
        "over_budget": float(np.mean(seconds[measured] > budget)),
    }


def oracle(policy, data, P, Cp, budget: float, alpha: float, floor: float, kind: str = "ttft") -> dict:
    """The cheapest policy meeting budget and floor on the test outcomes: the policy's own knob
    with the candidates that break the budget on the test requests struck out, and singles."""
    over = np.nanmean(data.latency[kind] > budget, axis=0)
    ok = over <= alpha
    best = None
    names = policy.candidates
    masked_P = np.where(ok[None, :], P, -1.0)  # a struck-out candidate never passes
    for x in np.linspace(0.0, 1.1, 111):
        pick = policy.select(masked_P, Cp, data.prompts, data.suites, float(x))[0]
        pick = np.where(ok[pick], pick, int(np.argmax(np.where(ok, np.nanmean(data.Y, 0), -1))))
        o = outcomes(data, pick, budget, kind)
        if (
            o["pass_rate"] >= floor
            and o["over_budget"] <= alpha
            and (best is None or o["cost"] < best["cost"])
        ):
            best = {**o, "target": float(x)}
    static = None
    if ok.any():  # the same knob at TARGET with the slow candidates struck out, target not tuned
        allowed = np.broadcast_to(ok, P.shape).copy()
        units = lambda i: request_unit(data.prompts[i], data.suites[i])  # noqa: E731
        pick = point_choice(policy.knob, policy.point_for(TARGET), P, Cp, units, allowed)[0]
        static = outcomes(data, pick, budget, kind)
    singles = [
        {**outcomes(data, np.full(len(data), j), budget, kind), "model": names[j]}
        for j in range(len(names))
        if ok[j]
    ]
    singles = [s for s in singles if s["pass_rate"] >= floor]
    return {
        "router": best,
        "static": static,
        "single": min(singles, key=lambda s: s["cost"]) if singles else None,
        "attainable": attainable(data, P, over, budget, alpha, kind),
    }


def attainable(data, P, over: np.ndarray, budget: float, alpha: float, kind: str = "ttft") -> dict | None:
    """The highest test pass rate within `alpha` of any rule that prices a candidate's lateness
    in pass probability: per request, the candidate maximising p - mu * over (the policy's own
    pass predictions p; `over`, each candidate's share of test requests over budget), cost
    ignored, `mu` chosen with the test outcomes. Below the floor, no use of these predictions
    keeps both the budget and the promise."""
    best = None
    for mu in np.concatenate([[0.0], np.geomspace(1e-3, 100.0, 400)]):
        o = outcomes(data, np.argmax(P - mu * over[None, :], axis=1), budget, kind)
        if o["over_budget"] <= alpha and (best is None or o["pass_rate"] > best["pass_rate"]):
            best = {**o, "mu": float(mu)}
    return best


def one_seed(train: pd.DataFrame, test: pd.DataFrame, seed: int, design: Design | None = None) -> list[dict]:
    start = time.perf_counter()
    result = train_router(train, quality_target=TARGET, seed=seed, design=design or Design())
    seconds = time.perf_counter() - start
    policy = result.policy
    binding = binding_budget(policy, train)
    budgets = [binding, *(binding * m for m in MORE)]
    data = routing_data(test, candidates=policy.candidates).complete()
    P, Cp = policy.predict(data.prompts, data.suites)
    ref = policy.candidates.index(policy.reference_model)
    floor = TARGET * float(np.mean(data.Y[:, ref]))
    pred = policy.predict_latency("ttft", data.prompts, data.suites)
    units = lambda i: request_unit(data.prompts[i], data.suites[i])  # noqa: E731
    free = policy.select(P, Cp, data.prompts, data.suites, TARGET)[0]
    out = []
    for budget in budgets:
        pick = policy._budget_choice("ttft", budget, P, Cp, pred, units, TARGET)[0]
        tier = policy.latency.tier_for("ttft", budget)
        certified = tier is not None and TARGET <= tier.knob.certified_up_to() + 1e-12
        out.append(
            {
                "seed": seed,
                "budget_s": round(budget, 4),
                "train_s": round(seconds, 1),
                "n_test": len(data),
                "tier_s": None if tier is None else tier.budget_s,
                "certified": certified,
                "alpha": policy.latency.alpha,
                "floor": floor,
                "budgeted": outcomes(data, pick, budget),
                "no_budget": outcomes(data, free, budget),
                "oracle": oracle(policy, data, P, Cp, budget, policy.latency.alpha, floor),
                "offered": policy.latency.budgets("ttft"),
            }
        )
    return out


def store_split(db: Path) -> tuple[pd.DataFrame, pd.DataFrame]:
    """A store's training frame, its requests split 70/30 by a hash of the request id."""
    from routeopt.evals.storage.store import Store

    with Store(db, read_only=True) as store:
        frame = store.training_frame()
    frame["prompt"] = frame["prompt"].astype(str)
    return hash_split(frame)


def hash_split(frame: pd.DataFrame, salt: str = "") -> tuple[pd.DataFrame, pd.DataFrame]:
    """The frame's requests split about 70/30 by a hash of the request id (and `salt`)."""
    import hashlib

    ids = frame["request_id"].astype(str)
    test = ids.map(lambda r: hashlib.blake2b((salt + r).encode(), digest_size=2).digest()[0] < 77)
    return frame[~test].reset_index(drop=True), frame[test].reset_index(drop=True)


def cv_design(item: str) -> Design:
    """`--cv`'s item: a budget margin, `/open` after it for masks that may open to every candidate."""
    margin, _, opened = item.partition("/")
    if opened not in ("", "open"):
        raise SystemExit(f"--cv item {item!r}: give MARGIN or MARGIN/open")
    return Design(budget_margin=float(margin), budget_open_mask=bool(opened))


def cross_validate(train: pd.DataFrame, items: list[str], folds: int) -> None:
    """Design.budget_margin and budget_open_mask by cross-validation on the training requests
    alone: each of `folds` hash splits of them (70/30) is measured as `main` measures
    train/test, once per design; printed per design and budget: certified splits, median
    over-budget share, and the median cost beside the static exclusion's (where that keeps the
    floor) and beside the unbudgeted policy's."""
    for item in items:
        runs = [one_seed(*hash_split(train, f"cv{k}:"), k, cv_design(item)) for k in range(folds)]
        for i in range(1 + len(MORE)):
            at = [r[i] for r in runs]
            ratios = [
                r["budgeted"]["cost"] / r["oracle"]["static"]["cost"]
                for r in at
                if r["certified"]
                and r["oracle"]["static"]
                and r["oracle"]["static"]["pass_rate"] >= r["floor"]
            ]
            free = [r["budgeted"]["cost"] / r["no_budget"]["cost"] for r in at if r["certified"]]
            print(
                f"{item}: budget x{([1.0, *MORE])[i]}: certified {sum(r['certified'] for r in at)}/{folds}, "
                f"over {statistics.median(r['budgeted']['over_budget'] for r in at):.3f}, "
                f"cost / static exclusion {statistics.median(ratios) if ratios else float('nan'):.3f} "
                f"({len(ratios)} comparable), cost / no budget's "
                f"{statistics.median(free) if free else float('nan'):.3f}",
                flush=True,
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, help="folder with train.parquet and test.parquet")
    ap.add_argument(
        "--db",
        type=Path,
        help="or a run's DuckDB store (the demo's: .routeopt/routeopt.duckdb), split 70/30 by request",
    )
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument(
        "--cv",
        type=str,
        default=None,
        help="comma-separated Design.budget_margin values (MARGIN/open: with the open mask) to "
        "cross-validate on the training requests only",
    )
    ap.add_argument("--folds", type=int, default=3, help="hash splits of the training requests for --cv")
    args = ap.parse_args()
    if (args.data is None) == (args.db is None):
        ap.error("give --data or --db")
    train, test = (
        store_split(args.db)
        if args.db
        else (pd.read_parquet(args.data / f"{s}.parquet") for s in ("train", "test"))
    )
    if args.cv:
        cross_validate(train, args.cv.split(","), args.folds)
        return
    per_seed = [one_seed(train, test, s) for s in range(args.seeds)]
    for runs in per_seed:
        for r in runs:
            print(json.dumps(r))
    train_s = statistics.median(r[0]["train_s"] for r in per_seed)
    print(f"target {TARGET}, {args.seeds} seeds, medians (training {train_s:.1f} s):")
    nan = float("nan")
    for i in range(1 + len(MORE)):
        runs = [seed_runs[i] for seed_runs in per_seed]
        budget = statistics.median(r["budget_s"] for r in runs)
        how = (
            f"the unbudgeted choice misses it on {MISSED:.0%} of training requests"
            if i == 0
            else f"{MORE[i - 1]}x"
        )
        med = lambda f: statistics.median(f(r) for r in runs)  # noqa: E731
        b = lambda key: med(lambda r: r["budgeted"][key])  # noqa: E731
        oracle_cost = med(lambda r: r["oracle"]["router"]["cost"] if r["oracle"]["router"] else nan)
        attained = med(lambda r: r["oracle"]["attainable"]["pass_rate"] if r["oracle"]["attainable"] else nan)
        static = lambda key: med(lambda r: r["oracle"]["static"][key] if r["oracle"]["static"] else nan)  # noqa: E731
        print(
            f"- TTFT p95 budget {budget:.3f} s ({how}): "
            f"certified at {sum(r['certified'] for r in runs)}/{len(runs)} seeds; over budget "
            f"{b('over_budget'):.3f} (alpha {runs[0]['alpha']}), pass {b('pass_rate'):.3f} "
            f"(floor {med(lambda r: r['floor']):.3f}), ${b('cost'):.3g}/request; the knob with the "
            f"candidates over budget on the test requests struck out: over {static('over_budget'):.3f}, "
            f"pass {static('pass_rate'):.3f}, ${static('cost'):.3g} (ratio {b('cost') / static('cost'):.3f}); "
            f"oracle meeting both ${oracle_cost:.3g} (ratio {b('cost') / oracle_cost:.3f}); best pass any "
            f"lateness-priced rule on the policy's predictions reaches within alpha {attained:.3f}; without a budget: over "
            f"{med(lambda r: r['no_budget']['over_budget']):.3f}, pass "
            f"{med(lambda r: r['no_budget']['pass_rate']):.3f}, ${med(lambda r: r['no_budget']['cost']):.3g}"
        )


if __name__ == "__main__":
    main()
