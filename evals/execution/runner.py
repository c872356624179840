"""The eval runner: one suite across one candidate, async, graded, costed and persisted.

Per call: response cache (deterministic settings only) -> spend budget -> circuit breaker ->
RPM/TPM limiter -> provider call under a timeout -> retries with exponential backoff and full
jitter that honour Retry-After. Every item ends with exactly one outcome: a grade, or an error
row that says what happened (`error_kind`, `error`, `attempts`). Outcomes are flushed to the
sink in batches off the event loop (by size, and at least every half second); a run killed at
any moment loses at most the unflushed batch, and a restart with the same run id (the store's primary key and
`Store.done_items`) evaluates only the items without a row. Calls finished but not flushed
before a kill were cached, so the resumed run does not pay for them again.

Timing definitions are vLLM's (TTFT to the first non-empty content chunk, TPOT, inter-chunk
gaps); see `evals.providers.sdk`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterable

from evals.execution.budget import Budget, gpu_window_correction, run_within_budget
from evals.execution.cache import ResponseCache, cache_key
from evals.config import Candidate
from evals.execution.limits import EndpointLimits, GpuMeter, shared_gpu_meter, shared_limits
from evals.providers import make_provider
from evals.providers.sdk import estimate_tokens
from evals.providers.base import Completion, Provider, ProviderError, Request
from evals.storage.store import Outcome
from evals.suite.spec import Item, Suite

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
    wall_s: float = 0.0
    error_kinds: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter (AWS architecture blog), at least Retry-After."""

    base_s: float = 0.25
    max_s: float = 30.0
    max_retry_after_s: float = 300.0

    def delay(self, attempt: int, err: ProviderError) -> float:
        backoff = random.uniform(0.0, min(self.max_s, self.base_s * 2 ** (attempt - 1)))
        return max(backoff, min(err.retry_after_s or 0.0, self.max_retry_after_s))


def token_cost(candidate: Candidate, c: Completion) -> float | None:
    """List-price cost of one call; None for GPU-priced candidates (costed per flush window)."""
    if candidate.gpu_hour_usd is not None:
        return None
    inp = c.input_tokens or 0
    cached = min(c.cached_input_tokens or 0, inp)
    out = c.output_tokens or 0
    price_in = candidate.input_price_per_mtok or 0.0
    price_cached = candidate.cached_input_price_per_mtok
    price_cached = price_in if price_cached is None else price_cached
    price_out = candidate.output_price_per_mtok or 0.0
    return ((inp - cached) * price_in + cached * price_cached + out * price_out) / 1e6


def apportion_gpu_cost(candidate: Candidate, rows: list[Outcome], window_s: float) -> None:
    """Split a GPU-priced candidate's cost over a time window among the calls it served.

    The GPU is paid for by the hour whether busy or idle, so the window's cost (divided by the
    configured utilisation) is shared by the tokens processed in it: idle time makes every token
    dearer. Cache hits used no GPU and cost nothing; a window with no served call is not charged
    to any row (the budget still sees the GPU's time through its provisional estimates).
    """
    if candidate.gpu_hour_usd is None:
        return
    dollars = candidate.gpu_hour_usd / 3600.0 * window_s / candidate.utilization
    priced = [r for r in rows if r.error_kind is None and not r.cached]
    tokens = sum((r.input_tokens or 0) + (r.output_tokens or 0) for r in priced)
    for r in priced:
        share = ((r.input_tokens or 0) + (r.output_tokens or 0)) / tokens if tokens else 1 / len(priced)
        r.cost_usd = dollars * share


@dataclass
class _Pair:
    """Everything one item's evaluation needs, built once per (suite, candidate)."""

    suite: Suite
    candidate: Candidate
    run_id: str
    provider: Provider
    limits: EndpointLimits
    cache: ResponseCache | None
    budget: Budget | None
    retry: RetryPolicy
    stats: PairStats

    def row(self, item: Item, **values: object) -> Outcome:
        return Outcome(run_id=self.run_id, suite=self.suite.name, suite_version=self.suite.version,
                       item_id=item.id, candidate=self.candidate.name, **values)  # type: ignore[arg-type]


_REFUSED = frozenset({"rate_limited", "auth", "client_error"})


