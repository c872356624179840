"""The eval runner: one suite across one candidate, async, graded, costed and persisted.

Per item: response cache (deterministic settings only) -> the candidate's call path
(`routeopt.evals.execution.calls`: a refused key stops the pair, an open breaker makes the queue wait for
its probe, each attempt reserved under the spend caps, RPM/TPM limiter, timeout, retries) ->
grading, whose model calls (the judge) take the same path and are recorded on the item's row.
Every item ends with exactly one outcome: a grade, or an error row that says what happened
(`error_kind`, `error`, `attempts`, and what the attempts cost). Errors on our side (budget,
an endpoint down past the breaker's wait, a refused key) are placeholders a resumed run retries.

Outcomes are flushed to the sink in batches off the event loop (by size, and at least every
half second); a run killed at any moment loses at most the unflushed batch, and a restart with
the same run id (the store's primary key and `Store.done_items`) evaluates only the items
without a row. Calls finished but not flushed before a kill are in the response cache under
their run id, so the resumed run does not pay for them again; answers of other runs are replayed
only when the caller opts in (`cache_max_age_s`). A write that keeps failing stops the pair and
raises `FlushError`.

Self-hosted candidates that share a device are measured one at a time (`DeviceSlot`).
Timing definitions are vLLM's (TTFT to the first non-empty content chunk, TPOT, inter-chunk
gaps); see `routeopt.evals.providers.sdk`.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from routeopt.common import tracing
from routeopt.evals.config import Candidate
from routeopt.evals.execution import spans
from routeopt.evals.execution.budget import Budget, gpu_provisional_cost
from routeopt.evals.execution.cache import Hit, ResponseCache, cache_key
from routeopt.evals.execution.calls import Caller, CallResult, RetryPolicy, token_cost
from routeopt.evals.execution.limits import (
    GpuMeter,
    EndpointLimits,
    shared_device_slot,
    shared_gpu_meter,
    shared_limits,
)
from routeopt.evals.grading import Grader
from routeopt.evals.providers import make_provider
from routeopt.evals.providers.base import Completion, Provider, ProviderError, Request
from routeopt.evals.storage.store import RESUMABLE_ERROR_KINDS, Outcome
from routeopt.evals.suite.spec import Item, Suite

__all__ = [
    "FlushError",
    "PairStats",
    "RetryPolicy",
    "apportion_gpu_cost",
    "count_grading_call",
    "evaluate_pair",
    "grade_answer",
    "grading_calls",
    "grading_pair",
    "token_cost",
]

Sink = Callable[[list[Outcome]], object]
log = logging.getLogger(__name__)


@dataclass
class PairStats:
    """What one (suite, candidate) run did; the flow sums these into the run summary."""

    suite: str
    candidate: str
    total: int = 0
    skipped_done: int = 0
    completed: int = 0
    errors: int = 0
    cached: int = 0
    calls: int = 0
    judge_calls: int = 0
    wall_s: float = 0.0
    error_kinds: dict[str, int] = field(default_factory=dict)
    halted: str | None = None  # why the pair stopped calling early (its API key was refused)


class FlushError(RuntimeError):
    """Outcome rows could not be written even after retries: the run must not be marked
    complete. `rows` are those still unwritten; a resumed run evaluates the missing items."""

    def __init__(self, message: str, rows: list[Outcome]):
        super().__init__(message)
        self.rows = rows


def apportion_gpu_cost(candidate: Candidate, rows: list[Outcome], window_s: float) -> float:
    """Split a GPU-priced candidate's cost over a time window among the calls it served;
    returns the window's cost (what the budget is corrected to).

    The GPU is paid for by the hour whether busy or idle, so the window's cost (divided by the
    configured utilisation) is shared by the tokens processed in it: idle time makes every token
    dearer. Cache hits used no GPU and cost nothing; a window with no served call is not charged
    to any row, but the budget still counts it.
    """
    if not candidate.gpu_metered:
        return 0.0
    dollars = candidate.gpu_hour_usd / 3600.0 * window_s / candidate.utilization
    priced = [r for r in rows if r.error_kind is None and not r.cached]
    tokens = sum((r.input_tokens or 0) + (r.output_tokens or 0) for r in priced)
    for r in priced:
        share = ((r.input_tokens or 0) + (r.output_tokens or 0)) / tokens if tokens else 1 / len(priced)
        r.cost_usd = dollars * share
    return dollars


@dataclass
class _GradingUsage:
    """What one item's grading spent on model calls (the judge), for its outcome row."""

    candidates: set[str] = field(default_factory=set)
    cost_usd: float = 0.0
    input_tokens: int = 0
    output_tokens: int = 0

    def add(self, candidate: Candidate, result: CallResult) -> None:
        self.candidates.add(candidate.name)
        c = result.completion
        cost = result.cost_usd
        if cost is None and c is not None:  # a GPU-priced judge: its own GPU time
            cost = gpu_provisional_cost(candidate, c.latency_s)
        self.cost_usd += cost or 0.0
        if c is not None:
            self.input_tokens += c.input_tokens or 0
            self.output_tokens += c.output_tokens or 0

    def record(self, row: Outcome) -> None:
        if self.candidates:
            row.judge_candidate = ",".join(sorted(self.candidates))
            row.judge_cost_usd = self.cost_usd
            row.judge_input_tokens, row.judge_output_tokens = self.input_tokens, self.output_tokens


