"""The run dashboard: one self-contained HTML file (inline CSS, JS and SVG; no CDN, no network).

It shows, for one run: the policy it published and whether it became the champion; per
candidate quality, cost per passing answer, tokens, TTFT and latency percentiles; what the
router's quality knob gives at each target on held-out requests (pass rate, cost, and whether
the promise held there), beside single models; per-suite tables; trends over the last nightly
runs; live traffic; and drift alerts. `publish_prefect_artifacts` puts the key tables into the
Prefect UI.

Every router figure on the page is one a user gets by turning the knob, measured on requests
the evaluated policy never saw. Figures read off a frontier drawn through points measured on
those same requests (savings at the best single model's quality, AIQ) are upper bounds, and the
page labels them so.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pandas as pd

from routeopt.common.io import atomic_write
from routeopt.evals.storage.drift import DriftReport
from routeopt.evals.storage.labels import LABELS, LabelSql
from routeopt.evals.storage.store import Store
from routeopt.evals.storage.traffic import load_traffic
from routeopt.reports.charts import Axis, Series, chart
from routeopt.evals.execution.batch import batch_summary
from routeopt.reports.summary import modes_shown, promise_line
from routeopt.reports.replay_chart import replay_section
from routeopt.router_training.live.promise import live_summary

L, LO = LABELS, LabelSql("o.")
LIVE = f"error_kind IS NULL AND {L.live}"  # answers measured in this run: times come from these
STATS_SQL = f"""
SELECT {{keys}},
  count(*) AS items,
  count(*) FILTER (WHERE {L.labeled}) AS labeled,
  count(*) FILTER (WHERE {L.passed}) AS passed,
  count(*) FILTER (WHERE {L.failed_call}) AS errors,
  count(*) FILTER (WHERE {L.excluded}) AS excluded,
  count(*) FILTER (WHERE error_kind = 'budget') AS budget_skipped,
  count(*) FILTER (WHERE cached) AS cached,
  count(*) FILTER (WHERE {L.live} AND NOT {L.excluded}) AS live_items,
  count(*) FILTER (WHERE {L.live} AND {L.passed}) AS live_passed,
  sum(cost_usd) FILTER (WHERE {L.live}) AS cost_usd,
  sum(input_tokens) FILTER (WHERE {L.live}) AS input_tokens,
  sum(output_tokens) FILTER (WHERE {L.live}) AS output_tokens,
  quantile_cont(ttft_s, 0.5) FILTER (WHERE {LIVE}) AS ttft_p50,
  quantile_cont(ttft_s, 0.95) FILTER (WHERE {LIVE}) AS ttft_p95,
  quantile_cont(ttft_s, 0.99) FILTER (WHERE {LIVE}) AS ttft_p99,
  quantile_cont(latency_s, 0.5) FILTER (WHERE {LIVE}) AS latency_p50,
  quantile_cont(latency_s, 0.95) FILTER (WHERE {LIVE}) AS latency_p95,
  quantile_cont(latency_s, 0.99) FILTER (WHERE {LIVE}) AS latency_p99
FROM outcomes WHERE run_id = ? {{extra}}
GROUP BY {{keys}} ORDER BY {{keys}}
"""
TREND_SQL = f"""
WITH recent AS (
  SELECT run_id, started_at FROM runs
  WHERE started_at <= (SELECT started_at FROM runs WHERE run_id = ?)
  ORDER BY started_at DESC LIMIT ?
)
SELECT o.run_id, r.started_at, o.candidate,
  count(*) FILTER (WHERE {LO.labeled}) AS labeled,
  count(*) FILTER (WHERE {LO.passed}) AS passed,
  count(*) FILTER (WHERE {LO.live} AND {LO.passed}) AS live_passed,
  sum(o.cost_usd) FILTER (WHERE {LO.live}) AS cost_usd,
  quantile_cont(o.latency_s, 0.95) FILTER (WHERE o.error_kind IS NULL AND {LO.live}) AS latency_p95
