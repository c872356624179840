"""The run summary: per candidate quality, cost and latency, and the router beside them."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from evals.storage.store import Store

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


def router_table(holdout: dict[str, Any]) -> Table:
    """The router at its target beside the best and cheapest single candidates and the oracle."""
    n = holdout.get("n_test_requests")
    table = Table(title=f"router on {n} held-out requests (mean cost per request)")
    for col in ("policy", "pass rate", "cost $/req", "cost vs best single"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    best_cost = (holdout.get("best_single") or {}).get("cost")
    promise = holdout.get("promise") or {}
    at = holdout.get("router_at_target") or {}
    if promise.get("promised") and at:
        floor = at["target"] * promise["reference_pass_rate"]
        table.caption = (f"floor {at['target']:g} x {promise['reference_pass_rate']:.3f} = {floor:.3f}; "
                         f"promise held at {promise['held']} of {promise['promised']} certified targets")
    rows = [("router", holdout.get("router_at_target"))]
    rows += [(k, holdout.get(k)) for k in ("best_single", "cheapest_single", "oracle")]
    for name, m in rows:
        if not m:
            continue
        label = f"{name} ({m['model']})" if "model" in m else name
        if name == "router":
            label = f"router (target {m['target']:g})"
        ratio = m["cost"] / best_cost if best_cost else None
        table.add_row(label, _fmt(m["pass_rate"], ".3f"), _fmt(m["cost"], ".3g"), _fmt(ratio, ".2f"))
    return table


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
    holdout = (result.get("router_metrics") or {}).get("holdout") or {}
    if holdout:
        console.print(router_table(holdout))
    for name, err in (result.get("suite_errors") or {}).items():
        console.print(f"[red]suite {name} was skipped:[/red] {err}")
    if result.get("published"):
        pub = result["published"]
        signed = "signed" if pub["signed"] else "unsigned"
        console.print(f"published policy v{pub['version']} ({signed}): {pub['uri']}")
    promotion = result.get("promotion")
    if promotion:
        verdict = "promoted to champion" if promotion["promoted"] else "kept as candidate"
        console.print(f"policy {verdict}: {promotion['reason']}")
    if result.get("report_path"):
        console.print(f"dashboard: {result['report_path']}")
