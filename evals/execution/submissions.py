"""One candidate's calls as provider batches: plan, submit, adopt, poll, harvest.

The lifecycle both batch stages share (`routeopt.evals.execution.batch` for answers,
`routeopt.evals.execution.judge_batch` for a judge's calls): submissions are recorded with their
lines before anything is sent, each provider id is written the moment it is returned, a batch
a killed run created is adopted, result lines are matched by `custom_id`, and what an answered
line holds is written before the line is marked answered.
"""

from __future__ import annotations

import json
import logging
import uuid
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from routeopt.evals.config import BATCH_LIMITS, BatchSpec, Candidate
from routeopt.evals.execution.budget import BudgetExhausted
from routeopt.evals.providers.base import ProviderError, Request
from routeopt.evals.providers.batch import BadLine, BatchApi, BatchGone, BatchStatus, LineResult
from routeopt.evals.providers.sdk import estimate_tokens
from routeopt.evals.storage.batches import Job, Line

if TYPE_CHECKING:
    from routeopt.evals.execution.batch import BatchStage

log = logging.getLogger(__name__)


@dataclass
class BatchReport:
    """What batch mode did for one candidate in this process (the run summary reads the store)."""

    candidate: str
    submissions: int = 0
    answered: int = 0
    resent_sync: int = 0
    judge_submissions: int = 0  # the judge's batches for this candidate's answers
    judge_replies: int = 0  # judge lines answered in those batches
    problems: list[str] = field(default_factory=list)


