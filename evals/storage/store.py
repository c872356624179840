"""The outcome store: one embedded DuckDB file, one row per (run, suite, item, candidate).

DuckDB allows one writing process, so workers return `Outcome`s and a single `Store` persists
them. Writes are transactional and idempotent: the primary key makes a repeated write of the
same (run, suite, item, candidate) a no-op, so a resumed or re-run run never duplicates a row.
"""

from __future__ import annotations

import json
import threading
import uuid
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb

from routeopt.evals.storage.labels import MISCONFIGURED, SAME_ERROR_MIN_ROWS, LabelSql, same_error_sql

SCHEMA = """
CREATE TABLE IF NOT EXISTS runs (
    run_id VARCHAR PRIMARY KEY,
    started_at TIMESTAMPTZ NOT NULL,
    finished_at TIMESTAMPTZ,
    status VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    config_fingerprint VARCHAR,
    config_json VARCHAR
);
CREATE TABLE IF NOT EXISTS candidates (
    run_id VARCHAR NOT NULL,
    name VARCHAR NOT NULL,
    provider VARCHAR,
    model VARCHAR,
    variant VARCHAR,
    base_url VARCHAR,
    input_price_per_mtok DOUBLE,
    cached_input_price_per_mtok DOUBLE,
    output_price_per_mtok DOUBLE,
    gpu_hour_usd DOUBLE,
    spec_json VARCHAR,
    PRIMARY KEY (run_id, name)
);
CREATE TABLE IF NOT EXISTS suites (
    suite VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    spec_json VARCHAR NOT NULL,
    registered_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (suite, version)
);
CREATE TABLE IF NOT EXISTS items (
    suite VARCHAR NOT NULL,
    version VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    prompt VARCHAR NOT NULL,
    fields_json VARCHAR,
    PRIMARY KEY (suite, version, item_id)
);
CREATE TABLE IF NOT EXISTS outcomes (
    run_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    suite_version VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    passed BOOLEAN,
    score DOUBLE,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cached_input_tokens BIGINT,
    cache_write_input_tokens BIGINT,
    tokens_estimated BOOLEAN DEFAULT FALSE,
    cost_usd DOUBLE,
    ttft_s DOUBLE,
    latency_s DOUBLE,
    tpot_s DOUBLE,
    finish_reason VARCHAR,
    error_kind VARCHAR,
    error VARCHAR,
    reason VARCHAR,
    response VARCHAR,
    attempts INTEGER DEFAULT 1,
    cached BOOLEAN DEFAULT FALSE,
    created_at TIMESTAMPTZ NOT NULL,
    judge_candidate VARCHAR,
    judge_cost_usd DOUBLE,
    judge_input_tokens BIGINT,
    judge_output_tokens BIGINT,
    judge_call_mode VARCHAR,
    streamed BOOLEAN,
    trace_id VARCHAR,
    span_id VARCHAR,
    call_mode VARCHAR,
    batch_id VARCHAR,
    sync_cost_usd DOUBLE,
    measure_key VARCHAR,
    measured_at TIMESTAMPTZ,
    carried_from VARCHAR,
    PRIMARY KEY (run_id, suite, item_id, candidate)
);
CREATE TABLE IF NOT EXISTS preflight (
    run_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    checked_at TIMESTAMPTZ NOT NULL,
    endpoint VARCHAR,
    verdict VARCHAR NOT NULL,
    error_kind VARCHAR,
    error VARCHAR,
    status INTEGER,
    latency_s DOUBLE,
    cost_usd DOUBLE,
    input_tokens BIGINT,
    output_tokens BIGINT,
    streamed BOOLEAN
);
CREATE TABLE IF NOT EXISTS decisions (
    request_id VARCHAR PRIMARY KEY,
    time TIMESTAMPTZ NOT NULL,
    suite VARCHAR,
    quality_target DOUBLE,
    prompt_hash VARCHAR,
    prompt_chars INTEGER,
    text VARCHAR,
    channel VARCHAR,
    policy_version INTEGER,
    model VARCHAR NOT NULL,
    propensity DOUBLE NOT NULL,
    policy_model VARCHAR,
    policy_probability DOUBLE,
    explored BOOLEAN,
    exploration_rate DOUBLE,
    eligible_json VARCHAR,
    canary_share DOUBLE,
    pass_probabilities_json VARCHAR,
    expected_cost_json VARCHAR,
    shadow_channel VARCHAR,
    shadow_version INTEGER,
    shadow_model VARCHAR,
    shadow_json VARCHAR,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cost_usd DOUBLE,
    source_file VARCHAR,
    imported_at TIMESTAMPTZ NOT NULL,
    trace_id VARCHAR,
    span_id VARCHAR
);
CREATE TABLE IF NOT EXISTS feedback (
    request_id VARCHAR NOT NULL,
    source VARCHAR NOT NULL,
    passed BOOLEAN NOT NULL,
    score DOUBLE,
    cost_usd DOUBLE,
    input_tokens BIGINT,
    output_tokens BIGINT,
    recorded_at TIMESTAMPTZ,
    file VARCHAR,
    line VARCHAR,
    imported_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (request_id, source)
);
"""
# Columns added since the first schema: files written by older versions get them on open.
_ADDED_COLUMNS = (
    ("outcomes", "cache_write_input_tokens", "BIGINT"),
    ("outcomes", "judge_candidate", "VARCHAR"),
    ("outcomes", "judge_cost_usd", "DOUBLE"),
    ("outcomes", "judge_input_tokens", "BIGINT"),
    ("outcomes", "judge_output_tokens", "BIGINT"),
    ("outcomes", "judge_call_mode", "VARCHAR"),
    ("outcomes", "streamed", "BOOLEAN"),
    ("outcomes", "trace_id", "VARCHAR"),
    ("outcomes", "span_id", "VARCHAR"),
    ("outcomes", "call_mode", "VARCHAR"),
    ("outcomes", "batch_id", "VARCHAR"),
    ("outcomes", "sync_cost_usd", "DOUBLE"),
    ("outcomes", "measure_key", "VARCHAR"),
    ("outcomes", "measured_at", "TIMESTAMPTZ"),
    ("outcomes", "carried_from", "VARCHAR"),
    ("decisions", "trace_id", "VARCHAR"),
    ("decisions", "span_id", "VARCHAR"),
    ("runs", "batch_option", "VARCHAR"),  # JSON list: the candidates `--batch` batched
)


