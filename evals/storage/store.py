"""The outcome store: one embedded DuckDB file, one row per (run, suite, item, candidate).

DuckDB allows one writing process, so workers return `Outcome`s and a single `Store` persists
them. Writes are transactional and idempotent: the primary key makes a repeated write of the
same (run, suite, item, candidate) a no-op, so a resumed or re-run run never duplicates a row.
"""

from __future__ import annotations

import json
import threading
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import duckdb

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
    streamed BOOLEAN,
    PRIMARY KEY (run_id, suite, item_id, candidate)
);
-- Files written before the column existed.
ALTER TABLE outcomes ADD COLUMN IF NOT EXISTS streamed BOOLEAN;
"""


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
    cached_input_tokens: int | None = None
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
    # The answer came as a stream (TTFT measured), or as one body (TTFT and TPOT unknown, NULL).
    streamed: bool | None = None

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.run_id, self.suite, self.item_id, self.candidate)


OUTCOME_COLUMNS: tuple[str, ...] = tuple(f.name for f in fields(Outcome))


def _now() -> datetime:
    return datetime.now(timezone.utc)


# A row skipped for budget is a placeholder: a later real outcome (a resumed run with more
# budget) replaces it. Every other stored row is final and a repeat write keeps it.
_REPLACE_BUDGET_SKIPS = (
    ", ".join(f"{c} = EXCLUDED.{c}" for c in OUTCOME_COLUMNS if c not in
              ("run_id", "suite", "item_id", "candidate"))
    + " WHERE outcomes.error_kind = 'budget'"
)


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

    def begin_run(
        self,
        run_id: str,
        *,
        source: str = "eval",
        config_fingerprint: str | None = None,
        config: dict | None = None,
        candidates: Iterable[dict] = (),
    ) -> bool:
        """Record a run (a no-op when it exists: resuming). Returns True if the run is new."""
        with self._lock:
            existing = self._con.execute(
                "SELECT 1 FROM runs WHERE run_id = ?", [run_id]
            ).fetchone()
        if existing is None:
            self._write(
                "INSERT INTO runs VALUES (?, ?, NULL, 'running', ?, ?, ?) ON CONFLICT DO NOTHING",
                [(run_id, _now(), source, config_fingerprint, json.dumps(config or {}))],
            )
        else:
            self._write("UPDATE runs SET status = 'running' WHERE run_id = ?", [(run_id,)])
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

    def finish_run(self, run_id: str, status: str = "completed") -> None:
        self._write(
            "UPDATE runs SET status = ?, finished_at = ? WHERE run_id = ?",
            [(status, _now(), run_id)],
        )

    def register_suite(
        self, suite: str, version: str, spec: dict, items: Iterable[tuple[str, str, dict]]
    ) -> None:
        """Record a suite version and its items as (item_id, prompt, fields)."""
        self._write(
            "INSERT INTO suites VALUES (?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [(suite, version, json.dumps(spec, sort_keys=True, default=str), _now())],
        )
        self._write(
            "INSERT INTO items VALUES (?, ?, ?, ?, ?) ON CONFLICT DO NOTHING",
            [
                (suite, version, item_id, prompt, json.dumps(f, sort_keys=True, default=str))
                for item_id, prompt, f in items
            ],
        )

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
            for c in OUTCOME_COLUMNS:
                cols[c].append(d[c])
        n = len(cols["run_id"])
        if not n:
            return 0
        with self._lock:
            if self._outcome_schema is None:
                self._outcome_schema = self._con.sql(
                    f"SELECT {', '.join(OUTCOME_COLUMNS)} FROM outcomes LIMIT 0"
                ).to_arrow_table().schema
            batch = pa.table(cols, schema=self._outcome_schema)
            self._con.execute("BEGIN TRANSACTION")
            try:
                self._con.register("_outcome_batch", batch)
                self._con.execute(
                    f"INSERT INTO outcomes ({', '.join(OUTCOME_COLUMNS)}) "
                    "SELECT * FROM _outcome_batch ON CONFLICT DO UPDATE SET "
                    + _REPLACE_BUDGET_SKIPS
                )
                self._con.execute("COMMIT")
            except BaseException:
                self._con.execute("ROLLBACK")
                raise
            finally:
                self._con.unregister("_outcome_batch")
        return n

    def done_items(self, run_id: str, suite: str, candidate: str) -> set[str]:
        """Items of a run that have their final outcome or recorded error (budget skips are not)."""
        with self._lock:
            rows = self._con.execute(
                "SELECT item_id FROM outcomes WHERE run_id = ? AND suite = ? AND candidate = ? "
                "AND error_kind IS DISTINCT FROM 'budget'",
                [run_id, suite, candidate],
            ).fetchall()
        return {r[0] for r in rows}

    def query(self, sql: str, params: Sequence[Any] = ()) -> "Any":
        """Run a read query and return a pandas DataFrame."""
        with self._lock:
            return self._con.execute(sql, list(params)).df()

    def training_frame(self, run_ids: Sequence[str] | None = None) -> "Any":
        """Graded outcomes joined with their prompts: the input of router training.

        Rows with an error carry no evidence about the model's quality and are left out.
        """
        where = "o.error_kind IS NULL AND o.score IS NOT NULL"
        params: list[Any] = []
        if run_ids:
            where += f" AND o.run_id IN ({', '.join('?' for _ in run_ids)})"
            params.extend(run_ids)
        return self.query(
            f"""
            SELECT o.run_id, o.suite, o.suite_version, o.item_id,
                   o.suite || '/' || o.item_id AS request_id,
                   i.prompt, o.candidate AS model, o.score, o.passed, o.cost_usd,
                   o.input_tokens, o.output_tokens, o.latency_s, o.ttft_s
            FROM outcomes o
            JOIN items i ON i.suite = o.suite AND i.version = o.suite_version
                        AND i.item_id = o.item_id
            WHERE {where}
            ORDER BY o.suite, o.item_id, o.candidate
            """,
            params,
        )