FROM outcomes o JOIN recent r USING (run_id)
GROUP BY ALL ORDER BY r.started_at, o.candidate
"""


@dataclass
class ReportData:
    """Everything the page shows, gathered once (tests and Prefect artifacts reuse it)."""

    run: dict[str, Any]
    candidates: list[dict[str, Any]]
    suites: dict[str, list[dict[str, Any]]]
    trend: pd.DataFrame
    drift: DriftReport | None = None
    metrics: dict[str, Any] | None = None
    policy_version: int | None = None
    policy_status: str | None = None  # "champion", "candidate (kept: why)", ...
    live: dict[str, Any] | None = None
    replay: dict[str, Any] | None = None  # the latest `routeopt bench replay` (routeopt.reports.replay_chart)
    traffic: dict[str, Any] | None = (
        None  # the champion's traffic check (routeopt.router_training.live.shift_monitor)
    )
    # how items were answered (batch, sync, carried), the batches' states and the cost against a
    # full synchronous night (`batch_summary`); empty when every row was a synchronous call
    modes: list[dict[str, Any]] = field(default_factory=list)
    generated_at: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )


def _with_rates(frame: pd.DataFrame) -> list[dict[str, Any]]:
    """Pass rate over labelled rows (`routeopt.evals.storage.labels`); cost per passing answer and per
    item over the answers paid for in this run (replayed cache rows have neither)."""
    frame = frame.copy()
    frame["pass_rate"] = frame.passed / frame.labeled.where(frame.labeled > 0)
    frame["cost_per_pass"] = frame.cost_usd / frame.live_passed.where(frame.live_passed > 0)
    frame["cost_per_item"] = frame.cost_usd / frame.live_items.where(frame.live_items > 0)
    return [{k: _clean(v) for k, v in row.items()} for row in frame.to_dict("records")]


def _clean(v: Any) -> Any:
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    if hasattr(v, "item"):
        v = v.item()
        return None if isinstance(v, float) and not math.isfinite(v) else v
    return v


def candidate_stats(store: Store, run_id: str, suite: str | None = None) -> list[dict[str, Any]]:
    """Per candidate: counts, pass rate, cost (total, per item, per pass), tokens, TTFT/latency."""
    extra, params = ("AND suite = ?", [run_id, suite]) if suite else ("", [run_id])
    return _with_rates(store.query(STATS_SQL.format(keys="candidate", extra=extra), params))


def suite_stats(store: Store, run_id: str) -> dict[str, list[dict[str, Any]]]:
    rows = _with_rates(store.query(STATS_SQL.format(keys="suite, candidate", extra=""), [run_id]))
    out: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        out.setdefault(row["suite"], []).append(row)
    return out


def trend_frame(store: Store, run_id: str, runs: int = 14) -> pd.DataFrame:
    """Per (run, candidate) over the last `runs` runs up to this one: pass rate, $/pass, p95."""
    frame = store.query(TREND_SQL, [run_id, runs])
    frame["pass_rate"] = frame.passed / frame.labeled.where(frame.labeled > 0)
    frame["cost_per_pass"] = frame.cost_usd / frame.live_passed.where(frame.live_passed > 0)
    return frame


def policy_metrics_for_run(registry: str | Path, run_id: str) -> tuple[int, dict] | None:
    """The newest published policy trained on this run, and its metrics, if there is one."""
    from routeopt.artifacts.publish.registry import RegistryError, show, version_numbers

    try:
        numbers = version_numbers(str(registry))
    except (RegistryError, OSError):
        return None
    for number in reversed(numbers):
        manifest = show(str(registry), number)
        if run_id in (manifest.get("lineage") or {}).get("runs", []):
            return number, manifest.get("metrics") or {}
    return None


def gather(
    store: Store,
    run_id: str,
    *,
    drift: DriftReport | None = None,
    metrics: dict | None = None,
    registry: str | Path | None = None,
    policy: dict[str, Any] | None = None,
    trend_runs: int = 14,
    live_days: float = 14.0,
    traffic: dict | None = None,
) -> ReportData:
    """Read everything the report needs. `policy` is what the run published (`version`, and
    `promoted` with its `reason`), as the nightly knows it; without it the policy and its
    metrics are looked up in `registry` (the newest version trained on this run). Live traffic
    (decision logs with feedback) covers the `live_days` up to the run's end; `traffic` is the
    serving policy's traffic check (shift monitor and live promise), when run."""
    run = store.query("SELECT * FROM runs WHERE run_id = ?", [run_id])
    if run.empty:
        raise KeyError(f"no run {run_id!r} in {store.path}")
    version, status = (policy or {}).get("version"), _policy_status(policy)
    if version is None and registry is not None:
        found = policy_metrics_for_run(registry, run_id)
        if found:
            version, found_metrics = found
            metrics = metrics if metrics is not None else found_metrics
            status = _channel_status(registry, version)
    info = {k: _clean(v) for k, v in run.iloc[0].to_dict().items() if k != "config_json"}
    return ReportData(
        run=info,
        candidates=candidate_stats(store, run_id),
        suites=suite_stats(store, run_id),
        trend=trend_frame(store, run_id, trend_runs),
        drift=drift,
        metrics=metrics,
        policy_version=version,
        policy_status=status,
        live=_live(store, _run_end(info), live_days),
        replay=replay_section(store),
        traffic=traffic,
        modes=_modes(store, run_id),
    )


