"""Replay results in DuckDB and in text: `replay_runs` (one row per replay, speed, probe and model,
`*` for all) and `replay_requests` (every arrival as sent), and the table the command prints. A
sweep probes a speed more than once (`probe` 0, 1, ...): every probe is kept.

A partial or interrupted replay is stored like a complete one, with its `status`; a replay whose
generator fell behind keeps its figures in the database (nothing measured is lost) but the
printed table shows its lateness instead of latencies that would describe this machine.
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any, Sequence

import pandas as pd

from routeopt.evals.selfhost.replay import QUANTILES, ReplayRun, Slo

if TYPE_CHECKING:
    from routeopt.evals.storage.store import Store

RUNS_TABLE, REQUESTS_TABLE = "replay_runs", "replay_requests"
_DIST = ("ttft", "tpot", "itl", "e2e", "queue", "lateness")
SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {RUNS_TABLE} (
    replay_id VARCHAR NOT NULL, speed DOUBLE NOT NULL, probe INTEGER NOT NULL DEFAULT 0,
    model VARCHAR NOT NULL, source VARCHAR, status VARCHAR, generator_limited BOOLEAN, meets_slo BOOLEAN,
    arrivals INTEGER, sent INTEGER, completed INTEGER, errors INTEGER, error_kinds_json VARCHAR,
    offered_rps DOUBLE, achieved_rps DOUBLE, completed_rps DOUBLE, goodput_rps DOUBLE, good_share DOUBLE,
    {", ".join(f"{d}_p{q} DOUBLE" for d in _DIST for q in QUANTILES)}, lateness_max DOUBLE,
    in_flight_max INTEGER, peak_output_tok_s DOUBLE, output_tok_s DOUBLE,
    mean_input_tokens DOUBLE, mean_output_tokens DOUBLE,
    ttft_target_s DOUBLE, latency_target_s DOUBLE, min_good DOUBLE, notes_json VARCHAR,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (replay_id, speed, probe, model)
);
CREATE TABLE IF NOT EXISTS {REQUESTS_TABLE} (
    replay_id VARCHAR NOT NULL, speed DOUBLE NOT NULL, probe INTEGER NOT NULL DEFAULT 0,
    idx INTEGER NOT NULL, model VARCHAR,
    "where" VARCHAR, due_s DOUBLE, sent_s DOUBLE, ttft_s DOUBLE, e2e_s DOUBLE, tpot_s DOUBLE,
    input_tokens INTEGER, max_tokens INTEGER, output_tokens INTEGER, in_flight INTEGER,
    ok BOOLEAN, error_kind VARCHAR,
    PRIMARY KEY (replay_id, speed, probe, idx)
);
"""


def new_replay_id() -> str:
    return f"replay-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}"


def run_rows(
    replay_id: str,
    run: ReplayRun,
    figures: dict[str, dict],
    slo: Slo,
    source: str,
    notes: Sequence[str],
    probe: int = 0,
) -> list[dict[str, Any]]:
    now = datetime.now(timezone.utc)
    rows = []
    for model, f in figures.items():
        row: dict[str, Any] = {
            "replay_id": replay_id,
            "speed": run.speed,
            "probe": probe,
            "model": model,
            "source": source,
            "status": run.status,
            "generator_limited": f["generator_limited"],
            "meets_slo": f["meets_slo"],
            **{
                k: f[k]
                for k in (
                    "arrivals",
                    "sent",
                    "completed",
                    "errors",
                    "offered_rps",
                    "achieved_rps",
                    "completed_rps",
                    "goodput_rps",
                    "good_share",
                    "in_flight_max",
                    "peak_output_tok_s",
                    "output_tok_s",
                    "mean_input_tokens",
                    "mean_output_tokens",
                )
            },
            "error_kinds_json": json.dumps(f["error_kinds"], sort_keys=True),
            "ttft_target_s": slo.ttft_s,
            "latency_target_s": slo.latency_s,
            "min_good": slo.min_good,
            "notes_json": json.dumps({"notes": list(notes), "down": run.down}),
            "created_at": now,
        }
        for d in _DIST:
            stats = f[f"{d}_s"]
            for q in QUANTILES:
                row[f"{d}_p{q}"] = None if stats is None else stats[f"p{q}"]
        row["lateness_max"] = None if f["lateness_s"] is None else f["lateness_s"]["max"]
        rows.append(row)
    return rows


def request_frame(replay_id: str, run: ReplayRun, probe: int = 0) -> pd.DataFrame:
    return pd.DataFrame(
        [
            {
                "replay_id": replay_id,
                "speed": run.speed,
                "probe": probe,
                "idx": r.index,
                "model": r.model,
                "where": r.where,
                "due_s": r.due_s,
                "sent_s": r.sent_s,
                "ttft_s": r.ttft_s,
                "e2e_s": r.e2e_s,
                "tpot_s": r.tpot_s,
                "input_tokens": r.input_tokens,
                "max_tokens": r.max_tokens,
                "output_tokens": r.output_tokens,
                "in_flight": r.in_flight,
                "ok": r.ok,
                "error_kind": r.error_kind,
            }
            for r in run.records
        ]
    )


def save(store: "Store", rows: list[dict[str, Any]], requests: pd.DataFrame) -> None:
    """One probe of one replay at one speed, in one transaction (tables created if missing,
    those of a store written before probes were numbered rebuilt with `probe` 0)."""
    frame = pd.DataFrame(rows)
    with store._lock:
        con = store._con
        con.execute("BEGIN TRANSACTION")
        try:
            _schema(con)
            for table, data in ((RUNS_TABLE, frame), (REQUESTS_TABLE, requests)):
                if len(data):
                    con.register("_replay", data)
                    cols = ", ".join(f'"{c}"' for c in data.columns)
                    con.execute(
                        f"INSERT INTO {table} ({cols}) SELECT {cols} FROM _replay ON CONFLICT DO NOTHING"
                    )
                    con.unregister("_replay")
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise


def _schema(con: Any) -> None:
    """Create the tables; rebuild any without `probe`, whose key could hold one probe per speed
    (a sweep's second probe of a speed was dropped on conflict), keeping every row."""
    for table in (RUNS_TABLE, REQUESTS_TABLE):
        cols = {
            r[0]
            for r in con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = ?", [table]
            ).fetchall()
        }
        if cols and "probe" not in cols:
            con.execute(f"ALTER TABLE {table} RENAME TO {table}_unnumbered")
    con.execute(SCHEMA)
    for table in (RUNS_TABLE, REQUESTS_TABLE):
        old = f"{table}_unnumbered"
        if con.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_name = ?", [old]
        ).fetchall():
            con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM {old}")
            con.execute(f"DROP TABLE {old}")


def load_runs(store: "Store", replay_id: str | None = None) -> pd.DataFrame:
    """The rows of one replay (default: the latest), ordered by speed; empty without any."""
    if not store.has_table(RUNS_TABLE):
        return pd.DataFrame()
    if replay_id is None:
        latest = store.query(f"SELECT replay_id FROM {RUNS_TABLE} ORDER BY created_at DESC LIMIT 1")
        if latest.empty:
            return latest
        replay_id = str(latest.replay_id.iloc[0])
    return store.query(
        f"SELECT * FROM {RUNS_TABLE} WHERE replay_id = ? ORDER BY speed, probe, model", [replay_id]
    )


def replay_capacity(store: "Store", model: str) -> tuple[float, str, float] | None:
    """(output tok/s held, replay id, speed) for a model: the busiest minute's output tokens/s
    (median over the probes that met) at the highest speed of its latest replay whose verdict met
    the SLO: more than half of that speed's probes met it, complete, without the generator falling
    behind (as `replay.verdicts`); None if no speed of it did."""
    if not store.has_table(RUNS_TABLE):
        return None
    rows = store.query(
        f"""WITH probes AS (
                SELECT replay_id, speed, peak_output_tok_s,
                       meets_slo AND NOT generator_limited AND status = 'complete' AS held
                FROM {RUNS_TABLE}
                WHERE model = ? AND replay_id = (SELECT replay_id FROM {RUNS_TABLE} WHERE model = ?
                                                 ORDER BY created_at DESC LIMIT 1))
            SELECT replay_id, speed, median(peak_output_tok_s) FILTER (WHERE held) AS peak_output_tok_s
            FROM probes GROUP BY replay_id, speed
            HAVING 2 * count(*) FILTER (WHERE held) > count(*)
            ORDER BY speed DESC LIMIT 1""",
        [model, model],
    )
    if rows.empty or not rows.peak_output_tok_s.iloc[0]:
        return None
    r = rows.iloc[0]
    return float(r.peak_output_tok_s), str(r.replay_id), float(r.speed)


def _ms(stats: dict | None) -> str:
    return "-" if stats is None else "/".join(f"{stats[f'p{q}'] * 1000:.0f}" for q in QUANTILES)


def format_speed(run: ReplayRun, figures: dict[str, dict], probe: int = 0) -> str:
    """The printed table for one probe of one speed: per model and overall."""
    head = (
        f"{'model':<16} {'sent/arr':>10} {'offered':>8} {'achieved':>8} {'done/s':>7} {'good/s':>7} "
        f"{'TTFT ms p50/95/99':>18} {'TPOT ms':>12} {'ITL ms':>12} {'E2E ms p50/95/99':>18} "
        f"{'queue ms':>12} {'late ms p50/99':>14}  errors"
    )
    again = f" (probe {probe + 1})" if probe else ""
    lines = [f"speed {run.speed:g}x{again}: {run.status}, {run.wall_s:.1f} s", head]
    for model, f in figures.items():
        late = f["lateness_s"]
        late_txt = "-" if late is None else f"{late['p50'] * 1000:.2f}/{late['p99'] * 1000:.2f}"
        rate = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        if f["generator_limited"]:
            latencies = ["(generator fell behind: not the server's)", "", "", "", ""]
        else:
            latencies = [
                _ms(f["ttft_s"]),
                _ms(f["tpot_s"]),
                _ms(f["itl_s"]),
                _ms(f["e2e_s"]),
                _ms(f["queue_s"]),
            ]
        errs = ", ".join(f"{k} {v}" for k, v in sorted(f["error_kinds"].items())) or "-"
        lines.append(
            f"{model[:16]:<16} {f['sent']:>4}/{f['arrivals']:<5} {rate(f['offered_rps']):>8} "
            f"{rate(f['achieved_rps']):>8} {f['completed_rps']:>7.1f} {rate(f['goodput_rps']):>7} "
            f"{latencies[0]:>18} {latencies[1]:>12} {latencies[2]:>12} {latencies[3]:>18} "
            f"{latencies[4]:>12} {late_txt:>14}  {errs}"
        )
    for model, why in run.down.items():
        lines.append(f"  {model}: {why}")
    overall = figures["*"]
    if overall["generator_limited"]:
        lines.append(
            "  the generator could not keep up (send lateness or rate): these figures measure "
            "this machine, not the server; replay at a lower speed or on more cores"
        )
    return "\n".join(lines)
