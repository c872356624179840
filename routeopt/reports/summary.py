"""The run summary: per candidate quality, cost and latency, what prompt caching saved, and the
router beside them."""

from __future__ import annotations

from dataclasses import dataclass, field

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from routeopt.evals.storage.labels import LABELS, exclusion_summary, is_excluded
from routeopt.evals.storage.store import Store

L = LABELS
CANDIDATE_SQL = f"""
SELECT candidate,
       count(*) AS items,
       count(*) FILTER (WHERE {L.failed_call}) AS errors,
       count(*) FILTER (WHERE {L.excluded}) AS excluded,
       avg(CASE WHEN {L.passed} THEN 1.0 ELSE 0.0 END) FILTER (WHERE {L.labeled}) AS pass_rate,
       count(*) FILTER (WHERE cached) AS cached,
       sum(cost_usd) FILTER (WHERE {L.live}) AS cost_usd,
       quantile_cont(latency_s, 0.5) FILTER (WHERE {L.live}) AS p50_latency_s,
       quantile_cont(latency_s, 0.95) FILTER (WHERE {L.live}) AS p95_latency_s,
       quantile_cont(ttft_s, 0.5) FILTER (WHERE {L.live}) AS p50_ttft_s
FROM outcomes WHERE run_id = ?
GROUP BY candidate ORDER BY sum(cost_usd) NULLS LAST, candidate
"""
EXCLUDED_SQL = f"""
SELECT error_kind, count(*) AS n FROM outcomes WHERE run_id = ? AND {L.excluded} GROUP BY 1
"""
ERRORS_SQL = """
SELECT candidate, error_kind, count(*) AS n, arg_min(error, created_at) AS first
FROM outcomes WHERE run_id = ? AND error_kind IS NOT NULL
GROUP BY candidate, error_kind ORDER BY candidate, n DESC, error_kind
"""
MESSAGE_CHARS = 240  # of an error's first message in the summary (the store keeps it whole)


def candidate_table(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Per candidate: items, the candidate's errors (failures), rows excluded (errors on our
    side), pass rate over labelled rows, replayed rows, and the cost and times of this run."""
    return store.query(CANDIDATE_SQL, [run_id]).to_dict("records")


def excluded_line(store: Store, run_id: str) -> str:
    """How many rows the pass rates leave out, by error kind and why ('' when none)."""
    frame = store.query(EXCLUDED_SQL, [run_id])
    return exclusion_summary({str(r.error_kind): int(r.n) for r in frame.itertuples()})


def error_rows(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Per (candidate, error kind): how many rows, and the first one's message."""
    return store.query(ERRORS_SQL, [run_id]).to_dict("records")


def errors_table(rows: list[dict[str, Any]]) -> Table | None:
    """The run's errors by candidate and kind with the first message of each, and whether
    they count as the model's failures or are left out as ours."""
    if not rows:
        return None
    table = Table(title="errors by candidate and kind (failure: the model's, in pass rates; excluded: ours)")
    for col in ("candidate", "kind", "rows", "counts as", "first message"):
        table.add_column(col, justify="right" if col == "rows" else "left")
    for r in rows:
        first = str(r["first"] or "")
        if len(first) > MESSAGE_CHARS:
            first = first[: MESSAGE_CHARS - 1] + "…"
        table.add_row(
            r["candidate"],
            r["error_kind"],
            str(r["n"]),
            "excluded" if is_excluded(r["error_kind"]) else "failure",
            escape(first),
        )
    return table


def preflight_lines(probes: list[dict[str, Any]]) -> list[str]:
    """What the probes said: how many answered and what they cost, and each one that did not."""
    from routeopt.evals.execution.preflight import Probe

    if not probes:
        return []
    answered = sum(p["verdict"] == "ok" for p in probes)
    cost = sum(p.get("cost_usd") or 0.0 for p in probes)
    lines = [
        f"preflight: {answered} of {len(probes)} candidates answered a 1-token request (cost ${cost:.3g})"
    ]
    for p in probes:
        if p["verdict"] == "broken":
            lines.append(
                f"[red]skipped, left out of this run and its policy:[/red] "
                f"{escape(Probe.from_dict(p).line())}"
            )
        elif p["verdict"] != "ok":
            lines.append(f"did not answer (not a configuration error): {escape(Probe.from_dict(p).line())}")
    return lines


def misconfigured_lines(found: list[dict[str, Any]]) -> list[str]:
    """One line per candidate whose every call got the same error (`Store.mark_same_errors`)."""
    return [
        f"[red]candidate {m['candidate']} is misconfigured:[/red] all {m['n']} of its calls got "
        f"the same error, left out of pass rates and training: {escape(m['error_kind'] + ': ' + str(m['error']))}"
        for m in found
    ]