_GRADING_USAGE: ContextVar[_GradingUsage | None] = ContextVar("routeopt_grading_usage", default=None)


def count_grading_call(candidate: Candidate, result: CallResult) -> None:
    """Count a grader's model call (or a stored reply it was answered from) on the outcome row
    of the item being graded."""
    usage = _GRADING_USAGE.get()
    if usage is not None:
        usage.add(candidate, result)


class _GradingCalls:
    """The call path the runner lends graders that call models (the judge): the same limits,
    breaker, budget (against the judge candidate) and retries as the pair's own calls; each
    call's cost and tokens go on the outcome row of the item being graded."""

    def __init__(self, budget: Budget | None, retry: RetryPolicy, max_wait_s: float | None):
        self.budget, self.retry, self.max_wait_s = budget, retry, max_wait_s
        self.callers: dict[str, Caller] = {}

    def _caller(self, candidate: Candidate) -> Caller:
        caller = self.callers.get(candidate.name)
        if caller is None:  # no await since the lookup: one caller per candidate and loop
            limits = shared_limits(
                candidate,
                breaker_failures=candidate.circuit_breaker_failures,
                breaker_cooldown_s=candidate.circuit_breaker_cooldown_s,
            )
            wait = candidate.circuit_breaker_max_wait_s if self.max_wait_s is None else self.max_wait_s
            caller = self.callers[candidate.name] = Caller(
                candidate, make_provider(candidate), limits, self.budget, self.retry, wait
            )
        return caller

    async def __call__(self, candidate: Candidate, request: Request) -> Completion:
        result = await self.result(candidate, request)
        if result.completion is None:
            assert result.error is not None
            raise result.error
        return result.completion

    async def result(self, candidate: Candidate, request: Request) -> CallResult:
        """One call, its cost counted on the item being graded: the answer or the last error."""
        span = (
            spans.start_call(candidate, "judge", spans.request_attributes(request))
            if tracing.tracer() is not None
            else None
        )
        try:
            with tracing.use(span):  # a child of the graded item's span
                result = await self._caller(candidate).call(request)
            spans.record_call(span, result.completion, result.error, result.attempts, result.cost_usd)
        finally:
            if span is not None:
                span.end()
        count_grading_call(candidate, result)
        return result

    @property
    def calls(self) -> int:
        return sum(c.calls for c in self.callers.values())

    async def aclose(self) -> None:
        for caller in self.callers.values():
            await caller.provider.aclose()


@dataclass
class _Pair:
    """Everything one item's evaluation needs, built once per (suite, candidate)."""

    suite: Suite
    candidate: Candidate
    run_id: str
    caller: Caller
    grader: Grader  # the suite's grader, bound to `grading`
    grading: _GradingCalls
    cache: ResponseCache | None
    stats: PairStats
    cache_scope: str  # the run whose own answers the cache gives back

    def row(self, item: Item, **values: object) -> Outcome:
        return Outcome(
            run_id=self.run_id,
            suite=self.suite.name,
            suite_version=self.suite.version,
            item_id=item.id,
            candidate=self.candidate.name,
            **values,
        )  # type: ignore[arg-type]


