"""Judged suites in batch mode: the judge's calls for a batched candidate's answers go through
the judge's own Batch API, as a second stage after the answers.

A suite whose grader asks a judge that can batch (an `openai` or `anthropic` candidate priced
by tokens) has its batch-answered rows kept (`batch_answers`) instead of graded at harvest,
unless the candidate's `batch: {judge: false}`. Then, per candidate:

- Replay: every kept answer is graded with a call path that answers the judge from stored
  replies (`judge_replies`). A request without a reply stops that answer's grading and is
  noted, keyed by a hash of (judge, request); graders reach the judge only through the call
  path they are bound to, so nested and combined judges are found too, and a judge call that
  depends on an earlier reply is found in a later round. An answer whose every reply is known
  becomes its graded row, its judge cost being what those replies cost.
- Each noted request becomes a line (custom_id `j...`, one per run, candidate, judge, request
  and attempt) in the judge's submissions, recorded before anything is sent and then sent,
  adopted, polled and harvested as the answers' are (`routeopt.evals.execution.batch`), under the
  judge's spend cap. A harvested reply is stored, costed at the judge's batch prices, before its
  line is marked answered.
- Requests that no batch answered (expired, errored, past the deadline, refused) are called
  synchronously in a last replay, which reuses every stored reply: nothing is paid twice, and
  a synchronous reply is stored the moment it comes, so a kill then costs nothing either.

The judge's batches follow the judge candidate's own `batch:` block (prices, limits, polling,
deadline, resend) when it has one, else the defaults.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from contextvars import ContextVar
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any

from routeopt.evals.config import BatchSpec, Candidate
from routeopt.evals.execution.budget import gpu_provisional_cost
from routeopt.evals.execution.calls import CallResult, RetryPolicy, token_cost
from routeopt.evals.execution.runner import count_grading_call, grade_answer, grading_calls, grading_pair
from routeopt.evals.execution.submissions import Submissions
from routeopt.evals.grading import Grader
from routeopt.evals.grading.base import Combinator
from routeopt.evals.grading.judge import Judge
from routeopt.evals.providers.base import Completion, Request
from routeopt.evals.providers.batch import LineResult
from routeopt.evals.storage.batches import REPLY_FIELDS, Job, Line, Reply
from routeopt.evals.storage.store import Outcome
from routeopt.evals.suite.spec import Suite

if TYPE_CHECKING:
    from routeopt.evals.execution.batch import _CandidateBatches

log = logging.getLogger(__name__)


def batch_judges(grader: Grader) -> list[Candidate]:
    """The judge candidates a grader asks, nested ones included, each once."""
    found: dict[str, Candidate] = {}
    stack = [grader]
    while stack:
        g = stack.pop()
        if isinstance(g, Judge) and g._candidate is not None:
            found.setdefault(g._candidate.name, g._candidate)
        if isinstance(g, Combinator):
            stack.extend(g._children)
    return list(found.values())


def request_key(judge: Candidate, request: Request, suite: str, item_id: str) -> str:
    """What identifies a judge's call: the judge model, every field of the request, and the
    graded item (each item pays for its own calls, as synchronous grading does)."""
    what = [judge.provider, judge.model, judge.variant, judge.base_url, asdict(request), suite, item_id]
    return hashlib.sha256(json.dumps(what, sort_keys=True, default=str).encode()).hexdigest()[:40]


def judge_custom_id(run_id: str, judge_for: str, judge: str, key: str, attempt: int) -> str:
    """A judge line's id: unique per (run, graded candidate, judge, request, attempt); `j`
    tells it from an answer line's `r`."""
    digest = hashlib.sha256(f"{run_id}\0{judge_for}\0{judge}\0{key}".encode()).hexdigest()
    return f"j{digest[:40]}-{attempt}"


class _Pending(BaseException):
    """A judge reply that a batch will give: the answer's grading waits (not a grader error,
    so no `except Exception` in a grader can take it for one)."""


@dataclass
class _Grading:
    """The kept answer being graded in a replay: which replies it used, and how they were paid."""

    suite: str
    item_id: str
    modes: set[str] = field(default_factory=set)
    used: set[tuple[str, str]] = field(default_factory=set)


_GRADING: ContextVar[_Grading | None] = ContextVar("routeopt_judge_replay", default=None)