class Submissions:
    """The batches of one candidate's calls in one asyncio run: submit, adopt, poll, harvest.

    Subclasses say which jobs are theirs (`judge_for`), what each line asks (`_line_request`)
    and what an answered line becomes (`_store`): an outcome row, or a judge's reply."""

    judge_for: str | None = None

    def __init__(self, stage: BatchStage, cand: Candidate, spec: BatchSpec, label: str, report: BatchReport):
        assert stage.records is not None
        self.stage, self.cand, self.spec, self.label = stage, cand, spec, label
        self.records, self.store, self.run_id = stage.records, stage.store, stage.run_id
        self.api: BatchApi = stage.api_factory(cand)
        self.report = report
        max_req, max_bytes = BATCH_LIMITS.get(cand.provider, (50_000, 200 * 1024 * 1024))
        self.max_requests = self.spec.max_requests or max_req
        self.max_bytes = self.spec.max_bytes or max_bytes
        self.cancel_sent: set[str] = set()
        self.harvested = 0  # batches harvested by this object
        self._failed_uploads: dict[str, int] = {}  # retryable upload failures in a row, per submission

    def _jobs(self) -> list[Job]:
        return self.records.jobs(self.run_id, self.cand.name, self.judge_for)

    def _line_request(self, ln: Line) -> Request | None:
        """What a line asks (None: no longer known, the line is not sent)."""
        raise NotImplementedError

    async def _store(
        self, job: Job, lines: dict[str, Line], results: dict[str, LineResult]
    ) -> tuple[dict[str, tuple[str, str | None]], int, float]:
        """Write what the answered lines hold, before they are marked: returns each line's
        (state, error), how many were answered, and what they cost."""
        raise NotImplementedError

    def _new_jobs(self, rows: list[tuple[Line, int, Any]]) -> int:
        """Record submissions for `rows` (line, bytes, _), split to the limits; returns how many."""
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
                judge_for=self.judge_for,
            )
            self.records.plan(job, [ln for ln, _, _ in chunk], sum(s for _, s, _ in chunk))
            n += 1
        if n:
            log.info("%s: %d lines planned in %d batch submissions", self.label, len(rows), n)
        return n

    def _line(
        self, cid: str, suite: str, item_id: str, attempt: int, request: Request
    ) -> tuple[Line, int, None]:
        size = len(json.dumps(self.api.encode(cid, request), separators=(",", ":"))) + 1
        tokens = estimate_tokens(request.prompt_text) + request.settings.max_tokens
        return Line(cid, suite, item_id, attempt, tokens), size, None

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

    def _lines_of(self, job: Job) -> tuple[dict[str, Line], list[dict] | None]:
        """A submission's lines and the body that sends them (None: a request is no longer known)."""
        lines = self.records.lines(job.submission_id)
        body = []
        for cid, ln in sorted(lines.items()):
            request = self._line_request(ln)
            if request is None:
                return lines, None
            body.append(self.api.encode(cid, request))
        return lines, body

    def _in_flight_tokens(self, jobs: list[Job]) -> int:
        return sum(j.est_tokens for j in jobs if j.state in ("creating", "submitted"))

    async def submit_ready(self) -> None:
        """Send planned submissions while the enqueued-token limit allows; adopt batches a
        killed run created but did not record."""
        jobs = self._jobs()
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
                self.label,
                job.submission_id,
                err,
            )
            raise
        if found is None:
            return False
        self.records.update(job.submission_id, batch_id=found, state="submitted", submitted_at=job.created_at)
        log.info(
            "%s: submission %s was created before the run stopped: batch %s, polled now",
            self.label,
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
        try:
            reservation = budget.try_reserve(self.cand.name, estimate)
        except BudgetExhausted:  # could not fit even with nothing in flight
            reservation = None
        if reservation is None:
            why = (
                f"{self.label}: submission {job.submission_id} ({job.n_requests} lines, up "
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
        if body is None:
            why = (
                f"{self.label}: submission {job.submission_id} asks for what is no longer "
                "needed (its answers were graded meanwhile); not sent"
            )
            self._refuse(job, "invalid", why)
            return True
        try:
            if job.state == "planned":
                file_id = await self.api.upload(job.submission_id, body)
                self.records.update(job.submission_id, file_id=file_id, state="uploaded")
                job.file_id, job.state = file_id, "uploaded"
            self.records.update(job.submission_id, state="creating")
            job.state = "creating"
            status = await self.api.create(job.submission_id, job.file_id, body)
        except ProviderError as err:
            if err.retryable and job.state == "planned":  # the upload: no batch can exist yet
                self._failed_uploads[job.submission_id] = tries = (
                    self._failed_uploads.get(job.submission_id, 0) + 1
                )
                if tries >= self.spec.upload_attempts:
                    self._refuse(
                        job,
                        err.kind,
                        f"{self.label}: uploading submission {job.submission_id} failed {tries} times "
                        f"in a row (last: {err.message}); its items are sent synchronously",
                    )
                    return False
            if err.retryable:
                log.warning(
                    "%s: sending submission %s failed (%s); trying again",
                    self.label,
                    job.submission_id,
                    err,
                )
                return False
            self._refuse(
                job,
                err.kind,
                f"{self.label}: the provider refused submission "
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
        if self.judge_for is None:
            self.report.submissions += 1
        else:
            self.report.judge_submissions += 1
        log.info(
            "%s: batch %s holds %d lines (submission %s)",
            self.label,
            status.batch_id,
            len(lines),
            job.submission_id,
        )
        return True

    async def poll(self) -> int:
        """Poll every batch in flight once, harvest those that ended; returns how many are open."""
        open_jobs = 0
        now = datetime.now(timezone.utc)
        for job in self._jobs():
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
                log.warning("%s: polling batch %s failed (%s); trying again", self.label, job.batch_id, err)
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
            f"{self.label}: batch {job.batch_id} still {status.state} after "
            f"{self.spec.deadline_s:g}s (deadline_s): cancelled; its finished lines are kept"
        )
        try:
            await self.api.cancel(job.batch_id)
        except (ProviderError, BatchGone) as err:
            log.warning("%s: cancelling batch %s failed (%s)", self.label, job.batch_id, err)
            return
        self.cancel_sent.add(job.batch_id)
        log.warning(why)
        self.report.problems.append(why)
        self.records.update(job.submission_id, error=why)

    def _lost(self, job: Job) -> None:
        why = (
            f"{self.label}: batch {job.batch_id} (submission {job.submission_id}) no "
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
            log.error("%s: %s", self.label, error)
            self.report.problems.append(f"{self.label}: {error}")
        lines = self.records.lines(job.submission_id)
        results = await self._read(job, status, lines)
        reservation = self.stage._reserved.pop(job.submission_id, None)
        states, answered, spent = await self._store(job, lines, results)  # first: the proof
        if reservation is not None and self.stage.budget is not None:
            self.stage.budget.settle(reservation, spent)
        elif self.stage.budget is not None and spent:
            self.stage.budget.correct(self.cand.name, spent)
        self._close(job, states, "harvested", error)
        self.harvested += 1
        log.info(
            "%s: batch %s %s: %d answered, %d not",
            self.label,
            job.batch_id,
            status.state,
            answered,
            len(lines) - answered,
        )

    async def _read(self, job: Job, status: BatchStatus, lines: dict[str, Line]) -> dict[str, LineResult]:
        """The batch's result lines by custom_id; bad, unknown and duplicated lines are named."""
        try:
            raw = await self.api.results(status) if not status.failed or status.output_file_id else []
        except ProviderError as err:
            raise RuntimeError(
                f"{self.label}: results of batch {job.batch_id} could not be "
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
                res = self.api.parse(text, self._parse_request(ln) if ln else None)
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

    def _parse_request(self, ln: Line) -> Request:
        """The request a result line answers (its token estimates when usage is missing)."""
        return self._line_request(ln) or Request(())

    def _problem(self, message: str) -> None:
        log.warning("%s: %s", self.label, message)
        self.report.problems.append(f"{self.label}: {message}")