def _graded_fields(
    pair: _Pair, completion: Completion, attempts: int, cached: bool, cost_usd: float | None
) -> dict:
    return dict(
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        cached_input_tokens=completion.cached_input_tokens,
        cache_write_input_tokens=completion.cache_write_input_tokens,
        tokens_estimated=completion.tokens_estimated,
        cost_usd=cost_usd,
        ttft_s=completion.ttft_s,
        latency_s=completion.latency_s,
        tpot_s=completion.tpot_s,
        streamed=completion.streamed,
        finish_reason=completion.finish_reason,
        response=completion.text,
        attempts=attempts,
        cached=cached,
    )


async def _call(pair: _Pair, item: Item, request: Request, span: object = None) -> Outcome:
    """The network part of an item: call (with retries), cache the answer, or record the error.

    The row's cost is what every attempt cost, failed ones included."""
    result = await pair.caller.call(request)
    spans.record_call(span, result.completion, result.error, result.attempts, result.cost_usd)
    if result.completion is None:
        assert result.error is not None
        return pair.row(
            item,
            error_kind=result.error.kind,
            error=result.error.message[:2000],
            attempts=result.attempts,
            cost_usd=result.cost_usd,
        )
    if pair.cache is not None and request.settings.deterministic:
        pair.cache.put(
            cache_key(pair.candidate, request), pair.cache_scope, result.completion, result.attempts
        )
    return pair.row(item, **_graded_fields(pair, result.completion, result.attempts, False, result.cost_usd))


async def _evaluate_item(pair: _Pair, item: Item) -> Outcome:
    """One item, as a `chat {model}` span when tracing is on (`routeopt.evals.execution.spans`): the
    call, its grading and the judge's calls under it; the row keeps the span's ids."""
    if tracing.tracer() is None:
        return await _evaluate(pair, item, None)
    span = spans.start_call(
        pair.candidate, "answer", {"routeopt.suite": pair.suite.name, "routeopt.item_id": item.id}
    )
    try:
        with tracing.use(span):
            row = await _evaluate(pair, item, span)
        spans.record_outcome(span, row)
        row.trace_id, row.span_id = tracing.ids(span)
        return row
    finally:
        span.end()


async def _evaluate(pair: _Pair, item: Item, span: object) -> Outcome:
    try:
        request = pair.suite.request(item, pair.candidate)
    except Exception as exc:  # a template that does not fit this item's fields
        return pair.row(
            item, error_kind="internal", error=f"prompt: {type(exc).__name__}: {exc}"[:2000], attempts=0
        )
    if span is not None:
        span.set_attributes(spans.request_attributes(request))  # type: ignore[attr-defined]
    hit = None
    if pair.cache is not None and request.settings.deterministic:
        hit = pair.cache.get(cache_key(pair.candidate, request), pair.cache_scope)
    if hit is not None:
        row = _from_cache(pair, item, hit)
        spans.record_call(span, hit.completion, None, row.attempts, row.cost_usd, response_cache=True)
    else:
        row = await _call(pair, item, request, span)
    if row.error_kind is None:
        await _grade(pair, item, row)
    return row


def _from_cache(pair: _Pair, item: Item, hit: Hit) -> Outcome:
    """This run's own answer, recovered after a kill (paid once, booked now), or an answer
    replayed from an earlier run (`cached`: not this run's cost or timing)."""
    cost = token_cost(pair.candidate, hit.completion)
    if hit.scope != pair.cache_scope:
        return pair.row(item, **_graded_fields(pair, hit.completion, 0, True, cost))
    row = pair.row(item, **_graded_fields(pair, hit.completion, hit.attempts, False, cost))
    if pair.caller.budget is not None and row.cost_usd:
        pair.caller.budget.correct(pair.candidate.name, row.cost_usd)
    return row


