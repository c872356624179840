"""Drift between a nightly run and the runs before it.

Per (candidate, suite) the current run is compared item by item with the previous runs of the
same suite version (each item's latest outcome in the last `baseline_runs` runs): pass rate and
the candidate's error rate by the exact McNemar test on the discordant items, TTFT and latency
p95 by their relative change guarded by a one-sided Wilcoxon signed-rank test on the same
items, mean cost per call by its relative change, and list prices by any change. Pass labels
follow `routeopt.evals.storage.labels` (a candidate's error is a failure, errors on our side are left
out); times and costs come from calls answered in each run, never from replayed cache rows.
p-values are adjusted per metric family with Benjamini-Hochberg, since a fleet x suites grid
makes dozens of tests a night and some would otherwise fire by chance. `routeopt.reports.alerts`
sends the findings out.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Iterable, Literal

import numpy as np
import pandas as pd

from routeopt.common.io import jsonable
from routeopt.evals.config import AlertSettings
from routeopt.evals.storage.labels import label_frame
from routeopt.evals.storage.store import Store

Severity = Literal["regression", "improvement", "info"]
BLOCKING_METRICS = frozenset({"pass_rate", "error_rate", "latency_p95_s", "ttft_p95_s"})
PRICE_FIELDS = (
    "input_price_per_mtok",
    "cached_input_price_per_mtok",
    "output_price_per_mtok",
    "gpu_hour_usd",
)

OUTCOMES_SQL = """
SELECT o.run_id, r.started_at, o.candidate, o.suite, o.suite_version, o.item_id, o.passed,
       o.error_kind, o.cost_usd, o.ttft_s, o.latency_s, o.cached
FROM outcomes o JOIN runs r USING (run_id)
WHERE o.candidate IN (SELECT candidate FROM outcomes WHERE run_id = ?)
  AND r.started_at <= (SELECT started_at FROM runs WHERE run_id = ?)
  AND (o.run_id = ? OR r.status LIKE 'completed%')
"""


@dataclass
class DriftFinding:
    """One metric of one (candidate, suite) that moved beyond its threshold."""

    candidate: str
    suite: str
    metric: str
    severity: Severity
    baseline: float | None
    current: float | None
    change: float | None
    p_value: float | None = None
    q_value: float | None = None
    n_current: int = 0
    n_baseline: int = 0
    message: str = ""


@dataclass
class DriftReport:
    run_id: str
    baseline_runs: list[str] = field(default_factory=list)
    findings: list[DriftFinding] = field(default_factory=list)
    compared_pairs: int = 0

    @property
    def regressions(self) -> list[DriftFinding]:
        return [f for f in self.findings if f.severity == "regression"]

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values (inf and NaN become None)."""
        return jsonable(
            {
                "run_id": self.run_id,
                "baseline_runs": self.baseline_runs,
                "compared_pairs": self.compared_pairs,
                "findings": [asdict(f) for f in self.findings],
            }
        )


# -- tests and statistics --------------------------------------------------------------------


def mcnemar_p(worse: int, better: int) -> float:
    """Exact McNemar test: two-sided binomial p-value of the discordant pairs (items that
    passed before and fail now, vs the reverse) under 'no change'."""
    from scipy.stats import binomtest

    if worse + better == 0:
        return 1.0
    return float(binomtest(worse, worse + better, 0.5).pvalue)


def greater_p(current: np.ndarray, baseline: np.ndarray) -> float:
    """One-sided Wilcoxon signed-rank p-value that paired `current` values exceed `baseline`."""
    from scipy.stats import wilcoxon

    diff = np.asarray(current, float) - np.asarray(baseline, float)
    if not np.any(diff != 0):
        return 1.0
    return float(wilcoxon(diff, alternative="greater").pvalue)


def bh_adjust(p_values: list[float]) -> list[float]:
    """Benjamini-Hochberg q-values (the false discovery rate at which each test is significant)."""
    from scipy.stats import false_discovery_control

    if not p_values:
        return []
    return [float(q) for q in false_discovery_control(np.asarray(p_values, dtype=float))]


def _rel(current: float, baseline: float) -> float:
    if baseline == 0:
        return math.inf if current > 0 else 0.0
    return (current - baseline) / baseline


# -- comparing runs ---------------------------------------------------------------------------


def _load(store: Store, run_id: str) -> pd.DataFrame:
    known = store.query("SELECT 1 FROM runs WHERE run_id = ?", [run_id])
    if known.empty:
        raise KeyError(f"no run {run_id!r} in {store.path}")
    return store.query(OUTCOMES_SQL, [run_id, run_id, run_id])