@dataclass
class Outcome:
    """What one call of one candidate on one item produced: a grade, or a recorded error."""

    run_id: str
    suite: str
    suite_version: str
    item_id: str
    candidate: str
    passed: bool | None = None
    score: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    cached_input_tokens: int | None = None  # input read from a prompt cache (provider or prefix)
    cache_write_input_tokens: int | None = None  # input written to a provider's prompt cache
    tokens_estimated: bool = False
    cost_usd: float | None = None
    ttft_s: float | None = None
    latency_s: float | None = None
    tpot_s: float | None = None
    finish_reason: str | None = None
    error_kind: str | None = None
    error: str | None = None
    reason: str | None = None
    response: str | None = None
    attempts: int = 1
    cached: bool = False
    created_at: datetime | None = None
    # What grading this item cost: the judge's calls, budgeted against the judge candidate.
    judge_candidate: str | None = None
    judge_cost_usd: float | None = None
    judge_input_tokens: int | None = None
    judge_output_tokens: int | None = None
    # Graded from replies kept in `judge_replies` (a judge's batch, else a synchronous call):
    # 'batch', 'sync' or 'mixed'; their cost is booked there. NULL: graded by direct calls.
    judge_call_mode: str | None = None
    # The answer came as a stream (TTFT measured), or as one body (TTFT and TPOT unknown, NULL).
    streamed: bool | None = None
    # The call's span when tracing is on (routeopt.common.tracing): rows and traces join on these.
    trace_id: str | None = None
    span_id: str | None = None
    # How the answer was obtained: 'sync' (a timed call), 'batch' (a provider Batch API: no
    # TTFT or latency, NULL), 'carried' (an earlier run's outcome carried forward, `cached`).
    call_mode: str = "sync"
    batch_id: str | None = None  # the provider's batch that answered it
    sync_cost_usd: float | None = None  # a batched answer's cost at synchronous prices
    # what decides the outcome (item, prompt, grader, model, settings): the incremental night
    # carries a row forward while this is unchanged (`routeopt.evals.execution.reuse`)
    measure_key: str | None = None
    measured_at: datetime | None = None  # when the answer was measured (carried rows: then)
    carried_from: str | None = None  # the run that measured a carried row

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.run_id, self.suite, self.item_id, self.candidate)