async def _grade(pair: _Pair, item: Item, row: Outcome) -> None:
    usage = _GradingUsage()
    token = _GRADING_USAGE.set(usage)
    try:
        grade = await pair.grader.grade(row.response or "", item.fields)
    except ProviderError as err:  # the judge's call path gave up: on our side, or the judge's fault
        kind = err.kind if err.kind in RESUMABLE_ERROR_KINDS else "grader_error"
        row.error_kind, row.error = kind, f"grader's model call failed: {err}"[:2000]
        return
    except Exception as exc:  # a grader bug is recorded for this item; the run goes on
        row.error_kind, row.error = "grader_error", f"{type(exc).__name__}: {exc}"[:2000]
        return
    finally:
        _GRADING_USAGE.reset(token)
        usage.record(row)
    row.passed, row.score, row.reason = grade.passed, grade.score, grade.reason


def grading_calls(budget: Budget | None, retry: RetryPolicy = RetryPolicy()) -> _GradingCalls:
    """The call path graders' model calls take (the judge's): limits, breaker, budget, retries;
    `result` makes one call and counts it on the item being graded."""
    return _GradingCalls(budget, retry, None)


def grading_pair(
    suite: Suite, candidate: Candidate, run_id: str, budget: Budget | None, calls: Any = None
) -> _Pair:
    """A pair whose answers come from elsewhere (a provider's batch): it only grades, with the
    judge's calls on the same call path as a synchronous pair's, or on `calls` (a `ModelCall`
    with `calls` and `aclose`, e.g. one that answers from stored judge replies)."""
    grading = calls if calls is not None else _GradingCalls(budget, RetryPolicy(), None)
    return _Pair(
        suite,
        candidate,
        run_id,
        None,
        suite.grader.bind(grading),
        grading,
        None,
        PairStats(suite.name, candidate.name),
        run_id,
    )


async def grade_answer(pair: _Pair, item: Item, row: Outcome) -> None:
    """Grade a row that holds an answer; a grader's failure is recorded on the row."""
    await _grade(pair, item, row)


class _Flusher:
    """Batches outcomes to the sink off the event loop; GPU cost is apportioned per batch.

    A batch goes when it holds `max_rows` rows or its oldest row is `max_age_s` old, whichever
    comes first: DuckDB pays ~20 ms per transaction, so fast runs write big batches, while a
    slow run still persists each answer within `max_age_s` (what a kill can lose).

    A write that fails is retried (`RETRY_DELAYS_S`); one that still fails keeps its rows,
    stops the pair from starting new items, and makes `drain` raise `FlushError`.
    """

    RETRY_DELAYS_S: tuple[float, ...] = (0.2, 1.0, 5.0)

    def __init__(self, pair: _Pair, sink: Sink, max_rows: int, max_age_s: float, meter: GpuMeter | None):
        self.pair, self.sink, self.max_rows, self.max_age_s = pair, sink, max_rows, max_age_s
        self.meter = meter
        self.buffer: list[Outcome] = []
        self.unwritten: list[Outcome] = []  # rows whose write failed every retry
        self.error: BaseException | None = None
        self.pending: set[asyncio.Future] = set()
        self._lock = threading.Lock()  # one sink call at a time, whatever the sink
        self._ticker = asyncio.ensure_future(self._tick())

    async def _tick(self) -> None:
        while True:
            await asyncio.sleep(self.max_age_s)
            if self.buffer:
                self._flush()

    def add(self, row: Outcome) -> None:
        self.buffer.append(row)
        if len(self.buffer) >= self.max_rows:
            self._flush()

    def _flush(self) -> None:
        task = asyncio.ensure_future(asyncio.to_thread(self._write, self._take()))
        self.pending.add(task)
        task.add_done_callback(self.pending.discard)

    def _take(self) -> list[Outcome]:
        rows, self.buffer = self.buffer, []
        caller, budget = self.pair.caller, self.pair.caller.budget
        if self.meter is not None:
            dollars = apportion_gpu_cost(self.pair.candidate, rows, self.meter.take())
            if budget is not None:  # the calls were settled provisionally: book the difference
                budget.correct(self.pair.candidate.name, dollars - caller.gpu_provisional_usd)
            caller.gpu_provisional_usd = 0.0
        return rows

    def _write(self, rows: list[Outcome]) -> None:
        """Write `rows` and any earlier rows whose write failed; keep them all if it fails."""
        with self._lock:
            rows, self.unwritten = self.unwritten + rows, []
            if not rows:
                return
            for delay in (*self.RETRY_DELAYS_S, None):
                try:
                    self.sink(rows)
                    break
                except Exception as exc:
                    if delay is None:
                        self.unwritten, self.error = rows, exc
                        log.error(
                            "%s x %s: writing %d outcome rows failed after %d retries: %s: %s",
                            self.pair.suite.name,
                            self.pair.candidate.name,
                            len(rows),
                            len(self.RETRY_DELAYS_S),
                            type(exc).__name__,
                            exc,
                        )
                        return
                    log.warning(
                        "writing %d outcome rows failed (%s: %s); retrying in %gs",
                        len(rows),
                        type(exc).__name__,
                        exc,
                        delay,
                    )
                    time.sleep(delay)
            self._count(rows)

    def _count(self, rows: list[Outcome]) -> None:
        stats = self.pair.stats
        for row in rows:
            stats.completed += 1
            stats.cached += row.cached
            if row.error_kind:
                stats.errors += 1
                stats.error_kinds[row.error_kind] = stats.error_kinds.get(row.error_kind, 0) + 1

    async def drain(self) -> None:
        """Wait for batches in flight, write the rest (also on cancellation); raise FlushError
        if any write failed for good, with the rows that are still unwritten."""
        self._ticker.cancel()
        if self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=False)
        if self.buffer or self.unwritten:
            await asyncio.to_thread(self._write, self._take())
        if self.error is not None:
            p = self.pair
            raise FlushError(
                f"{p.suite.name} x {p.candidate.name}: writing outcome rows failed "
                f"({type(self.error).__name__}: {self.error}); {len(self.unwritten)} rows are "
                f"still unwritten and the pair stopped early: run {p.run_id} is not complete, "
                "resume it with the same run id",
                self.unwritten,
            ) from self.error