def _baseline(frame: pd.DataFrame, run_id: str, n_runs: int) -> pd.DataFrame:
    """Per (candidate, suite, version): rows of the latest `n_runs` earlier runs that have it."""
    cur = frame[frame.run_id == run_id][["candidate", "suite", "suite_version"]].drop_duplicates()
    prev = frame[frame.run_id != run_id].merge(cur, on=["candidate", "suite", "suite_version"])
    if prev.empty:
        return prev
    runs = prev[["candidate", "suite", "run_id", "started_at"]].drop_duplicates()
    runs = runs.sort_values("started_at", ascending=False).groupby(["candidate", "suite"]).head(n_runs)
    return prev.merge(runs[["candidate", "suite", "run_id"]], on=["candidate", "suite", "run_id"])


PAIR = ["candidate", "suite"]
TIMED = (("latency_p95_s", "latency_s"), ("ttft_p95_s", "ttft_s"), ("cost_per_call_usd", "cost_usd"))


def _pairs(
    cur: pd.DataFrame, base: pd.DataFrame, usable: pd.Series, base_usable: pd.Series, cols: list[str]
) -> pd.DataFrame:
    """Per (candidate, suite), the items usable now and before, each with its latest usable
    baseline row: `cols` with suffixes _c and _b.

    Comparing the same items removes the variance of which items a run happened to have; taking
    each item's latest baseline run keeps an item that a cap or an outage skipped last night.
    """
    keep = [*PAIR, "item_id", *cols]
    before = base[base_usable].sort_values("started_at").groupby([*PAIR, "item_id"]).tail(1)
    return cur.loc[usable, keep].merge(before[keep], on=[*PAIR, "item_id"], suffixes=("_c", "_b"))


def _proportion_rows(cand: str, suite: str, pairs: pd.DataFrame) -> list[dict]:
    """Pass rate and the candidate's error rate on the same labelled items, McNemar-tested."""
    rows = []
    for metric, now, before, worse_up in (
        ("pass_rate", pairs.label_c, pairs.label_b, False),
        (
            "error_rate",
            pairs.error_kind_c.notna().astype(float),
            pairs.error_kind_b.notna().astype(float),
            True,
        ),
    ):
        up, down = int(((now == 1) & (before == 0)).sum()), int(((now == 0) & (before == 1)).sum())
        rows.append(
            dict(
                candidate=cand,
                suite=suite,
                metric=metric,
                current=float(now.mean()),
                baseline=float(before.mean()),
                n_current=len(pairs),
                n_baseline=len(pairs),
                p=mcnemar_p(up if worse_up else down, down if worse_up else up),
                worse_up=worse_up,
            )
        )
    return rows


def _timing_row(cand: str, suite: str, metric: str, col: str, pairs: pd.DataFrame) -> dict:
    """Latency or TTFT p95 (Wilcoxon on the same items), or the mean cost per call."""
    c, b = pairs[f"{col}_c"].to_numpy(float), pairs[f"{col}_b"].to_numpy(float)
    p95 = metric != "cost_per_call_usd"
    return dict(
        candidate=cand,
        suite=suite,
        metric=metric,
        current=float(np.quantile(c, 0.95) if p95 else c.mean()),
        baseline=float(np.quantile(b, 0.95) if p95 else b.mean()),
        n_current=len(pairs),
        n_baseline=len(pairs),
        p=greater_p(c, b) if p95 else None,
        worse_up=True,
    )


def _comparisons(cur: pd.DataFrame, base: pd.DataFrame) -> tuple[int, list[dict]]:
    """Every (candidate, suite) of the run that has a baseline: how many, and their rows.

    Times and costs come from calls answered in each run (never replayed cache rows).
    """
    labelled = _pairs(cur, base, cur.labeled, base.labeled, ["label", "error_kind"])
    timed = {
        col: _pairs(cur, base, cur.timed & cur[col].notna(), base.timed & base[col].notna(), [col])
        for _, col in TIMED
    }
    groups = {
        name: dict(list(frame.groupby(PAIR))) for name, frame in (("labelled", labelled), *timed.items())
    }
    compared = base[PAIR].drop_duplicates().merge(cur[PAIR].drop_duplicates())
    rows: list[dict] = []
    for cand, suite in compared.itertuples(index=False):
        if (cand, suite) in groups["labelled"]:
            rows += _proportion_rows(cand, suite, groups["labelled"][(cand, suite)])
        rows += [
            _timing_row(cand, suite, metric, col, groups[col][(cand, suite)])
            for metric, col in TIMED
            if (cand, suite) in groups[col]
        ]
    return len(compared), rows


