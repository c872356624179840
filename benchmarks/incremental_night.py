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

`--router`: items the router can learn from, and after the last night two routers. Each item
has a hidden difficulty d in [0, 1) per suite; a candidate passes it (probability 0.985, else
0.015) when d + noise is below its own pass rate there (noise N(0, 0.1) per candidate and
item), and its prompt carries four words, each from its tenth of the difficulty scale with
probability 0.8, else from a random tenth. Candidates are priced by their pass rate (the best
10 times the worst). After the last night, `train_router` fits (a) the frame the nightly trains
on (`Store.latest_frame` of that night: carried-forward rows included) and (b) a full night of
the same items drawn afresh from the same per-item probabilities. Figures per split seed:
each router's own held-out report, both routers scored on the full night's held-out outcomes,
and on the held-out items' true pass probabilities (no draw noise).

    python benchmarks/incremental_night.py --seeds 20 --items 1000 --json out.json
    python benchmarks/incremental_night.py --seeds 3 --items 300 --router --json router.json
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

import numpy as np  # noqa: E402

from routeopt.evals.config import Candidate, ReuseSettings  # noqa: E402
from routeopt.evals.execution.reuse import check_drift, plan_night, remeasure, sample_size, stamp_keys  # noqa: E402
from routeopt.evals.storage.store import Outcome, Store  # noqa: E402
from routeopt.evals.suite.spec import Suite, load_suite  # noqa: E402
from routeopt.router_training.fit.data import routing_data  # noqa: E402
from routeopt.router_training.train import promise_report, train_router  # noqa: E402
from tests.fake_llm import write_arithmetic_suite  # noqa: E402

NAMES = ("a", "b", "c", "drifter")
SUITES = ("s1", "s2", "s3")


LEVELS = 10  # the difficulty scale's tenths, each with its own words
WORDS = 8
TARGETS = (0.9, 0.95)


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


def _difficulty(seed: int, suite: str, item_id: str) -> float:
    return random.Random(f"{seed}/{suite}/{item_id}").random()


def _word(level: int, k: int) -> str:
    """A made-up word of its own for each (tenth of the scale, k)."""
    r = random.Random(level * WORDS + k)
    return "".join(r.choice("bdfgklmnprstvz") + r.choice("aeiou") for _ in range(3))


def _words(seed: int, suite: str, i: int) -> str:
    """Four words of item i's prompt: its difficulty's tenth, with probability 0.8 each."""
    level = int(_difficulty(seed, suite, f"q{i:05d}") * LEVELS)
    r = random.Random(f"{seed}/{suite}/{i}/words")
    return " ".join(
        _word(level if r.random() < 0.8 else r.randrange(LEVELS), r.randrange(WORDS)) for _ in range(4)
    )


def _register(store: Store, suites: list[Suite]) -> None:
    for s in suites:
        items = ((it.id, s.prompt_text(it), it.fields) for it in s.items)
        store.register_suite(s.name, s.version, s.spec.model_dump(mode="json"), items)


