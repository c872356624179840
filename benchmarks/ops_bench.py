"""Operations figures on a synthetic nightly history: how long the after-run steps take.

A history of --runs nightly runs (2 suites x 3 candidates x --items items each) is written to a
temporary DuckDB; then, on the last run, it times drift detection, the HTML report, the Parquet
export of every run, and the spend budget's reserve+settle under 8 contending threads. It also
times `Store.write_outcomes` on one run's rows, the path every nightly run writes through.

    python benchmarks/ops_bench.py [--runs 30] [--items 200]

The last line holds every figure as key=value.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routeopt.evals.execution.budget import Budget  # noqa: E402
from routeopt.evals.storage.drift import detect_drift  # noqa: E402
from routeopt.evals.storage.export import export_parquet  # noqa: E402
from routeopt.evals.storage.store import Store  # noqa: E402
from routeopt.reports.dashboard import build_report  # noqa: E402
from tests.ops_history import Regression, _outcomes, make_history  # noqa: E402


def _timed(fn) -> tuple[float, object]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def budget_ops_per_s(threads: int = 8, per_thread: int = 20_000) -> float:
    """reserve+settle pairs per second with `threads` threads sharing one Budget."""
    budget = Budget(run_usd=1e9, per_candidate_usd={"c0": 1e9})

    def work(k: int) -> None:
        for _ in range(per_thread):
            budget.settle(budget.try_reserve(f"c{k % 3}", 1e-6), 5e-7)

    pool = [threading.Thread(target=work, args=(k,)) for k in range(threads)]
    start = time.perf_counter()
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    return threads * per_thread / (time.perf_counter() - start)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=30)
    ap.add_argument("--items", type=int, default=200)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="ops-bench-") as tmp:
        db = Path(tmp) / "db.duckdb"
        t_hist, _ = _timed(
            lambda: make_history(
                db, runs=args.runs, items=args.items, regressions=[Regression("mid", "arith", pass_rate=0.5)]
            )
        )
        last = f"run-{args.runs - 1:02d}"
        with Store(db, read_only=True) as store:
            rows = int(store.query("SELECT count(*) AS n FROM outcomes").n.iloc[0])
            t_drift, drift = _timed(lambda: detect_drift(store, last))
            t_report, _ = _timed(lambda: build_report(store, last, Path(tmp) / "r.html", drift=drift))
            t_export, res = _timed(lambda: export_parquet(store, Path(tmp) / "pq"))
        import numpy as np

        one_run = _outcomes("bench-write", np.random.default_rng(1), args.items, None, [])
        with Store(Path(tmp) / "w.duckdb") as store:
            store.begin_run("bench-write")
            t_write, _ = _timed(lambda: store.write_outcomes(one_run))
        ops = budget_ops_per_s()
        size_kb = (Path(tmp) / "r.html").stat().st_size / 1024
    print(f"history: {args.runs} runs, {rows} outcomes (written in {t_hist:.1f}s)")
    print(f"drift on the last run: {t_drift:.2f}s, {len(drift.regressions)} regressions")
    print(f"HTML report: {t_report:.2f}s, {size_kb:.0f} KiB")
    print(
        f"Parquet export of all runs: {t_export:.2f}s, {res.rows / t_export:,.0f} rows/s, {len(res.files)} files"
    )
    print(
        f"Store.write_outcomes: {len(one_run)} rows in {t_write:.2f}s = {len(one_run) / t_write:,.0f} rows/s"
    )
    print(f"Budget reserve+settle, 8 threads: {ops:,.0f} pairs/s")
    print(
        f"drift_s={t_drift:.3f} report_s={t_report:.3f} export_rows_per_s={res.rows / t_export:.0f} "
        f"store_write_rows_per_s={len(one_run) / t_write:.0f} budget_pairs_per_s={ops:.0f}"
    )


if __name__ == "__main__":
    main()