OUTCOME_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Outcome))


def _now() -> datetime:
    return datetime.now(timezone.utc)


def new_run_id() -> str:
    """A new run's id: its start time (UTC) and a random suffix, e.g. run-20261201-224217-e83607."""
    return _now().strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


# Errors on our side leave an item for a resumed run: a spend cap (more budget), an endpoint
# that stayed down past the breaker's wait, a refused API key (once it is fixed), the same error
# on every call (once the configuration is fixed). Their rows are placeholders that a later
# outcome replaces; every other stored row is final and a repeat write keeps it.
RESUMABLE_ERROR_KINDS: tuple[str, ...] = ("budget", "circuit_open", "auth", MISCONFIGURED)
_RESUMABLE_SQL = ", ".join(f"'{k}'" for k in RESUMABLE_ERROR_KINDS)
_REPLACE_PLACEHOLDERS = (
    ", ".join(
        f"{c} = EXCLUDED.{c}" for c in OUTCOME_COLUMNS if c not in ("run_id", "suite", "item_id", "candidate")
    )
    + f" WHERE outcomes.error_kind IN ({_RESUMABLE_SQL})"
)


def _batched(spec: dict) -> bool:
    """Whether a recorded candidate spec answers through a Batch API (no `batch`: it does not)."""
    return bool((spec.get("batch") or {}).get("enabled"))


class ResumeConflict(ValueError):
    """A run cannot be resumed: its config or suites changed since it started."""