def one_seed(
    seed: int,
    items: int,
    new: int,
    nights: int,
    drop_night: int,
    settings: ReuseSettings,
    work: Path,
    split_seeds: int = 0,
) -> dict:
    rng = random.Random(seed)
    cands = _candidates()
    rate = {c.name: rng.uniform(0.5, 0.8) for c in cands}
    price = {c: 1e-4 * 10 ** ((r - 0.5) / 0.3) for c, r in rate.items()}
    skill = (
        {(c.name, s): rate[c.name] + rng.uniform(-0.1, 0.1) for c in cands for s in SUITES}
        if split_seeds
        else {}
    )
    q: dict[tuple[str, str, str], float] = {}

    def prob(c: str, suite: str, item: str) -> float:
        if (c, suite, item) not in q:
            if split_seeds:
                hit = _difficulty(seed, suite, item) + rng.gauss(0, 0.1) < skill[(c, suite)]
            else:
                hit = rng.random() < rate[c]
            q[(c, suite, item)] = 0.985 if hit else 0.015
        return q[(c, suite, item)]

    store = Store(work / f"seed{seed}.duckdb")
    start = datetime(2026, 1, 1, 2, tzinfo=timezone.utc)
    out: dict = {"share": [], "caught": None, "false_flags": 0, "flags": []}
    for night in range(nights + 1):
        n = items + night * new
        words = (lambda s: lambda i: _words(seed, s, i)) if split_seeds else (lambda s: None)
        suites = [
            load_suite(write_arithmetic_suite(work / f"seed{seed}" / f"n{night}", n, name=s, tags=words(s)))
            for s in SUITES
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
        _register(store, suites)
        if night:
            plan_night(store, run_id, suites, cands, settings, now=now)
        measured = _measure(store, run_id, suites, cands, prob, price, now)
        stamp_keys(store, run_id, suites, cands)
        if night:
            drifts = check_drift(store, run_id, settings, [c.name for c in cands])
            flagged = [d.candidate for d in drifts if d.flagged]
            for name in flagged:
                remeasure(store, run_id, name)
            measured += _measure(store, run_id, suites, cands, prob, price, now)
            stamp_keys(store, run_id, suites, cands)
            out["share"].append(measured / (len(cands) * len(SUITES) * n))
            out["flags"].append(flagged)
            if night == drop_night:
                out["caught"] = "drifter" in flagged
            out["false_flags"] += sum(1 for f in flagged if f != "drifter")
        store.finish_run(run_id)
    if split_seeds:
        when = start + timedelta(days=nights, hours=1)
        out["router"] = _routers(store, f"night-{nights}", suites, cands, prob, price, q, when, split_seeds)
    store.close()
    return out


def _measure(store: Store, run_id: str, suites: list, cands: list[Candidate], prob, price, now) -> int:
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
                            cost_usd=price[c.name],
                            created_at=now,
                            measured_at=now,
                        )
                    )
    store.write_outcomes(rows)
    return len(rows)


def _routers(
    store: Store, last: str, suites: list, cands: list, prob, price, q, when, split_seeds: int
) -> dict:
    """Train on the last night's frame and on a full night drawn afresh; score both."""
    names = [c.name for c in cands]
    inc = store.latest_frame(last, candidates=names, max_age_days=7)
    carried = store.query(
        "SELECT count(*) FILTER (WHERE call_mode = 'carried') AS c, count(*) AS n FROM outcomes WHERE run_id = ?",
        [last],
    )
    store.begin_run("full-night", candidates=[c.public_dict() for c in cands])
    store.write("UPDATE runs SET started_at = ? WHERE run_id = ?", [(when, "full-night")])
    _measure(store, "full-night", suites, cands, prob, price, when)
    store.finish_run("full-night")
    full = store.latest_frame("full-night", candidates=names, max_age_days=7)
    fresh = routing_data(full)
    truth = lambda rid, c: q[(c, *rid.split("/", 1))]  # noqa: E731
    out: dict = {
        "carried_share": float(carried.c[0] / carried.n[0]),
        "rows": [len(inc), len(full)],
        "splits": [],
    }
    for k in range(split_seeds):
        split: dict = {}
        for label, frame in (("carried", inc), ("full", full)):
            res = train_router(frame, seed=k, refit=False)
            test_ids = set(res.split["test"])
            test = fresh.subset(np.array([i for i, r in enumerate(fresh.request_ids) if r in test_ids]))
            split[label] = {
                "own": _own(res.metrics["holdout"]),
                "fresh": _scored(res.evaluated, test, truth),
                "test": sorted(test_ids),
            }
        split["same_test"] = split["carried"].pop("test") == split["full"].pop("test")
        out["splits"].append(split)
    return out


def _own(h: dict) -> dict:
    """The figures of train_router's held-out report this benchmark compares."""
    promise = {r["target"]: r for r in h["promise"]["targets"]}
    return {
        "aiq": h["table"]["router"]["aiq"],
        "pass_rate": h["router_at_target"]["pass_rate"],
        "cost": h["router_at_target"]["cost"],
        "held": {x: promise[x]["held"] for x in TARGETS},
        "best_single": h["best_single"],
    }