async def _attempt(pair: _Pair, request: Request, reserve_tokens: int) -> Completion:
    """One provider call under the limiter and the candidate's overall timeout."""
    await pair.limits.limiter.acquire(reserve_tokens)
    pair.stats.calls += 1
    timeout = pair.candidate.timeout_s
    try:
        async with asyncio.timeout(timeout):  # unlike wait_for, no extra task per call
            c = await pair.provider.generate(request)
    except TimeoutError:
        raise ProviderError("timeout", f"no complete answer within {timeout:g}s") from None
    except ProviderError as err:
        if err.kind in _REFUSED:  # refused before any generation: its tokens were not used
            pair.limits.limiter.refund(reserve_tokens)
        raise
    except Exception as exc:  # a provider bug must cost this item, never the run
        raise ProviderError("internal", f"{type(exc).__name__}: {exc}") from None
    pair.limits.limiter.refund(reserve_tokens - (c.input_tokens or 0) - (c.output_tokens or 0))
    return c


async def _call_with_retries(pair: _Pair, request: Request) -> tuple[Completion | None, ProviderError | None, int]:
    reserve = estimate_tokens(request.prompt_text) + request.settings.max_tokens
    breaker = pair.limits.breaker
    attempt = 0
    last: ProviderError | None = None
    while True:
        why = breaker.check()
        if why is not None:
            if last is not None:
                why += f"; this item's last error: {last.kind}: {last.message[:200]}"
            return None, ProviderError("circuit_open", why), attempt
        attempt += 1
        try:
            completion = await _attempt(pair, request, reserve)
        except ProviderError as err:
            breaker.record(err)
            last = err
        except BaseException:
            breaker.release()
            raise
        else:
            breaker.record(None)
            return completion, None, attempt
        if not last.retryable or attempt > pair.candidate.max_retries:
            return None, last, attempt
        await asyncio.sleep(pair.retry.delay(attempt, last))


def _graded_fields(pair: _Pair, completion: Completion, attempts: int, cached: bool) -> dict:
    return dict(
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        cached_input_tokens=completion.cached_input_tokens,
        tokens_estimated=completion.tokens_estimated,
        cost_usd=token_cost(pair.candidate, completion),
        ttft_s=completion.ttft_s,
        latency_s=completion.latency_s,
        tpot_s=completion.tpot_s,
        streamed=completion.streamed,
        finish_reason=completion.finish_reason,
        response=completion.text,
        attempts=attempts,
        cached=cached,
    )


async def _call(pair: _Pair, item: Item, request: Request) -> Outcome:
    """The network part of an item: call (with retries), cache the answer, or record the error."""
    completion, err, attempts = await _call_with_retries(pair, request)
    if completion is None:
        assert err is not None
        return pair.row(item, error_kind=err.kind, error=err.message[:2000], attempts=attempts)
    if pair.cache is not None and request.settings.deterministic:
        pair.cache.put(cache_key(pair.candidate, request), completion)
    return pair.row(item, **_graded_fields(pair, completion, attempts, cached=False))


async def _evaluate_item(pair: _Pair, item: Item) -> Outcome:
    try:
        request = pair.suite.request(item, pair.candidate)
    except Exception as exc:  # a template that does not fit this item's fields
        return pair.row(item, error_kind="internal", error=f"prompt: {type(exc).__name__}: {exc}"[:2000],
                        attempts=0)
    hit = None
    if pair.cache is not None and request.settings.deterministic:
        hit = pair.cache.get(cache_key(pair.candidate, request))
    if hit is not None:
        row = pair.row(item, **_graded_fields(pair, hit, attempts=0, cached=True))
    else:
        row = await run_within_budget(
            pair.budget, pair.candidate, request, lambda: _call(pair, item, request),
            lambda why: pair.row(item, error_kind="budget", error=why[:2000], attempts=0))
    if row.error_kind is None:
        await _grade(pair, item, row)
    return row


async def _grade(pair: _Pair, item: Item, row: Outcome) -> None:
    try:
        grade = await pair.suite.grader.grade(row.response or "", item.fields)
    except Exception as exc:  # a grader bug is recorded for this item; the run goes on
        row.error_kind, row.error = "grader_error", f"{type(exc).__name__}: {exc}"[:2000]
        return
    row.passed, row.score, row.reason = grade.passed, grade.score, grade.reason