class Store:
    """A DuckDB file opened by the one process that writes it. Thread-safe within that process."""

    def __init__(self, path: str | Path, read_only: bool = False):
        self.path = Path(path)
        if not read_only:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._con = duckdb.connect(str(self.path), read_only=read_only)
        self._lock = threading.Lock()
        self._outcome_schema: Any = None
        if not read_only:
            self._con.execute(SCHEMA)
            for table, column, kind in _ADDED_COLUMNS:
                self._con.execute(f"ALTER TABLE {table} ADD COLUMN IF NOT EXISTS {column} {kind}")

    def close(self) -> None:
        with self._lock:
            self._con.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        if not rows:
            return
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.executemany(sql, rows)
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def write(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """Run one statement per row in one transaction (the batch and reuse records)."""
        self._write(sql, rows)

    def begin_run(
        self,
        run_id: str,
        *,
        source: str = "eval",
        config_fingerprint: str | None = None,
        config: dict | None = None,
        candidates: Iterable[dict] = (),
        batch_option: Sequence[str] = (),
    ) -> bool:
        """Record a run (a no-op when it exists: resuming). Returns True if the run is new.
        `batch_option`: the candidates the run's `--batch` batched (a resume keeps them)."""
        with self._lock:
            existing = self._con.execute("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if existing is None:
            self._write(
                "INSERT INTO runs (run_id, started_at, finished_at, status, source, config_fingerprint, "
                "config_json, batch_option) VALUES (?, ?, NULL, 'running', ?, ?, ?, ?) ON CONFLICT DO NOTHING",
                [
                    (
                        run_id,
                        _now(),
                        source,
                        config_fingerprint,
                        json.dumps(config or {}),
                        json.dumps(sorted(batch_option)) if batch_option else None,
                    )
                ],
            )
        else:
            self._write("UPDATE runs SET status = 'running' WHERE run_id = ?", [(run_id,)])
            # a candidate the run never measured is recorded as it is now (a fixed URL or key)
            self._write(
                "DELETE FROM candidates WHERE run_id = ? AND name = ?",
                [(run_id, name) for name in self._unmeasured(run_id)],
            )
        self._write(
            "INSERT INTO candidates VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [
                (
                    run_id,
                    c["name"],
                    c.get("provider"),
                    c.get("model"),
                    c.get("variant"),
                    c.get("base_url"),
                    c.get("input_price_per_mtok"),
                    c.get("cached_input_price_per_mtok"),
                    c.get("output_price_per_mtok"),
                    c.get("gpu_hour_usd"),
                    json.dumps(c, sort_keys=True, default=str),
                )
                for c in candidates
            ],
        )
        return existing is None

    def changes_since(
        self, run_id: str, candidates: dict[str, dict], suite_versions: dict[str, str]
    ) -> list[str]:
        """What differs between a run as recorded and as it would now be resumed.

        `candidates`: name -> the fields that change what it answers or costs (only fields the
        run recorded are compared); `suite_versions`: suite -> version about to run. Candidates
        and suites the run has not met yet are no change, nor is a candidate the run has not
        measured (every row of it a placeholder: a misconfigured candidate, once fixed).
        """
        unmeasured = self._unmeasured(run_id)
        with self._lock:
            stored = self._con.execute(
                "SELECT name, spec_json FROM candidates WHERE run_id = ?", [run_id]
            ).fetchall()
            versions = self._con.execute(
                "SELECT DISTINCT suite, suite_version FROM outcomes WHERE run_id = ? "
                "ORDER BY suite, suite_version",
                [run_id],
            ).fetchall()
        changes = []
        for name, spec_json in stored:
            if name in unmeasured:
                continue
            now = candidates.get(name)
            before = json.loads(spec_json or "{}")
            if now is not None and _batched(before) != _batched(now):  # absent: synchronous
                on_off = {True: "on", False: "off"}
                changes.append(
                    f"candidate {name!r}: batch mode {on_off[_batched(before)]} -> {on_off[_batched(now)]}"
                )
                now = {k: v for k, v in now.items() if k != "batch"}
            for field in sorted(set(now or {}) & set(before)):
                a, b = before[field], now[field]
                if isinstance(a, dict) and isinstance(b, dict):  # a section: the keys both have
                    changes += [
                        f"candidate {name!r}: {field}.{k} {a[k]!r} -> {b[k]!r}"
                        for k in sorted(set(a) & set(b))
                        if a[k] != b[k]
                    ]
                elif a != b:
                    changes.append(f"candidate {name!r}: {field} {a!r} -> {b!r}")
        for suite, version in versions:
            if suite in suite_versions and suite_versions[suite] != version:
                changes.append(f"suite {suite!r}: version {version} -> {suite_versions[suite]}")
        return changes

    def _unmeasured(self, run_id: str) -> set[str]:
        """Candidates of a run with no answer and no final error in it: only placeholders that
        a resumed run replaces (`RESUMABLE_ERROR_KINDS`)."""
        with self._lock:
            rows = self._con.execute(
                "SELECT name FROM candidates c WHERE run_id = ? AND NOT EXISTS (SELECT 1 FROM "
                "outcomes o WHERE o.run_id = c.run_id AND o.candidate = c.name AND "
                f"coalesce(o.error_kind, '') NOT IN ({_RESUMABLE_SQL}))",
                [run_id],
            ).fetchall()
        return {r[0] for r in rows}

    def batch_option(self, run_id: str) -> list[str] | None:
        """The candidates a run's `--batch` batched ([] for none); None when there is no such run."""
        if not self.has_table("runs"):
            return None
        with self._lock:
            cols = {r[0] for r in self._con.execute("DESCRIBE runs").fetchall()}
            if "batch_option" not in cols:  # a database from before the option (read-only)
                row = self._con.execute("SELECT NULL FROM runs WHERE run_id = ?", [run_id]).fetchone()
            else:
                row = self._con.execute("SELECT batch_option FROM runs WHERE run_id = ?", [run_id]).fetchone()
        if row is None:
            return None
        return json.loads(row[0]) if row[0] else []

    def check_resume(self, run_id: str, candidates: dict[str, dict], suite_versions: dict[str, str]) -> None:
        """Refuse to resume a run whose candidates or suites changed since it started: its
        outcomes would silently mix two configurations (see `changes_since`)."""
        changes = self.changes_since(run_id, candidates, suite_versions)
        if changes:
            raise ResumeConflict(
                f"cannot resume run {run_id!r}: {'; '.join(changes)} since it started, and its "
                "outcomes would mix both. Start a new run instead (run again without --run-id, "
                f"or with a new one); the outcomes recorded under {run_id!r} stay as they are."
            )

    def record_preflight(self, run_id: str, probes: Iterable[dict]) -> None:
        """Keep each candidate's preflight probe (`routeopt.evals.execution.preflight.Probe` as a dict):
        its verdict, what the endpoint said and what it cost (counted in the run's spend). A run
        that stopped on its preflight has these rows and no `runs` row."""
        now = _now()
        self._write(
            "INSERT INTO preflight VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    run_id,
                    p["candidate"],
                    now,
                    p.get("endpoint"),
                    p["verdict"],
                    p.get("error_kind"),
                    p.get("error"),
                    p.get("status"),
                    p.get("latency_s"),
                    p.get("cost_usd"),
                    p.get("input_tokens"),
                    p.get("output_tokens"),
                    p.get("streamed"),
                )
                for p in probes
            ],
        )

    def mark_same_errors(self, run_id: str, min_rows: int = SAME_ERROR_MIN_ROWS) -> list[dict]:
        """Apply the same-error rule of `routeopt.evals.storage.labels` to one run: the rows of each
        candidate whose every call got the same error become `misconfigured` (the message keeps
        their former kind). Returns one dict per such candidate: candidate, n, error_kind, error."""
        found = self.query(same_error_sql(), [run_id, min_rows]).to_dict("records")
        self._write(
            "UPDATE outcomes SET error = error_kind || ': ' || coalesce(error, ''), error_kind = ? "
            "WHERE run_id = ? AND candidate = ? AND error_kind = ? AND coalesce(error, '') = ?",
            [(MISCONFIGURED, run_id, f["candidate"], f["error_kind"], f["error"] or "") for f in found],
        )
        return [{**f, "n": int(f["n"])} for f in found]

    def finish_run(self, run_id: str, status: str = "completed") -> None:
        self._write(
            "UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?",
            [(status, _now(), run_id)],
        )

    def register_suite(
        self, suite: str, version: str, spec: dict, items: Iterable[tuple[str, str, dict]]
    ) -> None:
        """Record a suite version and its items as (item_id, prompt, fields), in one transaction.

        The items go in as one Arrow table (one INSERT ... SELECT), as outcomes do: executemany
        took ~4 ms a row, 5 s for the demo's 1,250 items before its first call."""
        import pyarrow as pa

        ids, prompts, fields = [], [], []
        for item_id, prompt, f in items:
            ids.append(item_id)
            prompts.append(prompt)
            fields.append(json.dumps(f, sort_keys=True, default=str))
        batch = pa.table(
            {
                "suite": [suite] * len(ids),
                "version": [version] * len(ids),
                "item_id": ids,
                "prompt": prompts,
                "fields_json": fields,
            },
            schema=pa.schema(
                [(c, pa.string()) for c in ("suite", "version", "item_id", "prompt", "fields_json")]
            ),
        )
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.execute(
                    "INSERT INTO suites VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
                    (suite, version, json.dumps(spec, sort_keys=True, default=str), _now()),
                )
                self._con.register("_item_batch", batch)
                self._con.execute("INSERT INTO items SELECT * FROM _item_batch ON CONFLICT DO NOTHING")
                self._con.unregister("_item_batch")
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise

    def write_outcomes(self, outcomes: Iterable[Outcome]) -> int:
        """Persist outcomes in one transaction; rows already stored are kept, never duplicated.

        The batch goes in as one Arrow table (one INSERT ... SELECT): DuckDB's executemany
        costs ~7 ms of CPU per row, which capped the runner at ~150 calls/s.
        """
        import pyarrow as pa

        cols: dict[str, list[Any]] = {c: [] for c in OUTCOME_COLUMNS}
        for o in outcomes:
            d = asdict(o)
            d["created_at"] = d["created_at"] or _now()
            d["measured_at"] = d["measured_at"] or d["created_at"]
            for c in OUTCOME_COLUMNS:
                cols[c].append(d[c])
        n = len(cols["run_id"])
        if not n:
            return 0
        with self._lock:
            if self._outcome_schema is None:
                self._outcome_schema = (
                    self._con.sql(f"SELECT {', '.join(OUTCOME_COLUMNS)} FROM outcomes LIMIT 0")
                    .to_arrow_table()
                    .schema
                )
            batch = pa.table(cols, schema=self._outcome_schema)
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.register("_outcome_batch", batch)
                self._con.execute(
                    f"INSERT INTO outcomes ({', '.join(OUTCOME_COLUMNS)}) "
                    "SELECT * FROM _outcome_batch ON CONFLICT DO UPDATE SET " + _REPLACE_PLACEHOLDERS
                )
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            finally:
                self._con.unregister("_outcome_batch")
        return n

    def done_items(self, run_id: str, suite: str, candidate: str) -> set[str]:
        """Items of a run that have their final outcome or recorded error (placeholders for
        errors on our side, `RESUMABLE_ERROR_KINDS`, are not: a resumed run retries them)."""
        with self._lock:
            rows = self._con.execute(
                "SELECT item_id FROM outcomes WHERE run_id = ? AND suite = ? AND candidate = ? "
                f"AND (error_kind IS NULL OR error_kind NOT IN ({_RESUMABLE_SQL}))",
                [run_id, suite, candidate],
            ).fetchall()
        return {r[0] for r in rows}

    def has_table(self, name: str) -> bool:
        """Whether the file has a table (a read-only store opened on an older file may not)."""
        with self._lock:
            return bool(
                self._con.execute(
                    "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [name]
                ).fetchone()[0]
            )

    def write_frame(self, frame: "Any", sql: str) -> None:
        """Run one writing statement that reads a pandas/Arrow frame as `_frame`, atomically."""
        if not len(frame):
            return
        with self._lock:
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.register("_frame", frame)
                self._con.execute(sql)
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            finally:
                self._con.unregister("_frame")

    def query(self, sql: str, params: Sequence[Any] = ()) -> "Any":
        """Run a read query and return a pandas DataFrame."""
        with self._lock:
            return self._con.execute(sql, list(params)).df()

    def training_frame(self, run_ids: Sequence[str] | None = None) -> "Any":
        """Labelled outcomes of these runs (default: every run) joined with their prompts.

        Labels follow `routeopt.evals.storage.labels`: a candidate's own error is a failure (passed
        False, score 0) and errors on our side are left out. A failed call without a recorded
        cost gets the mean cost of the candidate's calls on that suite in that run, so the
        router sees a price for the items a model fails, not only for those it answers.
        """
        where, params = "TRUE", []
        if run_ids:
            where = f"o.run_id IN ({', '.join('?' for _ in run_ids)})"
            params.extend(run_ids)
        return self._labelled(f"SELECT * FROM outcomes o WHERE {where}", params)

    def latest_frame(self, run_id: str, *, candidates: Sequence[str], max_age_days: float) -> "Any":
        """What a nightly run trains on: per (suite, candidate), the labelled outcomes of the
        latest run that measured it, so deployments over different candidate subsets train on
        the whole fleet.

        Only completed runs (and `run_id` itself) started at most `max_age_days` before `run_id`
        count, only `candidates` (the fleet in the config now), and per suite only its newest
        version, so every candidate of a suite is compared on the same items.
        """
        lab = LabelSql("o.")
        sql = f"""
            WITH me AS (SELECT started_at FROM runs WHERE run_id = ?),
            pairs AS (
                SELECT o.suite, o.candidate, o.suite_version, o.run_id, r.started_at
                FROM outcomes o JOIN runs r USING (run_id), me
                WHERE (r.status LIKE 'completed%' OR o.run_id = ?) AND {lab.labeled}
                  AND r.started_at <= me.started_at
                  AND r.started_at >= me.started_at - to_microseconds(CAST(? * 86400e6 AS BIGINT))
                  AND o.candidate IN ({", ".join("?" for _ in candidates) or "NULL"})
                GROUP BY ALL
            ),
            versions AS (SELECT suite, arg_max(suite_version, started_at) AS suite_version
                         FROM pairs GROUP BY suite),
            chosen AS (SELECT p.suite, p.candidate, arg_max(p.run_id, p.started_at) AS run_id
                       FROM pairs p JOIN versions v USING (suite, suite_version)
                       GROUP BY p.suite, p.candidate)
            SELECT o.* FROM outcomes o JOIN chosen c USING (run_id, suite, candidate)
        """
        return self._labelled(sql, [run_id, run_id, float(max_age_days), *candidates])

    def _labelled(self, rows_sql: str, params: list[Any]) -> "Any":
        """The training columns of the outcome rows `rows_sql` selects (labelled rows only).

        Each item's prompt is read once and its rows (one per candidate and run) hold a code
        into the distinct prompts (a categorical column): a million rows of 1,500-character
        prompts would otherwise hold 1.5 GB of copies."""
        import numpy as np
        import pandas as pd

        lab = LabelSql("o.")
        frame = self.query(
            f"""
            WITH o AS ({rows_sql})
            SELECT o.run_id, o.suite, o.suite_version, o.item_id,
                   o.suite || '/' || o.item_id AS request_id,
                   i.rowid AS prompt, o.candidate AS model, {lab.score} AS score, {lab.passed} AS passed,
                   coalesce(o.cost_usd, avg(o.cost_usd) OVER (
                       PARTITION BY o.run_id, o.suite, o.candidate)) AS cost_usd,
                   o.input_tokens, o.output_tokens, o.latency_s, o.ttft_s, o.error_kind
            FROM o
            JOIN items i ON i.suite = o.suite AND i.version = o.suite_version
                        AND i.item_id = o.item_id
            WHERE {lab.labeled}
            ORDER BY o.suite, o.item_id, o.candidate
            """,
            params,
        )
        rows, codes = np.unique(frame["prompt"].to_numpy(dtype=np.int64), return_inverse=True)
        prompts = self.query(
            "SELECT prompt FROM items, (SELECT unnest(?::BIGINT[]) AS r) u "
            "WHERE items.rowid = u.r ORDER BY u.r",
            [rows.tolist()],
        )["prompt"]
        same, texts = pd.factorize(prompts)
        frame["prompt"] = pd.Categorical.from_codes(same[codes] if len(rows) else codes, categories=texts)
        return frame
