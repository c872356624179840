"""Can a router trained on the training split meet the shift check at target 1.0 on the suite shift?

The check asks the pass rate at 1.0 to be at least the best single candidate's on the shifted
test requests minus 0.01. The `suites` shift (`routeopt.router_training.evaluation.shifts`, seed 0, as `routeopt
bench router --shift` makes it) keeps test requests with a probability set by their suite
alone, so within a suite they are drawn like the rest of the test split. What the training
split can tell a router about that traffic is then each suite's pass rates weighted by the
traffic's suite mix; a router that knew the mix exactly would call that mix's best candidate
the best. Per shared set, unshifted and shifted, this prints: the best single on the test
requests; the best by the training split under their suite mix; that candidate's pass rate on
the test requests; and whether serving it meets the check. Where it does not, the two splits
disagree on who is best for that traffic, and no certificate computed from the training split
can follow the test split there. `share` is how often serving it meets the check over 2,000
bootstrap resamples of those test requests: how much of a verdict at that n is the draw.
(The `hard` and `long` shifts move other covariates than the suite, so the suite mix alone
does not say what the training split knows of them; they are left out.)

    python benchmarks/shift_top_attainable.py [--data ../shared/data] [--sets alpacaeval,...]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import pandas as pd

from router_data import data_dir
from routeopt.router_training.evaluation.bench import CHECKED, scoring_data
from routeopt.router_training.fit.data import routing_data
from routeopt.router_training.evaluation.shifts import shifted

TOLERANCE = CHECKED[1.0]  # the check at target 1.0: best - 0.01


def suite_mix_best(train, suites: list) -> tuple[int, np.ndarray]:
    """The candidate with the best training pass rate under the given requests' suite mix."""
    mix = pd.Series([s or "" for s in suites]).value_counts(normalize=True)
    train_suites = np.array([s or "" for s in train.suites], dtype=object)
    rate = np.zeros(len(train.candidates))
    for suite, share in mix.items():
        rows = train_suites == suite
        if rows.any():
            rate += share * np.nanmean(train.Y[rows], axis=0)
    return int(np.argmax(rate)), rate


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--sets", default="routerbench,alpacaeval,openllm_bbh")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    print(
        f"{'set':<12} {'shift':<7} {'n':>5}  {'best on these test requests':<34} {'best by training, suite mix':<34} "
        f"{'its test pass':>13}  check  share"
    )
    for name in a.sets.split(","):
        train = routing_data(pd.read_parquet(a.data / name / "train.parquet"))
        test = scoring_data(pd.read_parquet(a.data / name / "test.parquet"), train.candidates)
        for shift in ("none", "suites"):
            keep = (
                np.arange(len(test))
                if shift == "none"
                else getattr(shifted(shift, test, seed=a.seed), "keep", None)
            )
            if keep is None:
                continue
            sub = test.subset(keep)
            rates = sub.Y.mean(axis=0)
            best = int(np.argmax(rates))
            pick, train_rate = suite_mix_best(train, sub.suites)
            ok = rates[pick] >= rates[best] - TOLERANCE
            draws = rng.integers(0, len(sub), size=(2000, len(sub)))
            boot = sub.Y[draws].mean(axis=1)  # (2000, K)
            share = float(np.mean(boot[:, pick] >= boot.max(axis=1) - TOLERANCE))
            print(
                f"{name:<12} {shift:<7} {len(sub):>5}  {train.candidates[best][:26]:<26} {rates[best]:.3f}   "
                f"{train.candidates[pick][:26]:<26} {train_rate[pick]:.3f}   {rates[pick]:>13.3f}  "
                f"{'holds' if ok else 'MISS ':<5}  {share:.2f}"
            )


if __name__ == "__main__":
    main()
