"""The incremental night on a simulated stable fleet over a week (`reuse` in routeopt.yaml).

Each seed: 4 candidates x 3 suites of `--items` items. A candidate's outcome on an item is a
draw with a per-item pass probability of 0.985 or 0.015 (pass rates about 0.5 to 0.8; a stable
model's outcome flips from one measurement to the next about 1.5% of the time each way). Night
0 measures everything; nights 1..7 each add `--new` items per suite and run the real planner
(`routeopt.evals.execution.reuse`: carry forward, drift sample, McNemar check, re-measure) on a
real store; only the items the planner leaves unmeasured are not drawn. On night `--drop-night`
one candidate loses 5 points of pass rate (items it passed now fail).

Figures: measured items per night as a share of a full night (cost: every call is priced
alike), the share of seeds where the drop is caught that night, the share of seeds where no
stable candidate is ever flagged during the week.

    python benchmarks/incremental_night.py --seeds 20 --items 1000 --json out.json
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routeopt.evals.config import Candidate, ReuseSettings  # noqa: E402
from routeopt.evals.execution.reuse import check_drift, plan_night, remeasure, sample_size, stamp_keys  # noqa: E402
from routeopt.evals.storage.store import Outcome, Store  # noqa: E402
from routeopt.evals.suite.spec import load_suite  # noqa: E402
from tests.fake_llm import write_arithmetic_suite  # noqa: E402

NAMES = ("a", "b", "c", "drifter")
SUITES = ("s1", "s2", "s3")


def _candidates() -> list[Candidate]:
    return [
        Candidate(
            name=n,
            provider="openai",
            model=f"m-{n}",
            base_url="http://127.0.0.1:9/v1",
            input_price_per_mtok=1.0,
            output_price_per_mtok=2.0,
        )
        for n in NAMES
    ]


def one_seed(
    seed: int, items: int, new: int, nights: int, drop_night: int, settings: ReuseSettings, work: Path
) -> dict:
    rng = random.Random(seed)
    cands = _candidates()
    rate = {c.name: rng.uniform(0.5, 0.8) for c in cands}
    q: dict[tuple[str, str, str], float] = {}

    def prob(c: str, suite: str, item: str) -> float:
        if (c, suite, item) not in q:
            q[(c, suite, item)] = 0.985 if rng.random() < rate[c] else 0.015
        return q[(c, suite, item)]

    store = Store(work / f"seed{seed}.duckdb")
    start = datetime(2026, 1, 1, 2, tzinfo=timezone.utc)
    out = {"share": [], "caught": None, "false_flags": 0, "flags": []}
    for night in range(nights + 1):
        n = items + night * new
        suites = [
            load_suite(write_arithmetic_suite(work / f"seed{seed}" / f"n{night}", n, name=s)) for s in SUITES
        ]
        if night == drop_night:  # 5 points of the drifter's pass rate: passed items now fail
            keys = [k for k, v in q.items() if k[0] == "drifter" and v > 0.5]
            total = sum(1 for k in q if k[0] == "drifter")
            for k in rng.sample(keys, round(0.05 * total)):
                q[k] = 0.015
        run_id = f"night-{night}"
        now = start + timedelta(days=night)
        store.begin_run(run_id, candidates=[c.public_dict() for c in cands])
        store.write("UPDATE runs SET started_at = ? WHERE run_id = ?", [(now, run_id)])
        if night:
            plan_night(store, run_id, suites, cands, settings, now=now)
        measured = _measure(store, run_id, suites, cands, prob, now)
        stamp_keys(store, run_id, suites, cands)
        if night:
            drifts = check_drift(store, run_id, settings, [c.name for c in cands])
            flagged = [d.candidate for d in drifts if d.flagged]
            for name in flagged:
                remeasure(store, run_id, name)
            measured += _measure(store, run_id, suites, cands, prob, now)
            stamp_keys(store, run_id, suites, cands)
            out["share"].append(measured / (len(cands) * len(SUITES) * n))
            out["flags"].append(flagged)
            if night == drop_night:
                out["caught"] = "drifter" in flagged
            out["false_flags"] += sum(1 for f in flagged if f != "drifter")
        store.finish_run(run_id)
    store.close()
    return out


def _measure(store: Store, run_id: str, suites: list, cands: list[Candidate], prob, now) -> int:
    """Draw an outcome for every item the run has no row for (what the flow would call)."""
    rows = []
    for s in suites:
        for c in cands:
            done = store.done_items(run_id, s.name, c.name)
            for it in s.items:
                if it.id not in done:
                    rows.append(
                        Outcome(
                            run_id,
                            s.name,
                            s.version,
                            it.id,
                            c.name,
                            passed=random.random() < prob(c.name, s.name, it.id),
                            cost_usd=1e-4,
                            created_at=now,
                            measured_at=now,
                        )
                    )
    store.write_outcomes(rows)
    return len(rows)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--new", type=int, default=5)
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--drop-night", type=int, default=4)
    ap.add_argument("--max-age-days", type=float, default=14)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    settings = ReuseSettings(max_age_days=a.max_age_days)
    n = sample_size(settings, len(NAMES))
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            random.seed(seed)
            results.append(one_seed(seed, a.items, a.new, a.nights, a.drop_night, settings, Path(tmp)))
    shares = [s for r in results for s in r["share"]]
    quiet = [s for r in results for s, f in zip(r["share"], r["flags"]) if not f]
    caught = sum(bool(r["caught"]) for r in results)
    clean = sum(r["false_flags"] == 0 for r in results)
    summary = {
        "seeds": a.seeds,
        "items_per_pair": a.items,
        "sample_per_candidate": n,
        "settings": settings.model_dump(),
        "mean_share": sum(shares) / len(shares),
        "max_share": max(shares),
        "quiet_mean_share": sum(quiet) / len(quiet),
        "caught": caught,
        "clean": clean,
        "wall_s": time.perf_counter() - started,
    }
    print(
        f"drift sample: {n} items per candidate (drop {settings.detectable_drop}, power "
        f"{settings.power}, alpha {settings.alpha} over {len(NAMES)} candidates)"
    )
    print(
        f"measured per night vs a full night: mean {summary['mean_share']:.3f}, max "
        f"{summary['max_share']:.3f} (nights 1..{a.nights}, {a.seeds} seeds); nights without "
        f"drift {summary['quiet_mean_share']:.3f}"
    )
    print(f"5-point drop caught the night it happened: {caught} of {a.seeds} seeds")
    print(f"no stable candidate flagged all week: {clean} of {a.seeds} seeds")
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "seeds": results}, indent=1, default=str))


if __name__ == "__main__":
    main()