def _open_cache(
    cache: ResponseCache | str | Path | None, max_age_s: float | None
) -> tuple[ResponseCache | None, bool]:
    if cache is None or isinstance(cache, ResponseCache):
        return cache, False
    return ResponseCache(cache, max_age_s=max_age_s), True


async def evaluate_pair(
    suite: Suite,
    candidate: Candidate,
    run_id: str,
    sink: Sink,
    *,
    done: Iterable[str] = (),
    provider: Provider | None = None,
    on_progress: Callable[[int], None] | None = None,
    flush_every: int = 512,
    flush_interval_s: float = 0.5,
    cache: ResponseCache | str | Path | None = None,
    cache_max_age_s: float | None = None,
    cache_scope: str | None = None,
    budget: Budget | None = None,
    limits: EndpointLimits | None = None,
    retry: RetryPolicy = RetryPolicy(),
    breaker_failures: int | None = None,
    breaker_cooldown_s: float | None = None,
    breaker_max_wait_s: float | None = None,
) -> PairStats:
    """Evaluate every not-yet-done item of a suite on a candidate, flushing outcomes to `sink`.

    Outcomes reach the sink in batches of at most `flush_every` rows, each row within
    `flush_interval_s` of its answer; `sink` runs in a worker thread, one call at a time.
    Raises `FlushError` when rows could not be written.

    `cache`: a `ResponseCache` or a folder (e.g. `config.cache_dir`); None bypasses caching.
    With a folder, `cache_max_age_s` is how old another run's answer may be to be replayed
    (None: only this run's own answers are found, to resume it). `cache_scope` names the run in
    the cache (default: `run_id`; the flow adds its database).
    `limits`: the candidate's limiter and endpoint breaker; default: shared in this process,
    the breaker set from the candidate's `circuit_breaker_*` fields unless overridden here.
    A self-hosted candidate waits until no other candidate holds its device (`DeviceSlot`).
    """
    done_set = set(done)
    todo = [it for it in suite.items if it.id not in done_set]
    stats = PairStats(suite.name, candidate.name, total=len(suite.items))
    stats.skipped_done = len(suite.items) - len(todo)
    if not todo:
        return stats
    slot = shared_device_slot(candidate)
    if slot is not None:
        await slot.take(f"{candidate.name}|{candidate.model}|{candidate.variant}")
    try:
        pair, own = _make_pair(
            suite,
            candidate,
            run_id,
            stats,
            provider=provider,
            cache=(cache, cache_max_age_s, cache_scope or run_id),
            budget=budget,
            limits=limits,
            retry=retry,
            breaker=(breaker_failures, breaker_cooldown_s, breaker_max_wait_s),
        )
        await _run_items(pair, todo, own, sink, on_progress, flush_every, flush_interval_s)
    finally:
        if slot is not None:
            slot.give()
    log.info(
        "%s x %s: %d done, %d errors %s, %d cached, %d calls (+%d grading) in %.1fs",
        suite.name,
        candidate.name,
        stats.completed,
        stats.errors,
        stats.error_kinds,
        stats.cached,
        stats.calls,
        stats.judge_calls,
        stats.wall_s,
    )
    return stats