def _scored(policy, test, truth) -> dict:
    """The policy on the full night's held-out outcomes, and on their true pass probabilities."""
    report = {r["target"]: r for r in promise_report(policy, test, TARGETS)["targets"]}
    full = test.align(policy.candidates).complete()
    P, Cp = policy.predict(full.prompts, full.suites)
    out = {}
    for x in TARGETS:
        pick = policy.select(P, Cp, full.prompts, full.suites, x)[0]
        chosen = [policy.candidates[j] for j in pick]
        out[x] = {
            "pass_rate": report[x]["pass_rate"],
            "cost": report[x]["cost"],
            "held": report[x]["held"],
            "true_pass": float(np.mean([truth(r, c) for r, c in zip(full.request_ids, chosen)])),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=20)
    ap.add_argument("--items", type=int, default=1000)
    ap.add_argument("--new", type=int, default=5)
    ap.add_argument("--nights", type=int, default=7)
    ap.add_argument("--drop-night", type=int, default=4)
    ap.add_argument("--max-age-days", type=float, default=14)
    ap.add_argument(
        "--router", action="store_true", help="items with learnable prompts; two routers at the end"
    )
    ap.add_argument("--split-seeds", type=int, default=3, help="train_router split seeds per seed (--router)")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args()
    settings = ReuseSettings(max_age_days=a.max_age_days)
    n = sample_size(settings, len(NAMES))
    started = time.perf_counter()
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in range(a.seeds):
            random.seed(seed)
            splits = a.split_seeds if a.router else 0
            results.append(
                one_seed(seed, a.items, a.new, a.nights, a.drop_night, settings, Path(tmp), splits)
            )
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
    if a.router:
        summary["router"] = _router_summary(results)
    if a.json:
        a.json.write_text(json.dumps({"summary": summary, "seeds": results}, indent=1, default=str))


def _router_summary(results: list[dict]) -> dict:
    """Per figure: the carried-forward router, the full night's, and their paired difference:
    its mean, standard deviation over every (seed, split seed), and standard error over seeds
    (a seed's split seeds share its outcomes, so they are not independent)."""
    pairs = [(seed, sp) for seed, r in enumerate(results) for sp in r["router"]["splits"]]
    figures = {"own AIQ": lambda r: r["own"]["aiq"], "own pass @ 0.95": lambda r: r["own"]["pass_rate"]}
    figures["own cost @ 0.95"] = lambda r: r["own"]["cost"]
    for x in TARGETS:
        figures[f"fresh pass @ {x}"] = lambda r, x=x: r["fresh"][x]["pass_rate"]
        figures[f"true pass @ {x}"] = lambda r, x=x: r["fresh"][x]["true_pass"]
        figures[f"fresh cost @ {x}"] = lambda r, x=x: r["fresh"][x]["cost"]
    out: dict = {
        "runs": len(pairs),
        "carried_share": float(np.mean([r["router"]["carried_share"] for r in results])),
        "same_test": sum(sp["same_test"] for _, sp in pairs),
    }
    print(
        f"router after night {len(results[0]['share'])}: {len(pairs)} trainings each "
        f"({len(results)} seeds x {len(pairs) // len(results)} split seeds); carried-forward rows "
        f"{out['carried_share']:.1%} of the last night's; same held-out items {out['same_test']}/{len(pairs)}"
    )
    print(f"{'figure':<20} {'carried':>10} {'full':>10} {'carried - full':>16} {'(sd; se over seeds)':>22}")
    for name, get in figures.items():
        c = np.array([[get(sp["carried"]) for sp in r["router"]["splits"]] for r in results])
        f = np.array([[get(sp["full"]) for sp in r["router"]["splits"]] for r in results])
        d = c - f
        se = d.mean(axis=1).std(ddof=1) / np.sqrt(len(results)) if len(results) > 1 else float("nan")
        sd = d.std(ddof=1) if d.size > 1 else float("nan")
        out[name] = {"carried": c.mean(), "full": f.mean(), "diff": d.mean(), "diff_sd": sd, "diff_se": se}
        print(
            f"{name:<20} {c.mean():>10.4g} {f.mean():>10.4g} {d.mean():>+16.4g} {f'({sd:.2g}; {se:.2g})':>22}"
        )
    for x in TARGETS:
        held = [sum(sp[k]["fresh"][x]["held"] for _, sp in pairs) for k in ("carried", "full")]
        out[f"held on fresh @ {x}"] = held
        print(
            f"promise held on the full night's held-out outcomes @ {x}: carried {held[0]}, full {held[1]} of {len(pairs)}"
        )
    return out


if __name__ == "__main__":
    main()
