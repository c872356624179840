"""What a run has sent to provider Batch APIs, kept in the outcome store before anything is paid.

A submission is planned (its lines and their `custom_id`s written) before its file is uploaded
or its batch created, and each provider id is written the moment the provider returns it, so a
run killed at any moment finds on resume every batch it may have paid for
(`routeopt.evals.execution.batch`). Lines are matched back by `custom_id`; a line's outcome row
is the proof that it was answered (written before the line is marked so).

Submission states (ours): planned -> uploaded (OpenAI: the input file exists) -> submitted (the
provider has a batch; `provider_state` is its own: validating, in_progress, finalizing, ...)
-> ended (terminal at the provider) -> harvested (every line's result stored). `lost`: the
provider no longer knows the batch; `rejected`: the provider refused to create it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Iterable

from routeopt.evals.storage.store import Store

SCHEMA = """
CREATE TABLE IF NOT EXISTS batch_jobs (
    submission_id VARCHAR PRIMARY KEY,
    run_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    provider VARCHAR NOT NULL,
    round INTEGER NOT NULL,
    state VARCHAR NOT NULL,
    provider_state VARCHAR,
    file_id VARCHAR,
    batch_id VARCHAR,
    output_file_id VARCHAR,
    error_file_id VARCHAR,
    n_requests INTEGER NOT NULL,
    n_bytes BIGINT,
    est_tokens BIGINT,
    counts_json VARCHAR,
    error VARCHAR,
    created_at TIMESTAMPTZ NOT NULL,
    submitted_at TIMESTAMPTZ,
    updated_at TIMESTAMPTZ,
    ended_at TIMESTAMPTZ
);
CREATE TABLE IF NOT EXISTS batch_lines (
    custom_id VARCHAR PRIMARY KEY,
    submission_id VARCHAR NOT NULL,
    run_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    attempt INTEGER NOT NULL,
    est_tokens BIGINT,
    state VARCHAR NOT NULL,
    error VARCHAR
);
"""
OPEN_STATES = ("planned", "uploaded", "submitted", "ended")
LINE_FINAL = ("answered", "errored", "expired", "cancelled", "invalid", "missing")


def _now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass
class Job:
    """One submission as recorded."""

    submission_id: str
    run_id: str
    candidate: str
    provider: str
    round: int
    state: str
    provider_state: str | None
    file_id: str | None
    batch_id: str | None
    n_requests: int
    est_tokens: int
    created_at: datetime
    submitted_at: datetime | None
    error: str | None = None

    @property
    def open(self) -> bool:
        return self.state in OPEN_STATES


@dataclass(frozen=True)
class Line:
    custom_id: str
    suite: str
    item_id: str
    attempt: int
    est_tokens: int
    state: str = "planned"


class BatchRecords:
    """The batch tables of one store (created on first use)."""

    def __init__(self, store: Store):
        self.store = store
        with store._lock:
            store._con.execute(SCHEMA)

    def plan(self, job: Job, lines: Iterable[Line], n_bytes: int) -> None:
        """Record a submission and its lines in one transaction, before anything is sent."""
        rows = list(lines)
        with self.store._lock:
            con = self.store._con
            con.execute("BEGIN TRANSACTION")
            try:
                con.execute(
                    "INSERT INTO batch_jobs (submission_id, run_id, candidate, provider, round, "
                    "state, n_requests, n_bytes, est_tokens, created_at) "
                    "VALUES (?, ?, ?, ?, ?, 'planned', ?, ?, ?, ?)",
                    [
                        job.submission_id,
                        job.run_id,
                        job.candidate,
                        job.provider,
                        job.round,
                        len(rows),
                        n_bytes,
                        job.est_tokens,
                        job.created_at,
                    ],
                )
                con.executemany(
                    "INSERT INTO batch_lines VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'planned', NULL)",
                    [
                        (
                            ln.custom_id,
                            job.submission_id,
                            job.run_id,
                            ln.suite,
                            ln.item_id,
                            job.candidate,
                            ln.attempt,
                            ln.est_tokens,
                        )
                        for ln in rows
                    ],
                )
                con.execute("COMMIT")
            except BaseException:
                con.execute("ROLLBACK")
                raise

    def update(self, submission_id: str, **values: Any) -> None:
        """Set columns of a submission (provider ids the moment they are known, states)."""
        if "counts" in values:
            values["counts_json"] = json.dumps(values.pop("counts"), sort_keys=True)
        values["updated_at"] = _now()
        cols = ", ".join(f"{k} = ?" for k in values)
        self.store.write(
            f"UPDATE batch_jobs SET {cols} WHERE submission_id = ?", [(*values.values(), submission_id)]
        )

    def mark_lines(self, states: Iterable[tuple[str, str, str | None]]) -> None:
        """(custom_id, state, error) for lines whose result is known."""
        self.store.write(
            "UPDATE batch_lines SET state = ?, error = ? WHERE custom_id = ?",
            [(state, error, cid) for cid, state, error in states],
        )

    def jobs(self, run_id: str, candidate: str | None = None) -> list[Job]:
        where, params = "run_id = ?", [run_id]
        if candidate is not None:
            where += " AND candidate = ?"
            params.append(candidate)
        frame = self.store.query(
            "SELECT submission_id, run_id, candidate, provider, round, state, provider_state, "
            "file_id, batch_id, n_requests, est_tokens, created_at, submitted_at, error "
            f"FROM batch_jobs WHERE {where} ORDER BY created_at, submission_id",
            params,
        )
        return [Job(**{k: (None if _isna(v) else v) for k, v in r.items()}) for r in frame.to_dict("records")]

    def lines(self, submission_id: str) -> dict[str, Line]:
        frame = self.store.query(
            "SELECT custom_id, suite, item_id, attempt, est_tokens, state FROM batch_lines "
            "WHERE submission_id = ?",
            [submission_id],
        )
        return {r["custom_id"]: Line(**r) for r in frame.to_dict("records")}

    def line_history(self, run_id: str, candidate: str) -> dict[tuple[str, str], tuple[int, str]]:
        """(suite, item) -> (highest attempt, its state) of a candidate's lines in a run."""
        frame = self.store.query(
            "SELECT suite, item_id, arg_max(attempt, attempt) AS attempt, "
            "arg_max(state, attempt) AS state FROM batch_lines WHERE run_id = ? AND candidate = ? "
            "GROUP BY suite, item_id",
            [run_id, candidate],
        )
        return {(r["suite"], r["item_id"]): (int(r["attempt"]), r["state"]) for r in frame.to_dict("records")}

    def known_batch_ids(self) -> set[str]:
        frame = self.store.query("SELECT batch_id FROM batch_jobs WHERE batch_id IS NOT NULL")
        return set(frame["batch_id"])

    def summary(self, run_id: str) -> list[dict[str, Any]]:
        """Per candidate: submissions by state and lines by state (the run summary)."""
        return self.store.query(
            "SELECT j.candidate, j.submission_id, j.batch_id, j.state, j.provider_state, "
            "j.n_requests, count(*) FILTER (WHERE l.state = 'answered') AS answered, "
            "count(*) FILTER (WHERE l.state NOT IN ('answered', 'planned')) AS unanswered, j.error "
            "FROM batch_jobs j LEFT JOIN batch_lines l USING (submission_id) "
            "WHERE j.run_id = ? GROUP BY ALL ORDER BY j.candidate, j.submission_id",
            [run_id],
        ).to_dict("records")


def _isna(v: Any) -> bool:
    try:
        return v != v  # NaN / NaT
    except Exception:
        return False
