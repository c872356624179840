"""Batch mode: a candidate's items answered through its provider's Batch API, at batch prices.

Per batched candidate: plan -> submit -> poll -> harvest -> re-send what was not answered.

- Plan: every item without an outcome (but the latency sample, `latency_sample` items per suite
  sent synchronously so that latency figures stay honest) becomes a line with its own
  `custom_id` (run, suite, item, candidate, attempt), split into submissions that fit the
  provider's limits (requests, bytes, the configured enqueued-token limit). Submissions and
  their lines are written to the store (`routeopt.evals.storage.batches`) before anything is
  sent; each provider id (file, batch) is written the moment it is returned.
- Resume: a run killed at any moment finds its submissions in the store: planned ones are sent,
  one killed while being created is looked up at the provider first (`BatchApi.find`), and
  submitted ones are polled. Nothing already sent is sent again; items with an outcome or a
  line in an open batch are never planned again.
- Harvest: result lines are matched by `custom_id`, in any order; a line that is not JSON, a
  `custom_id` never sent and a duplicate are named and left out. Answers are graded and stored
  (no TTFT or latency: queue time is not the model's), costed at batch prices beside what a
  synchronous call would have cost. Lines a batch did not answer (expired, cancelled,
  errored, missing) are re-sent synchronously or in a new batch (`resend`). A batch stuck past
  `deadline_s` is cancelled and its finished lines kept.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from routeopt.evals.config import BATCH_LIMITS, Candidate
from routeopt.evals.execution.budget import Budget, Reservation
from routeopt.evals.execution.calls import token_cost
from routeopt.evals.execution.runner import evaluate_pair, grade_answer, grading_pair
from routeopt.evals.providers.base import ProviderError, Request
from routeopt.evals.providers.batch import (
    BadLine,
    BatchApi,
    BatchGone,
    BatchStatus,
    LineResult,
    make_batch_api,
)
from routeopt.evals.providers.sdk import estimate_tokens
from routeopt.evals.storage.batches import BatchRecords, Job, Line
from routeopt.evals.storage.store import Outcome, ResumeConflict, Store
from routeopt.evals.suite.spec import Item, Suite

log = logging.getLogger(__name__)
_UNANSWERED = ("errored", "expired", "cancelled", "invalid", "missing")


def custom_id(run_id: str, suite: str, item_id: str, candidate: str, attempt: int) -> str:
    """A line's id: unique per (run, suite, item, candidate, attempt), in the characters both
    providers accept (`^[a-zA-Z0-9_-]{1,64}$`)."""
    digest = hashlib.sha256(f"{run_id}\0{suite}\0{item_id}\0{candidate}".encode()).hexdigest()
    return f"r{digest[:40]}-{attempt}"


def latency_sample(suite: Suite, n: int) -> set[str]:
    """The items of a suite sent synchronously to measure latency: the same ones on a resume."""
    ranked = sorted(suite.items, key=lambda it: hashlib.sha256(f"{suite.name}\0{it.id}".encode()).hexdigest())
    return {it.id for it in ranked[:n]}


def batch_owned(suite: Suite, candidate: Candidate) -> set[str]:
    """Items of a pair that batch mode answers: none for a synchronous candidate."""
    if not candidate.batched:
        return set()
    assert candidate.batch is not None
    sample = latency_sample(suite, candidate.batch.latency_sample)
    return {it.id for it in suite.items if it.id not in sample}


def run_batch_option(store: Store, run_id: str, given: list[str] | None) -> list[str]:
    """The candidates `--batch` batches in this run: on a resume the ones the run recorded
    (given again, they must be the same: a resume never switches a candidate's mode)."""
    recorded = store.batch_option(run_id)
    if recorded is None or given is None:
        return recorded or list(given or [])
    if sorted(set(given)) != sorted(recorded):
        started = "--batch " + " --batch ".join(recorded) if recorded else "no --batch"
        raise ResumeConflict(
            f"cannot resume run {run_id!r} with --batch {' --batch '.join(sorted(set(given)))}: it "
            f"was started with {started}, and a resume keeps the run's batch mode. Leave --batch "
            "out to resume it as it started, or start a new run"
        )
    return recorded


@dataclass
class BatchReport:
    """What batch mode did for one candidate in this process (the run summary reads the store)."""

    candidate: str
    submissions: int = 0
    answered: int = 0
    resent_sync: int = 0
    problems: list[str] = field(default_factory=list)


class BatchStage:
    """Batch mode for the batched candidates of one run; `submit` then `finish`, both resumable."""

    def __init__(
        self,
        store: Store,
        run_id: str,
        suites: list[Suite],
        candidates: list[Candidate],
        *,
        budget: Budget | None = None,
        sync_options: dict[str, Any] | None = None,
        api_factory: Any = make_batch_api,
    ):
        self.store, self.run_id, self.suites = store, run_id, suites
        self.batched = [c for c in candidates if c.batched]
        self.budget, self.sync_options, self.api_factory = budget, sync_options or {}, api_factory
        self.records = BatchRecords(store) if self.batched else None
        self.reports = {c.name: BatchReport(c.name) for c in self.batched}
        self._reserved: dict[str, Reservation] = {}

    def owned(self, suite: Suite, candidate: Candidate) -> set[str]:
        """Items of a pair that batch mode answers: none for a synchronous candidate."""
        return batch_owned(suite, candidate)

    def submit(self) -> None:
        """Plan and send every submission that can go now (before the synchronous pairs)."""
        if self.batched:
            asyncio.run(self._each(submit_only=True))

    def finish(self) -> list[str]:
        """Poll to the end, store every answer, re-send the rest; returns failures (as
        `evaluate_all` reports them)."""
        if not self.batched:
            return []
        return asyncio.run(self._each(submit_only=False))

    async def _each(self, submit_only: bool) -> list[str]:
        runs = [_CandidateBatches(self, c) for c in self.batched]
        results = await asyncio.gather(*(r.run(submit_only) for r in runs), return_exceptions=True)
        failed = []
        for r, res in zip(runs, results):
            await r.api.aclose()
            if isinstance(res, BaseException):
                if not isinstance(res, Exception):
                    raise res
                log.error("batch mode of %s failed: %s: %s", r.cand.name, type(res).__name__, res)
                failed.append(f"batches of {r.cand.name}: {type(res).__name__}: {res}")
        return failed


class _CandidateBatches:
    """One candidate's batches in one asyncio run."""

    def __init__(self, stage: BatchStage, cand: Candidate):
        assert cand.batch is not None and stage.records is not None
        self.stage, self.cand, self.spec = stage, cand, cand.batch
        self.records, self.store, self.run_id = stage.records, stage.store, stage.run_id
        self.api: BatchApi = stage.api_factory(cand)
        self.suites = {s.name: s for s in stage.suites}
        self.items = {s.name: {it.id: it for it in s.items} for s in stage.suites}
        self.report = stage.reports[cand.name]
        max_req, max_bytes = BATCH_LIMITS.get(cand.provider, (50_000, 200 * 1024 * 1024))
        self.max_requests = self.spec.max_requests or max_req
        self.max_bytes = self.spec.max_bytes or max_bytes
        self.cancel_sent: set[str] = set()

    # --- plan ------------------------------------------------------------------------------

    def _request(self, suite: str, item_id: str) -> Request:
        return self.suites[suite].request(self.items[suite][item_id], self.cand)

    def _todo(self) -> list[tuple[Suite, Item, int]]:
        """(suite, item, attempt) to send in a new batch: no outcome, no line in an open
        batch, attempts left under `resend: batch`."""
        history = self.records.line_history(self.run_id, self.cand.name)
        todo = []
        for suite in self.stage.suites:
            done = self.store.done_items(self.run_id, suite.name, self.cand.name)
            for item_id in sorted(self.stage.owned(suite, self.cand) - done):
                attempt, state = history.get((suite.name, item_id), (0, ""))
                if state == "planned":
                    continue  # in an open batch
                if attempt and (self.spec.resend == "sync" or attempt >= self.spec.max_rounds):
                    continue  # left for a synchronous call
                todo.append((suite, self.items[suite.name][item_id], attempt + 1))
        return todo

    def plan(self) -> int:
        """Record new submissions for what is left to send; returns how many."""
        rows: list[tuple[Line, int, Outcome | None]] = []
        for suite, item, attempt in self._todo():
            cid = custom_id(self.run_id, suite.name, item.id, self.cand.name, attempt)
            try:
                request = suite.request(item, self.cand)
            except Exception as exc:  # a template that does not fit this item: as the runner does
                self.store.write_outcomes(
                    [
                        Outcome(
                            self.run_id,
                            suite.name,
                            suite.version,
                            item.id,
                            self.cand.name,
                            error_kind="internal",
                            error=f"prompt: {type(exc).__name__}: {exc}"[:2000],
                            attempts=0,
                        )
                    ]
                )
                continue
            size = len(json.dumps(self.api.encode(cid, request), separators=(",", ":"))) + 1
            tokens = estimate_tokens(request.prompt_text) + request.settings.max_tokens
            rows.append((Line(cid, suite.name, item.id, attempt, tokens), size, None))
        n = 0
        for chunk in self._split(rows):
            job = Job(
                f"sub-{uuid.uuid4().hex[:16]}",
                self.run_id,
                self.cand.name,
                self.cand.provider,
                max(ln.attempt for ln, _, _ in chunk),
                "planned",
                None,
                None,
                None,
                len(chunk),
                sum(ln.est_tokens for ln, _, _ in chunk),
                datetime.now(timezone.utc),
                None,
            )
            self.records.plan(job, [ln for ln, _, _ in chunk], sum(s for _, s, _ in chunk))
            n += 1
        if n:
            log.info("%s: %d lines planned in %d batch submissions", self.cand.name, len(rows), n)
        return n

    def _split(self, rows: list[tuple[Line, int, Any]]) -> list[list[tuple[Line, int, Any]]]:
        """Chunks within the provider's request and byte limits and the enqueued-token limit."""
        limit = self.spec.enqueued_token_limit
        chunks: list[list[tuple[Line, int, Any]]] = []
        cur: list[tuple[Line, int, Any]] = []
        size = tokens = 0
        for row in rows:
            line, nbytes, _ = row
            if cur and (
                len(cur) >= self.max_requests
                or size + nbytes > self.max_bytes
                or (limit is not None and tokens + line.est_tokens > limit)
            ):
                chunks.append(cur)
                cur, size, tokens = [], 0, 0
            cur.append(row)
            size, tokens = size + nbytes, tokens + line.est_tokens
        return chunks + ([cur] if cur else [])

    # --- submit ----------------------------------------------------------------------------

    def _lines_of(self, job: Job) -> tuple[dict[str, Line], list[dict]]:
        lines = self.records.lines(job.submission_id)
        body = [
            self.api.encode(cid, self._request(ln.suite, ln.item_id)) for cid, ln in sorted(lines.items())
        ]
        return lines, body

    def _in_flight_tokens(self, jobs: list[Job]) -> int:
        return sum(j.est_tokens for j in jobs if j.state in ("creating", "submitted"))

    async def submit_ready(self) -> None:
        """Send planned submissions while the enqueued-token limit allows; adopt batches a
        killed run created but did not record."""
        jobs = self.records.jobs(self.run_id, self.cand.name)
        limit = self.spec.enqueued_token_limit
        for job in jobs:
            if job.state not in ("planned", "uploaded", "creating"):
                continue
            if job.state == "creating" and await self._adopt(job):
                continue
            if (
                limit is not None
                and self._in_flight_tokens(jobs) + job.est_tokens > limit
                and self._in_flight_tokens(jobs) > 0
            ):
                return  # waits for a batch in flight to end
            if not self._reserve(job):
                return
            if not await self._send(job):
                return
            job.state = "submitted"

    async def _adopt(self, job: Job) -> bool:
        """A submission killed while its batch was being created: find that batch."""
        try:
            found = await self.api.find(
                job.submission_id,
                job.file_id,
                job.created_at.timestamp(),
                job.n_requests,
                self.records.known_batch_ids(),
            )
        except ProviderError as err:
            log.warning(
                "%s: looking up submission %s failed (%s); trying again",
                self.cand.name,
                job.submission_id,
                err,
            )
            raise
        if found is None:
            return False
        self.records.update(job.submission_id, batch_id=found, state="submitted", submitted_at=job.created_at)
        log.info(
            "%s: submission %s was created before the run stopped: batch %s, polled now",
            self.cand.name,
            job.submission_id,
            found,
        )
        job.state, job.batch_id = "submitted", found
        return True

    def _reserve(self, job: Job) -> bool:
        budget = self.stage.budget
        if budget is None or job.submission_id in self.stage._reserved:
            return True
        priced = self.cand.batch_pricing()
        price_in, price_out = priced.token_prices()
        estimate = job.est_tokens * max(price_in, price_out) / 1e6
        reservation = budget.try_reserve(self.cand.name, estimate)
        if reservation is None:
            why = (
                f"{self.cand.name}: submission {job.submission_id} ({job.n_requests} lines, up "
                f"to ${estimate:.4f}) does not fit the spend caps; its items are left for a "
                "synchronous call under the caps"
            )
            self._refuse(job, "budget", why)
            return False
        self.stage._reserved[job.submission_id] = reservation
        return True

    def _refuse(self, job: Job, state_error: str, why: str) -> None:
        log.error(why)
        self.report.problems.append(why)
        lines = self.records.lines(job.submission_id)
        self.records.mark_lines((cid, "invalid", state_error) for cid in lines)
        self.records.update(job.submission_id, state="rejected", error=why[:2000])
        job.state = "rejected"

    async def _send(self, job: Job) -> bool:
        """Upload and create, recording each id as it comes; False to try again later."""
        lines, body = self._lines_of(job)
        try:
            if job.state == "planned":
                file_id = await self.api.upload(job.submission_id, body)
                self.records.update(job.submission_id, file_id=file_id, state="uploaded")
                job.file_id, job.state = file_id, "uploaded"
            self.records.update(job.submission_id, state="creating")
            job.state = "creating"
            status = await self.api.create(job.submission_id, job.file_id, body)
        except ProviderError as err:
            if err.retryable:
                log.warning(
                    "%s: sending submission %s failed (%s); trying again",
                    self.cand.name,
                    job.submission_id,
                    err,
                )
                return False
            self._refuse(
                job,
                err.kind,
                f"{self.cand.name}: the provider refused submission "
                f"{job.submission_id} ({job.n_requests} lines): {err.message}; its "
                "items are re-sent synchronously",
            )
            return False
        self.records.update(
            job.submission_id,
            batch_id=status.batch_id,
            state="submitted",
            provider_state=status.state,
            submitted_at=datetime.now(timezone.utc),
        )
        job.batch_id = status.batch_id
        self.report.submissions += 1
        log.info(
            "%s: batch %s holds %d lines (submission %s)",
            self.cand.name,
            status.batch_id,
            len(lines),
            job.submission_id,
        )
        return True

    # --- poll and harvest ------------------------------------------------------------------

    async def poll(self) -> int:
        """Poll every batch in flight once, harvest those that ended; returns how many are open."""
        open_jobs = 0
        now = datetime.now(timezone.utc)
        for job in self.records.jobs(self.run_id, self.cand.name):
            if job.state not in ("submitted", "ended", "planned", "uploaded", "creating"):
                continue
            open_jobs += 1
            if job.state not in ("submitted", "ended"):
                continue
            try:
                status = await self.api.retrieve(job.batch_id)
            except BatchGone:
                self._lost(job)
                open_jobs -= 1
                continue
            except ProviderError as err:
                log.warning(
                    "%s: polling batch %s failed (%s); trying again", self.cand.name, job.batch_id, err
                )
                continue
            if status.state != job.provider_state:
                self.records.update(job.submission_id, provider_state=status.state, counts=status.counts)
            if status.ended:
                await self.harvest(job, status)
                open_jobs -= 1
            elif (
                job.submitted_at is not None
                and job.batch_id not in self.cancel_sent
                and (now - job.submitted_at).total_seconds() > self.spec.deadline_s
            ):
                await self._cancel(job, status)
        return open_jobs

    async def _cancel(self, job: Job, status: BatchStatus) -> None:
        why = (
            f"{self.cand.name}: batch {job.batch_id} still {status.state} after "
            f"{self.spec.deadline_s:g}s (deadline_s): cancelled; its finished lines are kept"
        )
        try:
            await self.api.cancel(job.batch_id)
        except (ProviderError, BatchGone) as err:
            log.warning("%s: cancelling batch %s failed (%s)", self.cand.name, job.batch_id, err)
            return
        self.cancel_sent.add(job.batch_id)
        log.warning(why)
        self.report.problems.append(why)
        self.records.update(job.submission_id, error=why)

    def _lost(self, job: Job) -> None:
        why = (
            f"{self.cand.name}: batch {job.batch_id} (submission {job.submission_id}) no "
            "longer exists at the provider; its unanswered lines are re-sent"
        )
        log.error(why)
        self.report.problems.append(why)
        self._close(job, {}, "lost", why)

    def _close(
        self, job: Job, states: dict[str, tuple[str, str | None]], state: str, error: str | None
    ) -> None:
        """Mark every line (missing when no result said otherwise), then the job."""
        lines = self.records.lines(job.submission_id)
        marks = [(cid, *states.get(cid, ("missing", "no result line"))) for cid in lines]
        self.records.mark_lines(marks)
        self.records.update(job.submission_id, state=state, error=error, ended_at=datetime.now(timezone.utc))

    async def harvest(self, job: Job, status: BatchStatus) -> None:
        """Store every answer of an ended batch, then mark its lines and the job."""
        self.records.update(
            job.submission_id,
            state="ended",
            provider_state=status.state,
            output_file_id=status.output_file_id,
            error_file_id=status.error_file_id,
            counts=status.counts,
        )
        error = None
        if status.failed:
            error = f"batch {job.batch_id} failed: " + "; ".join(status.errors or ["no reason given"])
            log.error("%s: %s", self.cand.name, error)
            self.report.problems.append(f"{self.cand.name}: {error}")
        lines = self.records.lines(job.submission_id)
        results = await self._read(job, status, lines)
        rows, states = [], {}
        reservation = self.stage._reserved.pop(job.submission_id, None)
        spent = 0.0
        for cid, res in results.items():
            ln = lines[cid]
            if res.state == "answered" and res.completion is not None:
                row = await self._row(job, ln, res)
                rows.append(row)
                spent += row.cost_usd or 0.0
                states[cid] = ("answered", None)
            else:
                states[cid] = (res.state, f"{res.error_kind}: {res.message}"[:2000])
        self.store.write_outcomes(rows)  # first: a row is the proof a line was answered
        if reservation is not None and self.stage.budget is not None:
            self.stage.budget.settle(reservation, spent)
        elif self.stage.budget is not None and spent:
            self.stage.budget.correct(self.cand.name, spent)
        self._close(job, states, "harvested", error)
        self.report.answered += len(rows)
        log.info(
            "%s: batch %s %s: %d answered, %d not",
            self.cand.name,
            job.batch_id,
            status.state,
            len(rows),
            len(lines) - len(rows),
        )

    async def _read(self, job: Job, status: BatchStatus, lines: dict[str, Line]) -> dict[str, LineResult]:
        """The batch's result lines by custom_id; bad, unknown and duplicated lines are named."""
        try:
            raw = await self.api.results(status) if not status.failed or status.output_file_id else []
        except ProviderError as err:
            raise RuntimeError(
                f"{self.cand.name}: results of batch {job.batch_id} could not be "
                f"read ({err}); resume the run to read them again"
            ) from None
        out: dict[str, LineResult] = {}
        for source, n, text in raw:
            where = f"batch {job.batch_id} ({source}) line {n}"
            try:
                cid = json.loads(text).get("custom_id")
            except Exception:
                cid = None
            ln = lines.get(cid) if isinstance(cid, str) else None
            try:
                res = self.api.parse(text, self._request(ln.suite, ln.item_id) if ln else None)
            except BadLine as exc:
                self._problem(f"{where}: {exc}; left out, its line is re-sent")
                continue
            if ln is None:
                self._problem(f"{where}: custom_id {res.custom_id} was never sent in this batch; ignored")
                continue
            if res.custom_id in out and out[res.custom_id].state == "answered":
                self._problem(f"{where}: custom_id {res.custom_id} appears twice; the first kept")
                continue
            out[res.custom_id] = res
        return out

    def _problem(self, message: str) -> None:
        log.warning("%s: %s", self.cand.name, message)
        self.report.problems.append(f"{self.cand.name}: {message}")

    async def _row(self, job: Job, ln: Line, res: LineResult) -> Outcome:
        suite, c = self.suites[ln.suite], res.completion
        assert c is not None
        row = Outcome(
            self.run_id,
            suite.name,
            suite.version,
            ln.item_id,
            self.cand.name,
            input_tokens=c.input_tokens,
            output_tokens=c.output_tokens,
            cached_input_tokens=c.cached_input_tokens,
            cache_write_input_tokens=c.cache_write_input_tokens,
            tokens_estimated=c.tokens_estimated,
            cost_usd=token_cost(self.cand.batch_pricing(), c),
            sync_cost_usd=token_cost(self.cand, c),
            finish_reason=c.finish_reason,
            response=c.text,
            attempts=ln.attempt,
            streamed=None,
            call_mode="batch",
            batch_id=job.batch_id,
        )
        if suite.name not in self._graders:
            self._graders[suite.name] = grading_pair(suite, self.cand, self.run_id, self.stage.budget)
        await grade_answer(self._graders[suite.name], self.items[suite.name][ln.item_id], row)
        return row

    _graders: dict[str, Any]

    # --- the loop --------------------------------------------------------------------------

    async def run(self, submit_only: bool) -> None:
        self._graders = {}
        try:
            await self._run(submit_only)
        finally:
            for pair in self._graders.values():
                await pair.grading.aclose()

    async def _run(self, submit_only: bool) -> None:
        self.plan()
        while True:
            await self.submit_ready()
            if submit_only:
                return
            open_jobs = await self.poll()
            if open_jobs:
                await asyncio.sleep(self.spec.poll_interval_s)
                continue
            if self.plan():  # another round for lines not answered (resend: batch)
                continue
            break
        await self._resend_sync()

    async def _resend_sync(self) -> None:
        """Items batch mode owns that still have no outcome: one synchronous call each."""
        for suite in self.stage.suites:
            owned = self.stage.owned(suite, self.cand)
            left = owned - self.store.done_items(self.run_id, suite.name, self.cand.name)
            if not left:
                continue
            log.info(
                "%s x %s: %d items not answered by a batch are sent synchronously",
                suite.name,
                self.cand.name,
                len(left),
            )
            done = [it.id for it in suite.items if it.id not in left]
            stats = await evaluate_pair(
                suite,
                self.cand,
                self.run_id,
                self.store.write_outcomes,
                done=done,
                budget=self.stage.budget,
                **self.stage.sync_options,
            )
            self.report.resent_sync += stats.completed


def batch_summary(store: Store, run_id: str) -> list[dict[str, Any]]:
    """Per candidate of a run: items by how they were answered (batch, sync, carried forward),
    batch states, and the cost beside what synchronous calls would have cost."""
    if not store.has_table("outcomes"):
        return []
    rows = store.query(
        """
        SELECT candidate,
               count(*) FILTER (WHERE call_mode = 'batch') AS batch,
               count(*) FILTER (WHERE coalesce(call_mode, 'sync') = 'sync' AND NOT cached) AS sync,
               count(*) FILTER (WHERE call_mode = 'carried') AS carried,
               sum(cost_usd) FILTER (WHERE NOT coalesce(cached, FALSE)) AS cost_usd,
               sum(coalesce(sync_cost_usd, cost_usd)) AS full_sync_usd,
               count(latency_s) FILTER (WHERE coalesce(call_mode, 'sync') = 'sync'
                                        AND NOT cached) AS latency_rows
        FROM outcomes WHERE run_id = ? GROUP BY candidate ORDER BY candidate
        """,
        [run_id],
    ).to_dict("records")
    states: dict[str, dict[str, int]] = {}
    if store.has_table("batch_jobs"):
        for r in store.query(
            "SELECT candidate, coalesce(provider_state, state) AS s, count(*) AS n "
            "FROM batch_jobs WHERE run_id = ? GROUP BY ALL",
            [run_id],
        ).itertuples():
            states.setdefault(r.candidate, {})[r.s] = int(r.n)
    for r in rows:
        r["batches"] = states.get(r["candidate"], {})
    return rows
