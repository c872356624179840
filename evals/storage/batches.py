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

Judged suites add a second stage (`routeopt.evals.execution.judge_batch`): submissions and
lines with `judge_for` set carry a judge's calls for that candidate's answers. Answers waiting
for them are kept in `batch_answers` (not yet outcomes), and every judge reply they get, from a
batch or a synchronous call, in `judge_replies`, before any graded row is written from it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timezone
from typing import Any, Iterable

from routeopt.evals.storage.store import RESUMABLE_ERROR_KINDS, Outcome, Store

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
ALTER TABLE batch_jobs ADD COLUMN IF NOT EXISTS judge_for VARCHAR;
ALTER TABLE batch_lines ADD COLUMN IF NOT EXISTS judge_for VARCHAR;
CREATE TABLE IF NOT EXISTS batch_answers (
    run_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    cost_usd DOUBLE,
    row_json VARCHAR NOT NULL,
    kept_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, suite, item_id, candidate)
);
CREATE TABLE IF NOT EXISTS judge_replies (
    run_id VARCHAR NOT NULL,
    judge_for VARCHAR NOT NULL,
    judge VARCHAR NOT NULL,
    request_key VARCHAR NOT NULL,
    mode VARCHAR NOT NULL,
    batch_id VARCHAR,
    custom_id VARCHAR,
    text VARCHAR NOT NULL,
    finish_reason VARCHAR,
    input_tokens BIGINT,
    output_tokens BIGINT,
    cached_input_tokens BIGINT,
    cache_write_input_tokens BIGINT,
    tokens_estimated BOOLEAN,
    cost_usd DOUBLE,
    recorded_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (run_id, judge_for, judge, request_key)
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
    judge_for: str | None = None  # a judge's submission: the candidate whose answers it grades

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
                    "state, n_requests, n_bytes, est_tokens, created_at, judge_for) "
                    "VALUES (?, ?, ?, ?, ?, 'planned', ?, ?, ?, ?, ?)",
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
                        job.judge_for,
                    ],
                )
                con.executemany(
                    "INSERT INTO batch_lines (custom_id, submission_id, run_id, suite, item_id, "
                    "candidate, attempt, est_tokens, state, error, judge_for) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?, ?, 'planned', NULL, ?)",
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
                            job.judge_for,
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

    def jobs(self, run_id: str, candidate: str | None = None, judge_for: str | None = None) -> list[Job]:
        """A run's submissions; for a candidate, its own answers' (`judge_for` None) or, as a
        judge, those that grade `judge_for`'s answers."""
        where, params = "run_id = ?", [run_id]
        if candidate is not None:
            where += " AND candidate = ? AND coalesce(judge_for, '') = ?"
            params += [candidate, judge_for or ""]
        frame = self.store.query(
            "SELECT submission_id, run_id, candidate, provider, round, state, provider_state, "
            "file_id, batch_id, n_requests, est_tokens, created_at, submitted_at, error, judge_for "
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

    def line_history(
        self, run_id: str, candidate: str, judge_for: str | None = None
    ) -> dict[tuple[str, str], tuple[int, str]]:
        """(suite, item) -> (highest attempt, its state) of a candidate's lines in a run (a
        judge's lines for `judge_for`: ('', request key))."""
        frame = self.store.query(
            "SELECT suite, item_id, arg_max(attempt, attempt) AS attempt, "
            "arg_max(state, attempt) AS state FROM batch_lines WHERE run_id = ? AND candidate = ? "
            "AND coalesce(judge_for, '') = ? GROUP BY suite, item_id",
            [run_id, candidate, judge_for or ""],
        )
        return {(r["suite"], r["item_id"]): (int(r["attempt"]), r["state"]) for r in frame.to_dict("records")}

    def known_batch_ids(self) -> set[str]:
        frame = self.store.query("SELECT batch_id FROM batch_jobs WHERE batch_id IS NOT NULL")
        return set(frame["batch_id"])

    def keep(self, rows: list[Outcome]) -> None:
        """Answers that wait for their judge's replies (replacing a row kept before)."""
        now = _now()
        self.store.write(
            "INSERT OR REPLACE INTO batch_answers VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                (
                    r.run_id,
                    r.suite,
                    r.item_id,
                    r.candidate,
                    r.cost_usd,
                    json.dumps({k: v for k, v in asdict(r).items() if k in _KEPT_FIELDS}),
                    now,
                )
                for r in rows
            ],
        )

    def kept(self, run_id: str, candidate: str) -> list[Outcome]:
        """A candidate's kept answers whose item has no final outcome yet (a placeholder for an
        error on our side, e.g. the judge's spend cap, is graded again: never answered again)."""
        final = ", ".join(f"'{k}'" for k in RESUMABLE_ERROR_KINDS)
        frame = self.store.query(
            "SELECT a.row_json, a.kept_at FROM batch_answers a WHERE a.run_id = ? AND a.candidate = ? "
            "AND NOT EXISTS (SELECT 1 FROM outcomes o WHERE o.run_id = a.run_id AND o.suite = a.suite "
            "AND o.item_id = a.item_id AND o.candidate = a.candidate "
            f"AND (o.error_kind IS NULL OR o.error_kind NOT IN ({final}))) ORDER BY a.suite, a.item_id",
            [run_id, candidate],
        )
        return [
            Outcome(**json.loads(r["row_json"]), measured_at=r["kept_at"]) for r in frame.to_dict("records")
        ]

    def kept_items(self, run_id: str, suite: str, candidate: str) -> set[str]:
        """Items of a pair whose answer is kept: answered, never to be sent again."""
        frame = self.store.query(
            "SELECT item_id FROM batch_answers WHERE run_id = ? AND suite = ? AND candidate = ?",
            [run_id, suite, candidate],
        )
        return set(frame["item_id"])

    def add_replies(self, run_id: str, judge_for: str, replies: list[Reply]) -> list[Reply]:
        """Store replies; returns those that were new (a harvest read twice books each once)."""
        if not replies:
            return []
        known = self.replies(run_id, judge_for)
        new = [r for r in replies if (r.judge, r.request_key) not in known]
        now = _now()
        self.store.write(
            "INSERT INTO judge_replies (run_id, judge_for, judge, request_key, mode, batch_id, "
            f"custom_id, {', '.join(REPLY_FIELDS)}, cost_usd, recorded_at) VALUES "
            f"({', '.join('?' * (9 + len(REPLY_FIELDS)))}) ON CONFLICT DO NOTHING",
            [
                (
                    run_id,
                    judge_for,
                    r.judge,
                    r.request_key,
                    r.mode,
                    r.batch_id,
                    r.custom_id,
                    *(r.completion.get(c) for c in REPLY_FIELDS),
                    r.cost_usd,
                    now,
                )
                for r in new
            ],
        )
        return new

    def replies(self, run_id: str, judge_for: str) -> dict[tuple[str, str], Reply]:
        """(judge, request key) -> its reply, for one candidate's kept answers."""
        frame = self.store.query(
            f"SELECT judge, request_key, mode, batch_id, custom_id, {', '.join(REPLY_FIELDS)}, "
            "cost_usd FROM judge_replies WHERE run_id = ? AND judge_for = ?",
            [run_id, judge_for],
        )
        out = {}
        for r in frame.to_dict("records"):
            r = {k: (None if _isna(v) else v) for k, v in r.items()}
            c = {k: r[k] for k in REPLY_FIELDS}
            c["tokens_estimated"] = bool(c["tokens_estimated"])
            for k in ("input_tokens", "output_tokens", "cached_input_tokens", "cache_write_input_tokens"):
                c[k] = None if c[k] is None else int(c[k])
            reply = Reply(
                r["judge"],
                r["request_key"],
                r["mode"],
                c,
                float(r["cost_usd"] or 0.0),
                r["batch_id"],
                r["custom_id"],
            )
            out[(reply.judge, reply.request_key)] = reply
        return out

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


@dataclass(frozen=True)
class Reply:
    """A judge's reply to one request, as paid: in a batch or by a synchronous call."""

    judge: str
    request_key: str
    mode: str  # batch | sync
    completion: dict[str, Any]  # the fields of the judge's `Completion` (`REPLY_FIELDS`)
    cost_usd: float
    batch_id: str | None = None
    custom_id: str | None = None


REPLY_FIELDS = (
    "text",
    "finish_reason",
    "input_tokens",
    "output_tokens",
    "cached_input_tokens",
    "cache_write_input_tokens",
    "tokens_estimated",
)
_KEPT_FIELDS = tuple(f.name for f in fields(Outcome) if f.name not in ("created_at", "measured_at"))


def _isna(v: Any) -> bool:
    try:
        return v != v  # NaN / NaT
    except Exception:
        return False
