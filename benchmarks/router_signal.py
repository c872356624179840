"""How much the router can know about a request beyond its suite: the ceiling on its savings.

For each set under --data, the training split is fitted the way `routeopt train` fits it, and
its cross-fitted (out-of-fold) pass probabilities are read as the knob reads them. Prints

- per suite, the out-of-fold AUC of every candidate's predicted pass probability against its
  outcome within that suite and cross-fitting fold, averaged over folds (0.5: the text tells
  nothing beyond the suite's average; the reference candidate's is shown apart). Pooled over
  folds the AUC would read below 0.5 on noise: each fold's suite mean is estimated from the
  other folds, so within a sample it moves against the fold's own, and
- per set, the reference (best single) candidate's pass rate beside the best pass rate any
  knob member reaches on the same requests, and the least cost (over the reference's) at
  which the knob's hull of members reaches the reference's pass rate on them.

Where no member passes more often than the reference on cross-fitted data, no certified point
can save anything at the reference's quality (S100 = 0 through the knob), however the
certificate is made.

    OMP_NUM_THREADS=1 python benchmarks/router_signal.py [--data ../shared/data] [--sets routerbench] [--embeddings]
"""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from routeopt.evals.storage.importer import training_frame_of  # noqa: E402
from router_data import data_dir  # noqa: E402
from routeopt.router_training.evaluation import metrics as M  # noqa: E402
from routeopt.router_training.fit.data import routing_data  # noqa: E402
from routeopt.router_training.fit.knob_fitting import _members  # noqa: E402
from routeopt.router_training.train import fit_calibrated  # noqa: E402


def _auc(y: np.ndarray, p: np.ndarray) -> float:
    ok = ~np.isnan(y)
    label = y[ok] > 0.5
    return float(roc_auc_score(label, p[ok])) if 0 < label.sum() < len(label) else np.nan


def within_suite_auc(
    P: np.ndarray, Y: np.ndarray, suites: np.ndarray, folds: np.ndarray
) -> dict[str, np.ndarray]:
    """Suite -> per-candidate AUC of P against Y > 0.5, the mean over folds of the AUC on that
    suite's requests in the fold (NaN where no fold has both classes)."""
    out = {}
    for s in np.unique(suites):
        per_fold = [
            [_auc(Y[rows, j], P[rows, j]) for j in range(Y.shape[1])]
            for f in np.unique(folds)
            if (rows := (suites == s) & (folds == f)).any()
        ]
        with warnings.catch_warnings():  # a candidate with one class in every fold: NaN, said once
            warnings.simplefilter("ignore", RuntimeWarning)
            out[str(s)] = np.nanmean(np.array(per_fold), axis=0) if per_fold else np.full(Y.shape[1], np.nan)
    return out


def report(name: str, data_path: Path, embeddings: bool = False) -> str:
    data = routing_data(training_frame_of(data_path))
    fitted = fit_calibrated(data, embeddings=embeddings)
    cal, ref = fitted.cal, fitted.ref
    suites = np.array([s or "" for s in data.suites])
    lines = [
        f"== {name}: {len(data)} training requests, {len(data.candidates)} candidates; "
        f"reference {data.candidates[ref]}",
        f"{'suite':<28}{'n':>6}{'ref AUC':>9}{'median AUC':>12}{'max AUC':>9}",
    ]
    for s, aucs in within_suite_auc(cal.P, cal.Y, suites, fitted.folds).items():
        n = int((suites == s).sum())
        lines.append(f"{s[:27]:<28}{n:6d}{aucs[ref]:9.3f}{np.nanmedian(aucs):12.3f}{np.nanmax(aucs):9.3f}")
    Y, C = cal.filled()
    _, choices = _members(cal, ref)
    rows = np.arange(len(Y))
    q, c = Y[rows, choices].mean(1), C[rows, choices].mean(1)
    hc, hq = M.frontier(c, q)
    ref_q, ref_c = q[0], c[0]  # member 0 always calls the reference
    best_other = np.delete(q, 0).max() if len(q) > 1 else np.nan
    at_ref = M.cost_at_quality(hc, hq, ref_q) / ref_c
    lines.append(
        f"cross-fitted pass rate: reference {ref_q:.4f}, best other member {best_other:.4f}; "
        f"the members' hull reaches the reference's at {at_ref:.3f} of its cost"
    )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, default=data_dir())
    ap.add_argument("--sets", default="", help="Comma-separated set names (default: all).")
    ap.add_argument(
        "--embeddings",
        action="store_true",
        help="Add MiniLM sentence embeddings to the features (the 'embeddings' extra), "
        "as `routeopt train --embeddings` does.",
    )
    args = ap.parse_args()
    names = [s for s in args.sets.split(",") if s] or sorted(
        d.name for d in args.data.iterdir() if (d / "train.parquet").is_file()
    )
    for name in names:
        print(report(name, args.data / name / "train.parquet", args.embeddings), flush=True)


if __name__ == "__main__":
    main()