def _completion_fields(c: Completion) -> dict[str, Any]:
    return {k: getattr(c, k) for k in REPLY_FIELDS}


class _ReplayCalls:
    """The call path a kept answer's grader is bound to in a replay: stored replies first; a
    judge that batches notes what it still needs (`_Pending`), unless `final`; anything else
    is a synchronous call whose reply is stored before it is used."""

    calls = 0

    def __init__(self, judging: "JudgeStage", final: bool):
        self.judging, self.final = judging, final

    async def __call__(self, candidate: Candidate, request: Request) -> Completion:
        j, item = self.judging, _GRADING.get()
        assert item is not None
        key = request_key(candidate, request, item.suite, item.item_id)
        reply = j.replies.get((candidate.name, key))
        if reply is not None:
            completion = Completion(**reply.completion)
            # a reply asked for twice in one grading was paid once
            cost = 0.0 if (candidate.name, key) in item.used else reply.cost_usd
            item.used.add((candidate.name, key))
            item.modes.add(reply.mode)
            count_grading_call(candidate, CallResult(completion, None, 0, cost))
            return completion
        if not self.final and candidate.name in j.judges:
            j.needed.setdefault(candidate.name, {})[key] = request
            raise _Pending
        result = await j.sync.result(candidate, request)
        item.modes.add("sync")
        if result.completion is None:
            assert result.error is not None
            raise result.error
        c = result.completion
        cost = result.cost_usd
        if cost is None:
            cost = gpu_provisional_cost(candidate, c.latency_s) or 0.0
        stored = Reply(candidate.name, key, "sync", _completion_fields(c), cost)
        j.records.add_replies(j.run_id, j.graded.name, [stored])
        j.replies[(candidate.name, key)] = stored
        item.used.add((candidate.name, key))
        return c

    async def aclose(self) -> None:
        """The synchronous call path belongs to the stage (`JudgeStage.aclose`)."""


class _JudgeBatches(Submissions):
    """One judge's batches for one candidate's kept answers."""

    def __init__(self, judging: "JudgeStage", judge: Candidate):
        answers = judging.answers
        label = f"judge {judge.name} of {answers.cand.name}"
        super().__init__(answers.stage, judge, judge.batch or BatchSpec(), label, answers.report)
        self.judge_for = answers.cand.name
        self.requests: dict[str, Request] = {}  # request key -> request, from the last replay

    def _line_request(self, ln: Line) -> Request | None:
        return self.requests.get(ln.item_id)

    def plan(self, needed: dict[str, Request], allowed: bool) -> int:
        """Record submissions for requests without a reply or a line in an open batch; returns
        how many. `allowed` False (judge batching turned off): none, the rest goes synchronously."""
        self.requests = needed
        if not allowed:
            return 0
        history = self.records.line_history(self.run_id, self.cand.name, self.judge_for)
        rows = []
        for key, request in sorted(needed.items()):
            attempt, state = history.get(("", key), (0, ""))
            if state == "planned":
                continue  # in an open batch
            if attempt and (self.spec.resend == "sync" or attempt >= self.spec.max_rounds):
                continue  # left for a synchronous call
            cid = judge_custom_id(self.run_id, self.judge_for or "", self.cand.name, key, attempt + 1)
            rows.append(self._line(cid, "", key, attempt + 1, request))
        return self._new_jobs(rows)

    async def _store(
        self, job: Job, lines: dict[str, Line], results: dict[str, LineResult]
    ) -> tuple[dict[str, tuple[str, str | None]], int, float]:
        """Replies are stored at the judge's batch prices; the graded rows come in the replay."""
        replies, states = [], {}
        priced = self.cand.batch_pricing()
        for cid, res in results.items():
            ln = lines[cid]
            if res.state == "answered" and res.completion is not None:
                c = res.completion
                replies.append(
                    Reply(
                        self.cand.name,
                        ln.item_id,
                        "batch",
                        _completion_fields(c),
                        token_cost(priced, c) or 0.0,
                        job.batch_id,
                        cid,
                    )
                )
                states[cid] = ("answered", None)
            else:
                states[cid] = (res.state, f"{res.error_kind}: {res.message}"[:2000])
        assert self.judge_for is not None
        new = self.records.add_replies(self.run_id, self.judge_for, replies)
        self.report.judge_replies += len(new)
        return states, len(replies), sum(r.cost_usd for r in new)


