"""Does the knob keep its promise on held-out requests of the demo's own outcomes? 20 split seeds.

A certificate at 95% confidence should rarely be refuted by held-out requests drawn like the
calibration requests. For each split seed this trains on the outcomes of a `routeopt run` store
as the nightly does (`train_router(frame, seed=s)`: hold out 30% per suite, certify, measure on
the held-out requests) and prints per seed the promise's held-out record: at how many certified
targets it held, at how many the held-out requests refute it (their own upper bound of the
paired margin below 0), and the pass rate and cost at the demo's target 0.95 against its floor.

Those figures describe the policy fitted without the held-out requests. The published one is
refit on all of them, so it has no held-out requests of its own: `--published` also keeps an
outer 30% of the requests out of training altogether (per suite, seed s), trains on the rest
exactly as above, and scores the published (refit) policy's promise on that outer share.

    routeopt run --config COPY_OF_routeopt.yaml        # db_path and registry_dir in a temp dir
    python benchmarks/demo_promise.py /tmp/x/routeopt.duckdb [--seeds 20] [--cost recorded|tokens]

`--cost tokens` prices every call at (input + output tokens) x the candidate's GPU-hour price in
the config (measured times differ between runs; this makes the figures the same on every run).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def demo_frame(db: Path, config: Path | None = None, cost: str = "recorded") -> pd.DataFrame:
    """The training frame of the store's latest run, as the nightly reads it (the config's
    fleet); with cost 'tokens', repriced at tokens x GPU-hour price."""
    from routeopt.evals.config import load_config
    from routeopt.evals.storage.store import Store

    cfg = load_config(config or ROOT / "evals" / "demo" / "routeopt.yaml")
    names = [c.name for c in cfg.candidates]
    with Store(db, read_only=True) as store:
        run = store.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
        if run.empty:
            raise SystemExit(f"{db}: no runs; run `routeopt run` first")
        frame = store.latest_frame(
            str(run.run_id.iloc[0]), candidates=names, max_age_days=cfg.router.max_outcome_age_days
        )
    if cost == "tokens":
        price = {c.name: float(c.gpu_hour_usd or 0.0) for c in cfg.candidates}
        tokens = frame["input_tokens"].fillna(0) + frame["output_tokens"].fillna(0)
        frame = frame.assign(cost_usd=tokens * frame["model"].map(price) * 1e-6)
    return frame


def _row(seed: int, promise: dict, policy, best_cost: float, target: float) -> dict:
    at = next(r for r in promise["targets"] if abs(r["target"] - target) < 1e-9)
    return {
        "seed": seed,
        "n": promise["n"],
        "held": promise["held"],
        "promised": promise["promised"],
        "refuted": [r["target"] for r in promise["targets"] if r["contradicted"]],
        "pass": at["pass_rate"],
        "floor": at["floor"],
        "cost_vs_best": at["cost"] / best_cost,
        "certified_up_to": policy.knob.certified_up_to(),
    }


def seed_rows(frame: pd.DataFrame, seeds: int, target: float = 0.95) -> list[dict]:
    """Per split seed: the held-out promise record of the policy `train_router` describes."""
    from routeopt.router_training.train import train_router

    rows = []
    for s in range(seeds):
        result = train_router(frame, seed=s, quality_target=target)
        rows.append(
            _row(
                s,
                result.metrics["holdout"]["promise"],
                result.evaluated,
                result.metrics["holdout"]["best_single"]["cost"],
                target,
            )
        )
    return rows


def published_rows(frame: pd.DataFrame, seeds: int, target: float = 0.95) -> list[dict]:
    """Per seed: the published (refit) policy's promise on an outer 30% it never trained on."""
    from routeopt.router_training.fit.data import routing_data
    from routeopt.router_training.fit.knob_fitting import STANDARD_TARGETS
    from routeopt.router_training.train import promise_report, split_requests, train_router

    data = routing_data(frame)
    rows = []
    for s in range(seeds):
        outer = split_requests(data, 0.3, 1000 + s)
        kept = set(data.request_ids[i] for i in outer["train"])
        result = train_router(frame[frame["request_id"].isin(kept)], seed=s, quality_target=target)
        test = data.subset(outer["test"])
        promise = promise_report(result.policy, test, tuple(sorted({*STANDARD_TARGETS, target})))
        ref = result.policy.candidates.index(result.policy.reference_model)
        best_cost = float(np.nanmean(test.align(result.policy.candidates).C[:, ref]))
        rows.append(_row(s, promise, result.policy, best_cost, target))
    return rows


def format_rows(rows: list[dict], target: float = 0.95) -> str:
    lines = [
        f"{'seed':>4} {'held-out':>8} {'held':>7} {'refuted at':<22} {'pass@' + format(target, 'g'):>9} "
        f"{'floor':>7} {'cost/best':>9} {'certified up to':>15}"
    ]
    for r in rows:
        refuted = ", ".join(f"{x:g}" for x in r["refuted"]) or "-"
        lines.append(
            f"{r['seed']:>4} {r['n']:>8} {r['held']:>3}/{r['promised']:<3} {refuted:<22} {r['pass']:>9.3f} "
            f"{r['floor']:>7.3f} {r['cost_vs_best']:>9.3f} {r['certified_up_to']:>15.3f}"
        )
    runs = sum(bool(r["refuted"]) for r in rows)
    held, promised = sum(r["held"] for r in rows), sum(r["promised"] for r in rows)
    below = sum(r["pass"] < r["floor"] - 1e-12 for r in rows)
    lines += [
        "",
        f"runs with any significant refutation: {runs} of {len(rows)}; promise held at {held} of "
        f"{promised} certified (seed, target) pairs; below the floor at {target:g} in {below} of {len(rows)}",
    ]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("db", type=Path, help="The DuckDB store a `routeopt run` wrote.")
    ap.add_argument("--config", type=Path, default=None, help="The config of that run (default: the repo's).")
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--cost", choices=("recorded", "tokens"), default="recorded")
    ap.add_argument(
        "--published",
        action="store_true",
        help="Also score the published (refit) policy on an outer 30%% it never saw.",
    )
    args = ap.parse_args()
    frame = demo_frame(args.db, args.config, args.cost)
    print(
        f"{args.db}: {frame['request_id'].nunique()} requests x {frame['model'].nunique()} candidates, "
        f"cost {args.cost}",
        flush=True,
    )
    print("the policy the held-out figures describe (fitted without its 30% held-out requests):")
    print(format_rows(seed_rows(frame, args.seeds)), flush=True)
    if args.published:
        print(
            "\nthe published policy (refit on all its training requests), on an outer 30% kept out of training:"
        )
        print(format_rows(published_rows(frame, args.seeds)))


if __name__ == "__main__":
    main()