def _make_pair(
    suite: Suite,
    candidate: Candidate,
    run_id: str,
    stats: PairStats,
    *,
    provider: Provider | None,
    cache: tuple[ResponseCache | str | Path | None, float | None, str],
    budget: Budget | None,
    limits: EndpointLimits | None,
    retry: RetryPolicy,
    breaker: tuple[int | None, float | None, float | None],
) -> tuple[_Pair, tuple[bool, bool]]:
    failures, cooldown, max_wait = breaker
    limits = limits or shared_limits(
        candidate,
        breaker_failures=failures or candidate.circuit_breaker_failures,
        breaker_cooldown_s=cooldown or candidate.circuit_breaker_cooldown_s,
    )
    wait = candidate.circuit_breaker_max_wait_s if max_wait is None else max_wait
    caller = Caller(candidate, provider or make_provider(candidate), limits, budget, retry, wait)
    grading = _GradingCalls(budget, retry, max_wait)
    # A candidate priced by GPU time has its cost measured from this run's throughput; a cached
    # answer has none, so those candidates are always called.
    where, max_age_s, scope = cache
    response_cache, own_cache = _open_cache(where if not candidate.gpu_metered else None, max_age_s)
    pair = _Pair(
        suite, candidate, run_id, caller, suite.grader.bind(grading), grading, response_cache, stats, scope
    )
    return pair, (provider is None, own_cache)


async def _run_items(
    pair: _Pair,
    todo: list[Item],
    own: tuple[bool, bool],
    sink: Sink,
    on_progress: Callable[[int], None] | None,
    flush_every: int,
    flush_interval_s: float,
) -> None:
    """A fixed pool of max_concurrency workers pulling items (no task per pending item)."""
    candidate, stats = pair.candidate, pair.stats
    own_provider, own_cache = own
    prepare = getattr(pair.caller.provider, "prepare", None)
    if prepare is not None:  # optional: SDK import and client set-up, outside call timeouts
        await prepare()
    meter = shared_gpu_meter(candidate) if candidate.gpu_metered else None
    if meter is not None:
        meter.enter()
    flusher = _Flusher(pair, sink, flush_every, flush_interval_s, meter)
    queue = iter(todo)
    started = time.perf_counter()

    async def worker() -> None:
        for item in queue:
            if flusher.error is not None:  # the store is failing: start nothing new
                return
            try:
                row = await _evaluate_item(pair, item)
            except Exception as exc:  # a runner bug costs this item, never the run
                log.exception("item %s of %s failed unexpectedly", item.id, pair.suite.name)
                row = pair.row(item, error_kind="internal", error=f"{type(exc).__name__}: {exc}"[:2000])
            flusher.add(row)
            if on_progress:
                on_progress(1)

    try:
        await asyncio.gather(*(worker() for _ in range(min(candidate.max_concurrency, len(todo)))))
    finally:
        try:
            await asyncio.shield(flusher.drain())
        finally:
            if meter is not None:
                meter.exit()
            if own_provider:
                await pair.caller.provider.aclose()
            await pair.grading.aclose()
            if own_cache and pair.cache is not None:
                pair.cache.close()
            stats.wall_s = time.perf_counter() - started
            stats.calls, stats.judge_calls = pair.caller.calls, pair.grading.calls
            stats.halted = pair.caller.halted
            for caller in (pair.caller, *pair.grading.callers.values()):
                if caller.halted:
                    log.error("%s x %s: %s", pair.suite.name, candidate.name, caller.halted)