def _fmt(x: Any, spec: str) -> str:
    if x is None or (isinstance(x, float) and x != x):
        return "-"
    return format(x, spec)


def promise_line(metrics: dict | None) -> str | None:
    """The promise's tally on the held-out requests (the run summary's and the dashboard's)."""
    promise = ((metrics or {}).get("holdout") or {}).get("promise") or {}
    if not promise.get("promised"):
        return None
    broken = promise.get("contradicted")
    return f"promise held at {promise['held']} of {promise['promised']} certified targets" + (
        "" if broken is None else f", significantly broken at {broken}"
    )


def router_table(holdout: dict[str, Any]) -> Table:
    """The router at its target beside the best and cheapest single candidates and the oracle."""
    n = holdout.get("n_test_requests")
    refit = " (trained without them; the published policy is refit on all)" if holdout.get("policy") else ""
    table = Table(title=f"router on {n} held-out requests{refit} (mean cost per request)")
    for col in ("policy", "pass rate", "cost $/req", "cost vs best single"):
        table.add_column(col, justify="left" if col == "policy" else "right")
    best_cost = (holdout.get("best_single") or {}).get("cost")
    promise = holdout.get("promise") or {}
    at = holdout.get("router_at_target") or {}
    if promise.get("promised") and at:
        floor = at["target"] * promise["reference_pass_rate"]
        row = next((r for r in promise.get("targets", []) if abs(r["target"] - at["target"]) < 1e-9), {})
        noise = f" (±{1.96 * row['margin_se']:.3f} on {n} requests)" if row.get("margin_se") else ""
        table.caption = (
            f"floor {at['target']:g} x {promise['reference_pass_rate']:.3f} = {floor:.3f}{noise}; "
            f"{promise_line({'holdout': holdout})}"
        )
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


def caching_table(savings: list[Any]) -> Table | None:
    """Cache-read and cache-write input tokens per candidate, and the input $ they saved
    against the same calls without caching (`routeopt.evals.selfhost.costmodel.caching_savings`)."""
    used = [s for s in savings if s.cache_read_tokens or s.cache_write_tokens]
    if not used:
        return None
    table = Table(title="prompt caching (input tokens; $ vs the same calls without caching)")
    for col in (
        "candidate",
        "input tokens",
        "cache reads",
        "cache writes",
        "input $",
        "input $ uncached",
        "saved $",
    ):
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for s in used:
        table.add_row(
            s.candidate,
            f"{s.input_tokens:,}",
            f"{s.cache_read_tokens:,}",
            f"{s.cache_write_tokens:,}",
            _fmt(s.input_usd, ".6f"),
            _fmt(s.uncached_input_usd, ".6f"),
            _fmt(s.saved_usd, ".6f"),
        )
    return table


@dataclass
class RunResult:
    """What one nightly run did (`routeopt.flows.nightly.nightly` returns it): the run, its pairs
    and suites, the router's metrics, what was published and promoted, and every reason a person
    is needed. Plain values only, so Prefect can persist it; a summary of a run in progress sets
    only what it knows."""

    run_id: str
    db_path: str = ""
    suites: list[str] = field(default_factory=list)
    suite_errors: dict[str, str] = field(default_factory=dict)
    pairs: list[dict[str, Any]] = field(
        default_factory=list
    )  # one per (suite, candidate): counts, cost, halted
    router_metrics: dict[str, Any] | None = (
        None  # the trained policy's metrics (holdout, knob), if one was trained
    )
    report_path: str | None = None  # the HTML dashboard
    drift_blocking: list[str] = field(default_factory=list)  # drift findings that block promotion
    traffic_check: dict[str, Any] | None = None  # the champion's shift monitor on logged traffic
    published: dict[str, Any] | None = None  # version, uri, signed, key_id, public_key
    promotion: dict[str, Any] | None = None  # the promotion gate's decision
    cache_max_age: str | None = None  # answers of earlier runs replayed up to this age
    excluded: str | None = None  # the line saying how many rows were errors on our side
    traffic: dict[str, Any] | None = None  # the decision logs imported (or why not)
    preflight: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)  # candidates left out after a failed preflight
    misconfigured: list[dict[str, Any]] = field(default_factory=list)  # same error on every call
    held: str | None = None  # why no policy was published
    refused: list[dict[str, Any]] = field(default_factory=list)  # steps refused: stage and message