def _judge(row: dict, q: float | None, s: AlertSettings) -> DriftFinding | None:
    """Turn one comparison into a finding when it crosses its threshold (and is significant)."""
    cur, base, metric = row["current"], row["baseline"], row["metric"]
    if min(row["n_current"], row["n_baseline"]) < s.min_items:
        return None
    if metric in ("pass_rate", "error_rate"):
        change, threshold = cur - base, s.min_pass_rate_drop
        significant = q is not None and q < s.alpha
    else:
        change = _rel(cur, base)
        threshold = {
            "latency_p95_s": s.latency_p95_increase_pct,
            "ttft_p95_s": s.ttft_p95_increase_pct,
            "cost_per_call_usd": s.cost_increase_pct,
        }[metric] / 100.0
        significant = q is None or q < s.alpha
    worse = change > 0 if row["worse_up"] else change < 0
    if abs(change) < threshold or not significant:
        return None
    if not worse and metric not in ("pass_rate", "cost_per_call_usd"):
        return None  # faster or fewer errors: not worth an alert
    severity: Severity = "regression" if worse else "improvement"
    unit = "pts" if metric in ("pass_rate", "error_rate") else "%"
    shown = change * 100
    stat = f", q={q:.3g}" if q is not None else ""
    msg = (
        f"{row['candidate']} on {row['suite']}: {metric} {base:.4g} -> {cur:.4g} "
        f"({shown:+.1f} {unit}{stat}; n={row['n_current']} vs {row['n_baseline']})"
    )
    return DriftFinding(
        row["candidate"],
        row["suite"],
        metric,
        severity,
        base,
        cur,
        change,
        row["p"],
        q,
        row["n_current"],
        row["n_baseline"],
        msg,
    )


def price_changes(store: Store, run_id: str) -> list[DriftFinding]:
    """List-price changes of each candidate since the latest earlier run that had it."""
    frame = store.query(
        "SELECT c.*, r.started_at FROM candidates c JOIN runs r USING (run_id) "
        "WHERE r.started_at <= (SELECT started_at FROM runs WHERE run_id = ?) "
        "ORDER BY r.started_at DESC",
        [run_id],
    )
    out: list[DriftFinding] = []
    for name, grp in frame.groupby("name"):
        if grp.iloc[0].run_id != run_id or len(grp) < 2:
            continue
        now, before = grp.iloc[0], grp.iloc[1]
        for col in PRICE_FIELDS:
            a, b = before[col], now[col]
            if (pd.isna(a) and pd.isna(b)) or (not pd.isna(a) and not pd.isna(b) and math.isclose(a, b)):
                continue
            up = not pd.isna(a) and not pd.isna(b) and b > a
            out.append(
                DriftFinding(
                    str(name),
                    "*",
                    f"price:{col}",
                    "regression" if up else "info",
                    None if pd.isna(a) else float(a),
                    None if pd.isna(b) else float(b),
                    None if pd.isna(a) or pd.isna(b) else _rel(float(b), float(a)),
                    message=f"{name}: {col} changed {a} -> {b} since run {before.run_id}",
                )
            )
    return out


def detect_drift(store: Store, run_id: str, settings: AlertSettings | None = None) -> DriftReport:
    """Compare `run_id` with the earlier completed runs; findings are sorted worst first."""
    s = settings or AlertSettings()
    frame = label_frame(_load(store, run_id))
    frame["timed"] = frame.error_kind.isna() & frame.live
    cur_all = frame[frame.run_id == run_id]
    base_all = _baseline(frame, run_id, s.baseline_runs)
    report = DriftReport(run_id, sorted(set(base_all.run_id)) if len(base_all) else [])
    report.compared_pairs, rows = _comparisons(cur_all, base_all)
    for metric in {r["metric"] for r in rows}:
        family = [r for r in rows if r["metric"] == metric]
        tested = [r for r in family if r["p"] is not None]
        for r, q in zip(tested, bh_adjust([r["p"] for r in tested])):
            r["q"] = q
        report.findings += [f for r in family if (f := _judge(r, r.get("q"), s)) is not None]
    report.findings += price_changes(store, run_id)
    order = {"regression": 0, "improvement": 1, "info": 2}
    report.findings.sort(key=lambda f: (order[f.severity], f.candidate, f.suite, f.metric))
    return report


# -- acting on drift --------------------------------------------------------------------------


def blocking_regressions(
    report: DriftReport, candidates: Iterable[str], metrics: Iterable[str] = BLOCKING_METRICS
) -> list[DriftFinding]:
    """Regressions of the candidates a policy routes to: non-empty means do not promote it."""
    used, kinds = set(candidates), set(metrics)
    return [f for f in report.regressions if f.candidate in used and f.metric in kinds]


def summary_line(report: DriftReport) -> str:
    reg = report.regressions
    if not reg:
        return f"routeopt {report.run_id}: no regressions ({len(report.findings)} findings)"
    shown = "; ".join(f.message for f in reg[:5])
    more = f" (+{len(reg) - 5} more)" if len(reg) > 5 else ""
    return f"routeopt {report.run_id}: {len(reg)} regressions: {shown}{more}"
