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
- Judged suites: answers whose grader asks a judge that can batch are kept, and the judge's
  calls go in the judge's own batches as a second stage (`routeopt.evals.execution.judge_batch`).

The submissions' lifecycle, shared with the judge's stage, is `routeopt.evals.execution.submissions`.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
from typing import Any

from routeopt.evals.config import Candidate
from routeopt.evals.execution.budget import Budget, Reservation
from routeopt.evals.execution.calls import token_cost
from routeopt.evals.execution.judge_batch import JudgeStage
from routeopt.evals.execution.runner import evaluate_pair, grade_answer, grading_pair
from routeopt.evals.execution.submissions import BatchReport, Submissions
from routeopt.evals.providers.base import Completion, Request
from routeopt.evals.providers.batch import LineResult, make_batch_api
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


class _CandidateBatches(Submissions):
    """One candidate's answers in batches, in one asyncio run."""

    def __init__(self, stage: BatchStage, cand: Candidate):
        assert cand.batch is not None
        super().__init__(stage, cand, cand.batch, cand.name, stage.reports[cand.name])
        self.suites = {s.name: s for s in stage.suites}
        self.items = {s.name: {it.id: it for it in s.items} for s in stage.suites}
        self.judging = JudgeStage(self)

    # --- plan ------------------------------------------------------------------------------

    def _request(self, suite: str, item_id: str) -> Request:
        return self.suites[suite].request(self.items[suite][item_id], self.cand)

    def _line_request(self, ln: Line) -> Request | None:
        return self._request(ln.suite, ln.item_id)

    def _answered(self, suite: Suite) -> set[str]:
        """Items with their outcome, or an answer kept for its judge's batches."""
        done = self.store.done_items(self.run_id, suite.name, self.cand.name)
        return done | self.records.kept_items(self.run_id, suite.name, self.cand.name)

    def _todo(self) -> list[tuple[Suite, Item, int]]:
        """(suite, item, attempt) to send in a new batch: no outcome or kept answer, no line in
        an open batch, attempts left under `resend: batch`."""
        history = self.records.line_history(self.run_id, self.cand.name)
        todo = []
        for suite in self.stage.suites:
            done = self._answered(suite)
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
        rows: list[tuple[Line, int, Any]] = []
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
            rows.append(self._line(cid, suite.name, item.id, attempt, request))
        return self._new_jobs(rows)

    # --- harvest ---------------------------------------------------------------------------

    async def _store(
        self, job: Job, lines: dict[str, Line], results: dict[str, LineResult]
    ) -> tuple[dict[str, tuple[str, str | None]], int, float]:
        """Answers are graded and written; those whose grader asks a judge that batches are
        kept for the judge's batches instead (`routeopt.evals.execution.judge_batch`)."""
        graded, kept, states = [], [], {}
        for cid, res in results.items():
            ln = lines[cid]
            if res.state == "answered" and res.completion is not None:
                row = self._row(job, ln, res.completion)
                if self.judging.keeps(self.suites[ln.suite]):
                    kept.append(row)
                else:
                    await self._grade(row)
                    graded.append(row)
                states[cid] = ("answered", None)
            else:
                states[cid] = (res.state, f"{res.error_kind}: {res.message}"[:2000])
        self.records.keep(kept)
        self.store.write_outcomes(graded)  # first: a row is the proof a line was answered
        rows = graded + kept
        self.report.answered += len(rows)
        return states, len(rows), sum(r.cost_usd or 0.0 for r in rows)

    def _row(self, job: Job, ln: Line, c: Completion) -> Outcome:
        suite = self.suites[ln.suite]
        return Outcome(
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

    async def _grade(self, row: Outcome) -> None:
        """Grade a batched answer now, the judge's calls (if any) synchronous."""
        suite = self.suites[row.suite]
        if suite.name not in self._graders:
            self._graders[suite.name] = grading_pair(suite, self.cand, self.run_id, self.stage.budget)
        await grade_answer(self._graders[suite.name], self.items[suite.name][row.item_id], row)

    _graders: dict[str, Any]

    # --- the loop --------------------------------------------------------------------------

    async def run(self, submit_only: bool) -> None:
        self._graders = {}
        try:
            await self._run(submit_only)
        finally:
            for pair in self._graders.values():
                await pair.grading.aclose()
            await self.judging.aclose()

    async def _run(self, submit_only: bool) -> None:
        self.plan()
        while True:
            await self.submit_ready()
            if submit_only:
                await self.judging.submit()  # a resumed run's judge lines go now too
                return
            open_jobs = await self.poll()
            if open_jobs:
                await asyncio.sleep(self.spec.poll_interval_s)
                continue
            if self.plan():  # another round for lines not answered (resend: batch)
                continue
            break
        await self._resend_sync()
        await self.judging.finish()

    async def _resend_sync(self) -> None:
        """Items batch mode owns that still have no outcome (nor an answer kept for its judge):
        one synchronous call each."""
        for suite in self.stage.suites:
            owned = self.stage.owned(suite, self.cand)
            left = owned - self._answered(suite)
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
    batch states (its answers', and its judge's for them), and the cost beside what synchronous
    calls would have cost."""
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
    states: dict[tuple[str, bool], dict[str, int]] = {}
    if store.has_table("batch_jobs"):
        judged = "judge_for" in store.query("SELECT * FROM batch_jobs LIMIT 0").columns
        owner = "coalesce(judge_for, candidate)" if judged else "candidate"
        for r in store.query(
            f"SELECT {owner} AS owner, {'judge_for IS NOT NULL' if judged else 'FALSE'} AS judge, "
            "coalesce(provider_state, state) AS s, count(*) AS n "
            "FROM batch_jobs WHERE run_id = ? GROUP BY ALL",
            [run_id],
        ).itertuples():
            states.setdefault((r.owner, bool(r.judge)), {})[r.s] = int(r.n)
    for r in rows:
        r["batches"] = states.get((r["candidate"], False), {})
        r["judge_batches"] = states.get((r["candidate"], True), {})  # its judge's, for its answers
    return rows