def print_summary(
    console: Console,
    rows: list[dict[str, Any]],
    result: RunResult,
    caching: list[Any] | None = None,
    errors: list[dict[str, Any]] | None = None,
) -> None:
    """Print the candidates table, what it leaves out, the errors by candidate and kind, the
    preflight and misconfigured candidates, prompt caching (when any call used a cache) and
    the router's held-out comparison.

    Pass rates count the candidate's own errors as failures and leave out errors on our side
    (`result.excluded` says how many); cost and times leave out replayed cache answers.
    """
    table = Table(title=f"run {result.run_id}: candidates (all items)")
    cols = (
        "candidate",
        "items",
        "errors",
        "excluded",
        "pass rate",
        "cost $",
        "p50 lat s",
        "p95 lat s",
        "p50 ttft s",
    )
    replayed = sum(int(r.get("cached") or 0) for r in rows)
    if replayed:
        cols = cols[:5] + ("cached",) + cols[5:]
    for col in cols:
        table.add_column(col, justify="left" if col == "candidate" else "right")
    for r in rows:
        cells = [
            r["candidate"],
            str(r["items"]),
            str(r["errors"]),
            str(r["excluded"]),
            _fmt(r["pass_rate"], ".3f"),
            _fmt(r["cost_usd"], ".6f"),
            _fmt(r["p50_latency_s"], ".3f"),
            _fmt(r["p95_latency_s"], ".3f"),
            _fmt(r["p50_ttft_s"], ".3f"),
        ]
        if replayed:
            cells.insert(5, str(r["cached"]))
        table.add_row(*cells)
    console.print(table)
    if result.excluded:
        console.print(result.excluded)
    errors_tab = errors_table(errors or [])
    if errors_tab is not None:
        console.print(errors_tab)
    for line in preflight_lines(result.preflight or []) + misconfigured_lines(result.misconfigured or []):
        console.print(line)
    if result.cache_max_age or replayed:
        console.print(
            f"response cache: {replayed} answers replayed from earlier runs (at most "
            f"{result.cache_max_age or '?'} old); they count in pass rates, not in cost "
            "or latency"
        )
    cache_table = caching_table(caching or [])
    if cache_table is not None:
        console.print(cache_table)
        if any(s.input_usd is None and s.cache_read_tokens for s in caching or []):
            console.print(
                "  local candidates: cache reads are prompt tokens reused from the "
                "prefix cache; their saving is GPU time, inside the measured throughput"
            )
    holdout = (result.router_metrics or {}).get("holdout") or {}
    if holdout:
        console.print(router_table(holdout))
    for name, err in (result.suite_errors or {}).items():
        console.print(f"[red]suite {name} was skipped:[/red] {escape(err)}")
    halted = {p["candidate"]: p["halted"] for p in result.pairs or [] if p.get("halted")}
    for name, why in halted.items():
        console.print(f"[red]candidate {name} stopped calling:[/red] {escape(why)}")
    if result.held:
        console.print(f"[red]{escape(result.held)}[/red]")
    if result.published:
        pub = result.published
        signed = f"signed, key {pub['key_id']}" if pub.get("key_id") else "UNSIGNED"
        console.print(f"published policy v{pub['version']} ({signed}): {pub['uri']}")
        if pub.get("public_key"):
            console.print(f"gateways verify it with the public key {pub['public_key']}")
    promotion = result.promotion
    if promotion:
        verdict = "promoted to champion" if promotion["promoted"] else "kept as candidate"
        console.print(f"policy {verdict}: {promotion['reason']}")
    if result.report_path:
        console.print(f"dashboard: {result.report_path}")


def modes_shown(rows: list[dict[str, Any]]) -> bool:
    """Whether a run's answers came otherwise than by synchronous calls (batches, carried rows):
    the summary and the dashboard show how items were answered only then."""
    return any(r["batch"] or r["carried"] or r["batches"] for r in rows)


def modes_table(rows: list[dict[str, Any]]) -> Table | None:
    """Per candidate: items answered by a batch, by a synchronous call and carried forward from
    an earlier night, the batches' states, and the night's cost against a full synchronous
    night (`routeopt.evals.execution.batch.batch_summary`); None when every row was a call."""
    if not modes_shown(rows):
        return None
    table = Table(title="how items were answered (latency figures come from the sync rows)")
    for col in (
        "candidate",
        "batch",
        "sync",
        "carried",
        "latency rows",
        "batches",
        "cost $",
        "full sync night $",
    ):
        table.add_column(col, justify="left" if col in ("candidate", "batches") else "right")
    for r in rows:
        states = ", ".join(f"{s} {n}" for s, n in sorted(r["batches"].items())) or "-"
        table.add_row(
            r["candidate"],
            str(r["batch"]),
            str(r["sync"]),
            str(r["carried"]),
            str(r["latency_rows"]),
            states,
            _fmt(r["cost_usd"], ".6f"),
            _fmt(r["full_sync_usd"], ".6f"),
        )
    return table
