"""The run summary: per candidate quality, cost and latency, and the router beside them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from evals.store import Store

CANDIDATE_SQL = """
SELECT candidate,
       count(*) AS items,
       count(*) FILTER (WHERE error_kind IS NOT NULL) AS errors,
       avg(CASE WHEN passed THEN 1.0 ELSE 0.0 END) AS pass_rate,
       sum(cost_usd) AS cost_usd,
       quantile_cont(latency_s, 0.5) AS p50_latency_s,
       quantile_cont(latency_s, 0.95) AS p95_latency_s,
       quantile_cont(ttft_s, 0.5) AS p50_ttft_s
FROM outcomes WHERE run_id = ?
GROUP BY candidate ORDER BY sum(cost_usd) NULLS LAST, candidate
"""


def candidate_table(store: Store, run_id: str) -> list[dict[str, Any]]:
    return store.query(CANDIDATE_SQL, [run_id]).to_dict("records")


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def print_summary(console: Console, rows: list[dict[str, Any]], result: dict[str, Any]) -> None:
    """Print the candidates table and the router's held-out comparison."""
    table = Table(title=f"run {result['run_id']}: candidates (all items)")
    for col in ("candidate", "items", "errors", "pass rate", "cost $", "p50 lat s", "p95 lat s", "p50 ttft s"):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for r in rows:
        table.add_row(
            r["candidate"],
            str(r["items"]),
            str(r["errors"]),
            _fmt(r["pass_rate"], ".3f"),
            _fmt(r["cost_usd"], ".6f"),
            _fmt(r["p50_latency_s"], ".3f"),
            _fmt(r["p95_latency_s"], ".3f"),
            _fmt(r["p50_ttft_s"], ".3f"),
        )
    console.print(table)
    metrics = result.get("router_metrics") or {}
    heldout = metrics.get("heldout") or {}
    if heldout:
        rt = Table(title="router on held-out items (cost per 1k requests)")
        for col in ("policy", "pass rate", "cost $ / 1k req", "cost vs best single"):
            rt.add_column(col, justify="left" if col == "policy" else "right")
        best_cost = (heldout.get("best_single") or {}).get("cost_per_request")
        for name in ("router", "best_single", "cheapest_single", "oracle"):
            m = heldout.get(name)
            if not m:
                continue
            label = name if "model" not in m else f"{name} ({m['model']})"
            ratio = m["cost_per_request"] / best_cost if best_cost else None
            rt.add_row(
                label,
                _fmt(m.get("pass_rate"), ".3f"),
                _fmt(m["cost_per_request"] * 1000, ".6f"),
                _fmt(ratio, ".2f"),
            )
        console.print(rt)
    for name, err in (result.get("suite_errors") or {}).items():
        console.print(f"[red]suite {name} was skipped:[/red] {err}")
    if result.get("published"):
        console.print(f"published policy: {result['published']}")