class _Flusher:
    """Batches outcomes to the sink off the event loop; GPU cost is apportioned per batch.

    A batch goes when it holds `max_rows` rows or its oldest row is `max_age_s` old, whichever
    comes first: DuckDB pays ~20 ms per transaction, so fast runs write big batches, while a
    slow run still persists each answer within `max_age_s` (what a kill can lose).
    """

    def __init__(self, pair: _Pair, sink: Sink, max_rows: int, max_age_s: float,
                 meter: GpuMeter | None):
        self.pair, self.sink, self.max_rows, self.max_age_s = pair, sink, max_rows, max_age_s
        self.meter = meter
        self.buffer: list[Outcome] = []
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
        if self.meter is not None:
            apportion_gpu_cost(self.pair.candidate, rows, self.meter.take())
        if self.pair.budget is not None:
            delta = gpu_window_correction(self.pair.candidate, rows)
            if delta:
                self.pair.budget.correct(self.pair.candidate.name, delta)
        return rows

    def _write(self, rows: list[Outcome]) -> None:
        with self._lock:
            self.sink(rows)
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
        """Wait for batches in flight, then write the rest (also on cancellation)."""
        self._ticker.cancel()
        if self.pending:
            await asyncio.gather(*list(self.pending), return_exceptions=False)
        if self.buffer:
            self._write(self._take())


def _open_cache(cache: ResponseCache | str | Path | None) -> tuple[ResponseCache | None, bool]:
    if cache is None or isinstance(cache, ResponseCache):
        return cache, False
    return ResponseCache(cache), True


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
    budget: Budget | None = None,
    limits: EndpointLimits | None = None,
    retry: RetryPolicy = RetryPolicy(),
    breaker_failures: int | None = None,
    breaker_cooldown_s: float | None = None,
) -> PairStats:
    """Evaluate every not-yet-done item of a suite on a candidate, flushing outcomes to `sink`.

    Outcomes reach the sink in batches of at most `flush_every` rows, each row within
    `flush_interval_s` of its answer; `sink` runs in a worker thread, one call at a time.

    `cache`: a `ResponseCache` or a folder (e.g. `config.cache_dir`); None bypasses caching.
    `limits`: the candidate's limiter and endpoint breaker; default: shared in this process,
    the breaker set from the candidate's `circuit_breaker_*` fields unless overridden here.
    """
    done_set = set(done)
    todo = [it for it in suite.items if it.id not in done_set]
    stats = PairStats(suite.name, candidate.name, total=len(suite.items))
    stats.skipped_done = len(suite.items) - len(todo)
    if not todo:
        return stats
    own_provider = provider is None
    # A self-hosted candidate's cost is measured from this run's throughput; a cached answer
    # has none, so those candidates are always called.
    response_cache, own_cache = _open_cache(cache if candidate.gpu_hour_usd is None else None)
    pair = _Pair(
        suite, candidate, run_id, provider or make_provider(candidate),
        limits or shared_limits(
            candidate,
            breaker_failures=breaker_failures or candidate.circuit_breaker_failures,
            breaker_cooldown_s=breaker_cooldown_s or candidate.circuit_breaker_cooldown_s),
        response_cache, budget, retry, stats)
    prepare = getattr(pair.provider, "prepare", None)
    if prepare is not None:  # optional: SDK import and client set-up, outside call timeouts
        await prepare()
    meter = shared_gpu_meter(candidate) if candidate.gpu_hour_usd is not None else None
    if meter is not None:
        meter.enter()
    flusher = _Flusher(pair, sink, flush_every, flush_interval_s, meter)
    queue = iter(todo)
    started = time.perf_counter()

    async def worker() -> None:
        # A fixed pool of max_concurrency workers pulling items: no task per pending item.
        for item in queue:
            try:
                row = await _evaluate_item(pair, item)
            except Exception as exc:  # a runner bug costs this item, never the run
                log.exception("item %s of %s failed unexpectedly", item.id, suite.name)
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
                await pair.provider.aclose()
            if own_cache and response_cache is not None:
                response_cache.close()
            stats.wall_s = time.perf_counter() - started
    log.info("%s x %s: %d done, %d errors %s, %d cached, %d calls in %.1fs", suite.name,
             candidate.name, stats.completed, stats.errors, stats.error_kinds, stats.cached,
             stats.calls, stats.wall_s)
    return stats
