"""Choose router design by cross-validation on the training splits only (never the test splits).

For every set under --data (sub-folders with train.parquet), the training split goes through
`routeopt import outcomes` into a temporary store exactly as a user's would; its requests are
cut into --folds folds; for each fold and each design variant a policy is trained as
`routeopt train` trains it (held-out fraction 0.3 and all) on the other folds, and its knob is
measured on the fold at the user targets, beside the reference trained on the same requests.

    OMP_NUM_THREADS=1 python benchmarks/router_design_cv.py --variant base: \
        --variant topics32:text_rank=32 --variant conf95:confidence=0.95 [--sets routerbench,...]

A variant is NAME:key=value,key=value with keys of routeopt.router_training.train.Design,
`confidence`, `holdout`, `refit` or `embeddings` (as `routeopt train --holdout-fraction`,
`--no-refit`, `--embeddings` take them). Prints per set and variant the fold means of S100 /
S95 / AIQ (S100 'never' counts as 0 in the mean and is counted apart), checks passed, promise
held, and top-best: the pass rate at the highest target (what the knob serves where nothing is
certified) minus the best single's.

With `--shift`, each held-out fold is also shifted the project's own ways
(`routeopt.router_training.evaluation.shifts`: harder by the plain reference's difficulty learned on the other
folds, another suite mix, longer prompts), and each variant is measured there twice: as trained
(`default`) and trained again with a certificate toward the shifted fold's prompts (`traffic`,
as `routeopt train --traffic`). Per shift and variant it prints the shift checks (pass rate at
0.8 / 0.9 / 0.95 >= x * best - 0.015, at 1.0 >= best - 0.01, best single on the shifted fold)
and the fold means of S95.
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routeopt.evals.storage.importer import training_frame_of  # noqa: E402
from router_data import data_dir  # noqa: E402
from routeopt.router_training.evaluation.baselines import ReferenceRouter  # noqa: E402
from routeopt.router_training.evaluation.bench import knob_choices, knob_info, measure, scoring_data  # noqa: E402
from routeopt.router_training.fit.data import routing_data  # noqa: E402
from routeopt.router_training.policy.embeddings import reuse_embeddings  # noqa: E402
from routeopt.router_training.fit.knob_fitting import DEFAULT_CONFIDENCE  # noqa: E402
from routeopt.router_training.train import Design, train_router  # noqa: E402


def parse_variant(text: str) -> tuple[str, dict, dict]:
    """(name, Design fields, other train_router keywords) of NAME:key=value,..."""
    name, _, spec = text.partition(":")
    fields = {f.name: f.type for f in dataclasses.fields(Design)}
    design: dict = {}
    options = {"confidence": DEFAULT_CONFIDENCE}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        if key == "confidence":
            options["confidence"] = float(value)
        elif key == "holdout":
            options["holdout_fraction"] = float(value)
        elif key == "refit":
            options["refit"] = value.lower() in ("1", "true", "yes")
        elif key == "embeddings":
            options["embeddings"] = value.lower() in ("1", "true", "yes")
        elif key in fields:
            design[key] = (
                type(getattr(Design(), key))(value)
                if not isinstance(getattr(Design(), key), bool)
                else value.lower() in ("1", "true", "yes")
            )
        else:
            raise SystemExit(
                f"unknown design key {key!r}; use confidence, holdout, refit, embeddings or one of "
                f"{sorted(fields)}"
            )
    return name or "base", design, options


def folds_of(frame: pd.DataFrame, k: int, seed: int = 0) -> dict[str, int]:
    """Request id -> fold, a random permutation within each suite."""
    rng = np.random.default_rng(seed)
    first = frame.drop_duplicates("request_id")[["request_id", "suite"]].sort_values("request_id")
    out: dict[str, int] = {}
    for _, grp in first.groupby("suite", sort=True):
        ids = grp["request_id"].to_numpy()[rng.permutation(len(grp))]
        out.update({r: i % k for i, r in enumerate(ids)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--sets", default="", help="Comma-separated set names (default: all).")
    ap.add_argument("--folds", type=int, default=4)
    ap.add_argument(
        "--repeats",
        type=int,
        default=1,
        help="Repeat the CV with this many fold assignments (seeds 0, 1, ...): fold means "
        "of a few thousand requests move by a few points between assignments.",
    )
    ap.add_argument("--variant", action="append", default=[], help="NAME:key=value,... (repeatable)")
    ap.add_argument(
        "--one-suite",
        action="store_true",
        help="Give every request the same suite label (as one kept-back set has).",
    )
    ap.add_argument(
        "--shift",
        action="store_true",
        help="Also measure every variant on shifted folds, as trained and certified toward them.",
    )
    args = ap.parse_args()
    variants = [parse_variant(v) for v in (args.variant or ["base:"])]
    names = [s for s in args.sets.split(",") if s] or sorted(
        d.name for d in args.data.iterdir() if (d / "train.parquet").is_file()
    )
    with reuse_embeddings():  # a prompt is embedded once for all folds and variants
        for set_name in names:
            run_set(args, set_name, variants)


def run_set(args: argparse.Namespace, set_name: str, variants: list[tuple[str, dict, dict]]) -> None:
    """Every variant on every fold of one set's training split; prints the set's table."""
    frame = training_frame_of(args.data / set_name / "train.parquet")
    if args.one_suite:
        frame = frame.assign(suite="all")
    results: dict[str, list[dict]] = {v[0]: [] for v in variants}
    shifted: dict[tuple[str, str, str], list[dict]] = {}
    for repeat, f in itertools.product(range(args.repeats), range(args.folds)):
        fold = frame["request_id"].map(folds_of(frame, args.folds, seed=repeat))
        fit_frame, eval_frame = frame[fold != f], frame[fold == f]
        fit_data = routing_data(fit_frame)
        reference = ReferenceRouter().fit(fit_data)
        for vname, design, options in variants:
            start = time.perf_counter()
            policy = train_router(fit_frame, design=Design(**design), **options).policy
            seconds = time.perf_counter() - start
            test = scoring_data(eval_frame, policy.candidates)
            rep = measure(knob_choices(policy, test), test, fit_data, reference, knob=knob_info(policy))
            rep["seconds"] = seconds
            results[vname].append(rep)
            if args.shift:
                for key, r in shifted_folds(fit_frame, fit_data, test, reference, policy, design, options):
                    shifted.setdefault((vname, *key), []).append(r)
    label = " (one suite label)" if args.one_suite else ""
    times = f", {args.repeats} fold assignments" if args.repeats > 1 else ""
    print(f"== {set_name}{label} ({args.folds}-fold CV on the training split{times})")
    print(summarise_variants(results))
    if shifted:
        print(summarise_shifts(shifted))
    sys.stdout.flush()


def shifted_folds(
    fit_frame: pd.DataFrame, fit_data, test, reference: ReferenceRouter, policy, design: dict, options: dict
):
    """((shift, 'default' | 'traffic'), report) on each shift of one held-out fold."""
    from routeopt.router_training.fit.certificate import Certificate, TrafficSample
    from routeopt.router_training.evaluation.shift_bench import difficulty, shift_checks
    from routeopt.router_training.evaluation.shifts import SHIFTS, shifted

    hardness = difficulty(reference, test)
    for name in SHIFTS:
        s = shifted(name, test, hardness)
        if s is None:
            continue
        sub = test.subset(s.keep)
        sample = TrafficSample.of_prompts(list(sub.prompts), list(sub.suites), source=f"shift {name}")
        toward = train_router(
            fit_frame, design=Design(**design), certificate=Certificate(traffic=sample), **options
        ).policy
        for label, pol in (("default", policy), ("traffic", toward)):
            rep = measure(knob_choices(pol, sub), sub, fit_data, knob=knob_info(pol), best_on="test")
            rep["checks"] = shift_checks(rep)
            yield (name, label), rep


def summarise_shifts(shifted: dict[tuple[str, str, str], list[dict]]) -> str:
    """Per (variant, shift, certificate): checks passed over folds and the fold mean of S95."""
    lines = [f"{'variant':<14}{'shift':<8}{'cert':<9}{'checks':>9}{'S95':>7}{'pass@.95-floor':>16}"]
    for (vname, shift, label), reps in shifted.items():
        ok, n = sum(sum(r["checks"].values()) for r in reps), sum(len(r["checks"]) for r in reps)
        s95 = np.nan_to_num([r["table"]["knob"]["savings_at_95"] for r in reps]).mean()
        gap = np.mean(
            [t["pass_rate"] - t["floor"] for r in reps for t in r["targets"] if t["target"] == 0.95]
        )
        lines.append(f"{vname:<14}{shift:<8}{label:<9}{ok:5d}/{n:<3d}{s95:7.3f}{gap:16.4f}")
    return "\n".join(lines)


def summarise_variants(results: dict[str, list[dict]]) -> str:
    head = (
        f"{'variant':<14}{'S100':>7}{'never':>6}{'S95':>7}{'AIQ':>7}{'refS100':>8}{'refS95':>7}"
        f"{'refAIQ':>7}{'zeroAIQ':>8}{'checks':>8}{'held':>7}{'top-best':>9}{'train s':>8}"
    )
    lines = [head]
    for name, reps in results.items():
        col = lambda row, key: np.array([r["table"][row][key] for r in reps], dtype=float)
        s100 = col("knob", "savings_at_best")
        r100 = col("reference", "savings_at_best")
        checks = sum(sum(r["checks"].values()) for r in reps), sum(len(r["checks"]) for r in reps)
        top_gap = [r["targets"][-1]["pass_rate"] - r["best_single"]["pass_rate"] for r in reps]
        held = sum(sum(t["held"] for t in r["targets"] if t["certified"]) for r in reps)
        promised = sum(sum(1 for t in r["targets"] if t["certified"]) for r in reps)
        lines.append(
            f"{name:<14}{np.nan_to_num(s100).mean():7.3f}{int(np.isnan(s100).sum()):6d}"
            f"{np.nan_to_num(col('knob', 'savings_at_95')).mean():7.3f}{col('knob', 'aiq').mean():7.3f}"
            f"{np.nan_to_num(r100).mean():8.3f}{np.nan_to_num(col('reference', 'savings_at_95')).mean():7.3f}"
            f"{col('reference', 'aiq').mean():7.3f}{col('zero_router', 'aiq').mean():8.3f}"
            f"{checks[0]:4d}/{checks[1]:<3d}{held:3d}/{promised:<3d}{np.mean(top_gap):9.4f}"
            f"{np.mean([r['seconds'] for r in reps]):8.1f}"
        )
        failed: dict[str, int] = {}
        for r in reps:
            for key, ok in r["checks"].items():
                failed[key] = failed.get(key, 0) + (not ok)
        if any(failed.values()):
            lines.append("    failed: " + "; ".join(f"{k} x{v}" for k, v in failed.items() if v))
    return "\n".join(lines)


if __name__ == "__main__":
    main()