def _modes(store: Store, run_id: str) -> list[dict[str, Any]]:
    """The run summary's table of how items were answered, when it shows one (`modes_shown`)."""
    rows = batch_summary(store, run_id)
    if not modes_shown(rows):
        return []
    return [
        {k: (v if k == "batches" else _clean(v)) for k, v in r.items()}
        | {"states": ", ".join(f"{s} {n}" for s, n in sorted(r["batches"].items())) or "-"}
        for r in rows
    ]


def _policy_status(policy: dict[str, Any] | None) -> str | None:
    """What became of the published policy, as the nightly's promotion gate decided."""
    if not policy or policy.get("promoted") is None:
        return None
    return "champion" if policy["promoted"] else f"candidate (not promoted: {policy.get('reason', '')})"


def _channel_status(registry: str | Path, version: int) -> str | None:
    """Whether `version` is the registry's champion now (a report made after the run)."""
    from routeopt.artifacts.publish.registry import RegistryError, current_pointer

    try:
        pointer, _ = current_pointer(str(registry), "champion")
    except (RegistryError, OSError):
        return None
    return "champion" if pointer is not None and pointer.version == version else "candidate"


def _live(store: Store, until: str | None, days: float) -> dict[str, Any] | None:
    """Champion vs candidate on the logged traffic of the `days` before `until` (default: now)."""
    end = pd.Timestamp(until) if until else pd.Timestamp.now(tz="UTC")
    end = end.tz_localize("UTC") if end.tzinfo is None else end
    start = end - pd.Timedelta(days=days)
    frame = load_traffic(store, since=start.isoformat(), until=end.isoformat())
    return live_summary(frame, start.isoformat(), end.isoformat())


def _run_end(run: dict[str, Any]) -> str | None:
    """The run's finish (else start) time: live traffic is shown up to it."""
    end = run.get("finished_at") or run.get("started_at")
    return None if end is None else pd.Timestamp(end).isoformat()


# -- charts -------------------------------------------------------------------------------------