class JudgeStage:
    """The judge's side of one batched candidate: which answers wait for a judge, the judges'
    batches, and the replays that turn replies into graded rows."""

    def __init__(self, answers: "_CandidateBatches"):
        self.answers, self.graded = answers, answers.cand
        self.stage, self.records = answers.stage, answers.records
        self.store, self.run_id = answers.store, answers.run_id
        asked = {s.name: batch_judges(s.grader) for s in self.stage.suites}
        can = {j.name: j for js in asked.values() for j in js if j.unbatchable() is None}
        self.on = set(can) if answers.spec.judge else set()
        self.suites_kept = {name for name, js in asked.items() if any(j.name in self.on for j in js)}
        # a judge whose batches a run killed earlier left open is polled to the end, whatever
        # the setting says now
        started = {n for n in can if self.records.jobs(self.run_id, n, self.graded.name)}
        self.judges = {n: _JudgeBatches(self, can[n]) for n in sorted(self.on | started)}
        self.sync = grading_calls(self.stage.budget, self.stage.sync_options.get("retry") or RetryPolicy())
        self.replies: dict[tuple[str, str], Reply] = {}
        self.needed: dict[str, dict[str, Request]] = {}

    def keeps(self, suite: Suite) -> bool:
        """Whether this suite's batch-answered rows wait for the judge's batches."""
        return suite.name in self.suites_kept

    async def submit(self) -> None:
        """Send what the kept answers need now (a resumed run's), before the synchronous pairs."""
        if self.judges:
            await self._plan(await self.replay(final=False))
            for jb in self.judges.values():
                await jb.submit_ready()

    async def finish(self) -> None:
        """Judge batches to the end, then a last replay that calls synchronously what no batch
        answered; every kept answer leaves with its graded row."""
        seen = -1
        while self.judges:
            harvested = sum(jb.harvested for jb in self.judges.values())
            planned = await self._plan(await self.replay(final=False)) if harvested != seen else 0
            seen = harvested
            open_jobs = 0
            for jb in self.judges.values():
                await jb.submit_ready()
                open_jobs += await jb.poll()
            if open_jobs:
                await asyncio.sleep(min(jb.spec.poll_interval_s for jb in self.judges.values()))
                continue
            if planned or sum(jb.harvested for jb in self.judges.values()) != seen:
                seen = -1  # replay with the new replies
                continue
            break
        await self.replay(final=True)

    async def _plan(self, needed: dict[str, dict[str, Request]]) -> int:
        return sum(jb.plan(needed.get(n, {}), n in self.on) for n, jb in self.judges.items())

    async def replay(self, final: bool) -> dict[str, dict[str, Request]]:
        """Grade every kept answer from stored replies; write the rows that are complete.
        Returns judge -> request key -> request for the replies still missing."""
        kept = self.records.kept(self.run_id, self.graded.name)
        self.needed = {}
        if not kept:
            return {}
        self.replies = self.records.replies(self.run_id, self.graded.name)
        calls = _ReplayCalls(self, final)
        pairs = {
            name: grading_pair(suite, self.graded, self.run_id, self.stage.budget, calls)
            for name, suite in self.answers.suites.items()
            if name in {r.suite for r in kept}
        }
        done = await asyncio.gather(*(self._grade(r, pairs[r.suite]) for r in kept))
        graded = [r for r in done if r is not None]
        self.store.write_outcomes(graded)
        if graded:
            log.info(
                "%s: %d answers graded from %s judge replies",
                self.graded.name,
                len(graded),
                "stored and synchronous" if final else "stored",
            )
        return self.needed

    async def _grade(self, row: Outcome, pair: Any) -> Outcome | None:
        grading = _Grading(row.suite, row.item_id)
        token = _GRADING.set(grading)
        try:
            await grade_answer(pair, self.answers.items[row.suite][row.item_id], row)
        except _Pending:
            return None
        finally:
            _GRADING.reset(token)
        modes = grading.modes
        row.judge_call_mode = modes.pop() if len(modes) == 1 else ("mixed" if modes else None)
        return row

    async def aclose(self) -> None:
        for jb in self.judges.values():
            await jb.api.aclose()
        await self.sync.aclose()