def _frontier(points: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """Single models that no cheaper model beats: the baseline a router has to improve on."""
    best, out = -1.0, []
    for c, q, name in sorted(points):
        if q > best:
            out.append((c, q, name))
            best = q
    return out


def cost_quality_chart(data: ReportData) -> str:
    """Router vs baselines on held-out items (policy metrics), else candidates on this run."""
    holdout = (data.metrics or {}).get("holdout") or {}
    per_cand = holdout.get("per_candidate") or {}
    series: list[Series] = []
    if per_cand:
        pts = [
            (v["cost"], v["pass_rate"], m)
            for m, v in per_cand.items()
            if v.get("cost") is not None and v.get("pass_rate") is not None
        ]
        title = f"Cost vs quality on {holdout.get('n_test_requests', '?')} held-out requests"
        x_label = "mean cost per request (USD)"
    else:
        pts = [
            (r["cost_per_item"], r["pass_rate"], r["candidate"])
            for r in data.candidates
            if r["cost_per_item"] is not None and r["pass_rate"] is not None
        ]
        title = "Cost vs quality of each candidate on this run"
        x_label = "mean cost per item (USD)"
    front = _frontier(pts)
    series.append(
        Series(
            "single-model frontier",
            [p[0] for p in front],
            [p[1] for p in front],
            [p[2] for p in front],
            dashed=True,
            marker="square",
            color="#9ca3af",
        )
    )
    series.append(
        Series(
            "candidates",
            [p[0] for p in pts],
            [p[1] for p in pts],
            [p[2] for p in pts],
            line=False,
            annotate=True,
            color="#2563eb",
        )
    )
    for name, curve in (holdout.get("curves") or (data.metrics or {}).get("curves") or {}).items():
        series.append(
            Series(f"{name} curve", curve.get("cost", []), curve.get("quality", []), marker="circle")
        )
    knob = [r for r in knob_rows(data.metrics) if r["cost"] is not None and r["pass_rate"] is not None]
    if knob:
        series.append(
            Series(
                "quality knob (targets)",
                [r["cost"] for r in knob],
                [r["pass_rate"] for r in knob],
                [f"target {r['target']:g}" for r in knob],
                marker="circle",
                color="#16a34a",
            )
        )
    oracle, router = holdout.get("oracle") or {}, holdout.get("router_at_target") or {}
    if oracle.get("cost") is not None:
        series.append(
            Series(
                "oracle",
                [oracle["cost"]],
                [oracle.get("pass_rate")],
                ["oracle"],
                line=False,
                marker="star",
                color="#ca8a04",
            )
        )
    if router.get("cost") is not None:
        label = f"router @ target {router.get('target')}"
        series.append(
            Series(
                label,
                [router["cost"]],
                [router.get("pass_rate")],
                [label],
                line=False,
                marker="diamond",
                color="#dc2626",
            )
        )
    costs = [c for s in series for c in s.xs if c is not None and c > 0]
    log = (
        bool(costs)
        and len(costs) == sum(1 for s in series for c in s.xs if c is not None)
        and max(costs) / min(costs) > 20
    )
    return chart(
        title,
        series,
        Axis(x_label, log=log, fmt=".2g"),
        Axis("pass rate", fmt=".2f"),
        chart_id="cost-quality",
    )


def trend_charts(data: ReportData) -> list[str]:
    frame = data.trend
    if frame.empty:
        return []
    runs = list(dict.fromkeys(frame.run_id))
    out = []
    for metric, label, fmt in (
        ("pass_rate", "pass rate", ".2f"),
        ("cost_per_pass", "USD per passing answer", ".2g"),
        ("latency_p95", "latency p95 (s)", ".3g"),
    ):
        series = []
        for cand, grp in frame.groupby("candidate", sort=True):
            by_run = dict(zip(grp.run_id, grp[metric]))
            ys = [_clean(by_run.get(r)) for r in runs]
            series.append(Series(str(cand), list(range(len(runs))), ys, [f"{cand} {r}" for r in runs]))
        out.append(
            chart(
                f"Trend: {label}",
                series,
                Axis("run", categories=runs),
                Axis(label, fmt=fmt),
                chart_id=f"trend-{metric}",
            )
        )
    return out


# -- HTML -----------------------------------------------------------------------------------------


def render_html(data: ReportData) -> str:
    """The whole page as one string."""
    from jinja2 import Environment

    from routeopt.reports.dashboard_page import PAGE

    env = Environment(autoescape=True, trim_blocks=True, lstrip_blocks=True)
    env.filters["num"] = _num
    env.filters["pct"] = lambda v: f"{100 * v:.1f}%" if _is_num(v) else "-"
    env.filters["ci"] = _ci
    return env.from_string(PAGE).render(
        d=data,
        cost_quality=cost_quality_chart(data),
        trends=trend_charts(data),
        router_rows=_router_rows(data.metrics),
        knob_rows=knob_rows(data.metrics),
        budget_rows=((data.metrics or {}).get("holdout") or {}).get("latency", {}).get("rows") or [],
        promise_line=promise_line(data.metrics),
        total_cost=sum(r["cost_usd"] or 0 for r in data.candidates),
        modes_cost=sum(r["cost_usd"] or 0 for r in data.modes),
        modes_full=sum(r["full_sync_usd"] or 0 for r in data.modes),
        batch_option=", ".join(json.loads(data.run.get("batch_option") or "[]")),
        total_items=sum(r["items"] for r in data.candidates),
    )


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _num(v: Any, spec: str = ".4g") -> str:
    """A number formatted, or '-' for missing values (None, NaN, a key the metrics lack)."""
    return format(v, spec) if _is_num(v) else "-"


def _ci(e: dict | None, spec: str = ".3f") -> str:
    """An estimate as 'value [low, high]', or '-'."""
    if not e or not _is_num(e.get("value")):
        return "-"
    return f"{_num(e['value'], spec)} [{_num(e.get('low'), spec)}, {_num(e.get('high'), spec)}]"


def knob_rows(metrics: dict | None) -> list[dict[str, Any]]:
    """What turning the knob gives on the held-out requests, one row per target: the floor it
    promises (target x the reference model's pass rate there), the pass rate and cost of the
    policy fitted without those requests, its cost against always calling the best single
    model, and the verdict: held, below the floor within noise, or refuted (the requests'
    own upper bound of the margin is below the floor). The figures `routeopt run` prints."""
    holdout = (metrics or {}).get("holdout") or {}
    promise = holdout.get("promise") or {}
    best_cost = (holdout.get("best_single") or {}).get("cost")
    rows = []
    for r in promise.get("targets") or []:
        se = r.get("margin_se")
        noise = 1.96 * se if _is_num(se) else None
        if not r.get("certified"):
            verdict = "not certified"
        elif r.get("contradicted"):
            verdict = "refuted"
        else:
            verdict = "held" if r.get("held") else "below floor, within noise"
        cost = r.get("cost")
        rows.append(
            {
                **r,
                "noise": noise,
                "verdict": verdict,
                "cost_ratio": cost / best_cost
                if _is_num(cost) and _is_num(best_cost) and best_cost
                else None,
            }
        )
    return rows


def _router_rows(metrics: dict | None) -> list[dict[str, Any]]:
    """Held-out rows: router at target, best and cheapest single models, oracle; with the
    frontier summaries (optimistic: read off points measured on these same requests)."""
    holdout = (metrics or {}).get("holdout") or {}
    table = holdout.get("table") or {}
    rows = []
    for key, label in (
        ("router_at_target", "router @ target"),
        ("best_single", "best single"),
        ("cheapest_single", "cheapest single"),
        ("oracle", "oracle"),
    ):
        m = holdout.get(key)
        if not m:
            continue
        name = f"{label} ({m['model']})" if m.get("model") else label
        if key == "router_at_target":
            name = f"router @ target {m.get('target'):g}"
        rows.append(
            {
                "name": name,
                "pass_rate": m.get("pass_rate"),
                "cost": m.get("cost"),
                "summary": table.get("router" if key == "router_at_target" else key, {}),
            }
        )
    for name, summary in table.items():
        if name not in ("router", "best_single", "cheapest_single", "oracle"):
            rows.append(
                {"name": f"baseline router: {name}", "pass_rate": None, "cost": None, "summary": summary}
            )
    return rows


REPORT_PERMISSIONS = 0o644  # a report is meant to be shared: readable by others unless the config says


def write_report(html: str, out: str | Path, permissions: int = REPORT_PERMISSIONS) -> Path:
    """Write atomically so a reader never sees half a page."""
    return atomic_write(out, html, permissions)


def build_report(
    store: Store, run_id: str, out: str | Path, *, permissions: int = REPORT_PERMISSIONS, **kw: Any
) -> Path:
    """Gather, render and write the dashboard of one run (file mode `permissions`, the config's
    `reports.permissions`); `kw` goes to `gather`."""
    return write_report(render_html(gather(store, run_id, **kw)), out, permissions)


# -- Prefect UI artifacts ---------------------------------------------------------------------


def _table_rows(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> list[dict[str, Any]]:
    def fmt(v: Any) -> Any:
        return round(v, 6) if isinstance(v, float) else v

    return [{k: fmt(r.get(k)) for k in keys} for r in rows]


_MODES_COLUMNS = (
    "candidate",
    "batch",
    "sync",
    "carried",
    "latency_rows",
    "states",
    "cost_usd",
    "full_sync_usd",
)
_ARTIFACT_COLUMNS = (
    "candidate",
    "items",
    "errors",
    "excluded",
    "budget_skipped",
    "cached",
    "pass_rate",
    "cost_usd",
    "cost_per_pass",
    "input_tokens",
    "output_tokens",
    "ttft_p50",
    "ttft_p95",
    "latency_p50",
    "latency_p95",
    "latency_p99",
)


def _router_markdown(metrics: dict | None) -> list[str]:
    """The knob's targets on held-out requests, as the dashboard's table has them."""
    rows = knob_rows(metrics)
    if not rows:
        return []
    n = (metrics or {}).get("holdout", {}).get("n_test_requests", "?")
    lines = [
        f"### Router on {n} held-out requests",
        "",
        promise_line(metrics) or "",
        "",
        "| target | certified | floor | pass rate | USD / request | verdict |",
        "|---:|---|---:|---:|---:|---|",
    ]
    lines += [
        f"| {r['target']:g} | {'yes' if r['certified'] else 'no'} | {_num(r['floor'], '.3f')} | "
        f"{_num(r['pass_rate'], '.3f')} | {_num(r['cost'], '.3g')} | {r['verdict']} |"
        for r in rows
    ]
    return lines


def _drift_markdown(drift: DriftReport | None, metrics: dict | None) -> str:
    lines = _router_markdown(metrics)
    lines += ["", "### Drift"]
    if drift is None:
        lines.append("not computed")
    elif not drift.findings:
        lines.append(f"No drift against {len(drift.baseline_runs)} earlier runs.")
    else:
        lines += [f"Against runs {', '.join(drift.baseline_runs)}.", ""]
        lines += [f"- **{f.severity}** {f.message}" for f in drift.findings]
    return "\n".join(lines)


def publish_prefect_artifacts(data: ReportData, report_path: str | Path | None = None) -> list[Any]:
    """Candidates and per-suite tables, the knob's held-out figures and drift (and a link to
    the HTML report) as Prefect artifacts; called inside the nightly flow they attach to its run."""
    from prefect.artifacts import create_link_artifact, create_markdown_artifact, create_table_artifact

    run_id = data.run["run_id"]
    suite_rows = [dict(r, suite=s) for s, rows in data.suites.items() for r in rows]
    ids = [
        create_table_artifact(
            table=_table_rows(data.candidates, _ARTIFACT_COLUMNS),
            key="routeopt-candidates",
            description=f"Candidates on run {run_id}: pass rate, cost, tokens, TTFT and latency (s).",
        ),
        create_table_artifact(
            table=_table_rows(suite_rows, ("suite",) + _ARTIFACT_COLUMNS),
            key="routeopt-suites",
            description=f"Per suite and candidate on run {run_id}.",
        ),
        create_markdown_artifact(
            markdown=_drift_markdown(data.drift, data.metrics),
            key="routeopt-router-drift",
            description=f"Router metrics and drift alerts of run {run_id}.",
        ),
    ]
    if data.modes:
        ids.append(
            create_table_artifact(
                table=_table_rows(data.modes, _MODES_COLUMNS),
                key="routeopt-answer-modes",
                description=f"How run {run_id} answered items (batch, sync, carried forward), its "
                "batches' states, and its cost against a full synchronous night (USD).",
            )
        )
    if report_path is not None:
        ids.append(
            create_link_artifact(
                link=Path(report_path).resolve().as_uri(),
                link_text="HTML report",
                key="routeopt-report",
                description=f"Self-contained dashboard of run {run_id}.",
            )
        )
    return ids
