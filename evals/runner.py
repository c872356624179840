"""The eval runner: one suite across one candidate, async, graded, costed and persisted.

Calls run concurrently up to the candidate's `max_concurrency`; retryable faults are retried
with exponential backoff and jitter (honouring Retry-After). Every item ends with exactly one
outcome: a grade, or an error row that says what happened. Results are flushed to the sink in
small batches, so a run killed at any moment loses at most one batch and resumes where it was.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable

from evals.config import Candidate
from evals.providers import make_provider
from evals.providers.base import Completion, Provider, ProviderError
from evals.store import Outcome
from evals.suites import Item, Suite

Sink = Callable[[list[Outcome]], object]


@dataclass
class PairStats:
    """What one (suite, candidate) run did; the flow sums these into the run summary."""

    suite: str
    candidate: str
    total: int = 0
    skipped_done: int = 0
    completed: int = 0
    errors: int = 0
    wall_s: float = 0.0
    error_kinds: dict[str, int] = field(default_factory=dict)


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
    """Split a GPU-priced candidate's cost over a time window among the calls it finished.

    The GPU is paid for by the hour whether busy or idle, so the window's cost (divided by the
    configured utilisation) is shared by tokens processed: idle time makes every token dearer.
    """
    if candidate.gpu_hour_usd is None:
        return
    dollars = candidate.gpu_hour_usd / 3600.0 * window_s / candidate.utilization
    priced = [r for r in rows if r.error_kind is None]
    tokens = sum((r.input_tokens or 0) + (r.output_tokens or 0) for r in priced)
    for r in priced:
        share = ((r.input_tokens or 0) + (r.output_tokens or 0)) / tokens if tokens else 1 / len(priced)
        r.cost_usd = dollars * share


async def _call_with_retries(
    provider: Provider, candidate: Candidate, suite: Suite, item: Item
) -> tuple[Completion | None, ProviderError | None, int]:
    request = suite.request(item)
    attempt = 0
    while True:
        attempt += 1
        try:
            completion = await asyncio.wait_for(provider.generate(request), candidate.timeout_s)
            return completion, None, attempt
        except asyncio.TimeoutError:
            err = ProviderError("timeout", f"no complete answer within {candidate.timeout_s:g}s")
        except ProviderError as exc:
            err = exc
        except Exception as exc:  # a provider bug must cost this item, never the run
            err = ProviderError("internal", f"{type(exc).__name__}: {exc}")
        if not err.retryable or attempt > candidate.max_retries:
            return None, err, attempt
        backoff = min(30.0, 0.25 * 2 ** (attempt - 1)) * (0.5 + random.random())
        await asyncio.sleep(max(backoff, err.retry_after_s or 0.0))


async def _evaluate_item(
    provider: Provider, candidate: Candidate, suite: Suite, item: Item, run_id: str
) -> Outcome:
    base = dict(
        run_id=run_id,
        suite=suite.name,
        suite_version=suite.version,
        item_id=item.id,
        candidate=candidate.name,
    )
    completion, err, attempts = await _call_with_retries(provider, candidate, suite, item)
    if completion is None:
        assert err is not None
        return Outcome(**base, error_kind=err.kind, error=err.message[:2000], attempts=attempts)
    row = Outcome(
        **base,
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        cached_input_tokens=completion.cached_input_tokens,
        tokens_estimated=completion.tokens_estimated,
        cost_usd=token_cost(candidate, completion),
        ttft_s=completion.ttft_s,
        latency_s=completion.latency_s,
        tpot_s=completion.tpot_s,
        finish_reason=completion.finish_reason,
        response=completion.text,
        attempts=attempts,
    )
    try:
        grade = await suite.grader.grade(completion.text, item.fields)
    except Exception as exc:  # a grader bug is recorded for this item; the run goes on
        row.error_kind, row.error = "grader_error", f"{type(exc).__name__}: {exc}"[:2000]
        return row
    row.passed, row.score, row.reason = grade.passed, grade.score, grade.reason
    return row


async def evaluate_pair(
    suite: Suite,
    candidate: Candidate,
    run_id: str,
    sink: Sink,
    *,
    done: Iterable[str] = (),
    provider: Provider | None = None,
    on_progress: Callable[[int], None] | None = None,
    flush_every: int = 32,
) -> PairStats:
    """Evaluate every not-yet-done item of a suite on a candidate, flushing outcomes to `sink`."""
    done_set = set(done)
    todo = [it for it in suite.items if it.id not in done_set]
    stats = PairStats(suite.name, candidate.name, total=len(suite.items))
    stats.skipped_done = len(suite.items) - len(todo)
    if not todo:
        return stats
    own_provider = provider is None
    provider = provider or make_provider(candidate)
    sem = asyncio.Semaphore(candidate.max_concurrency)
    buffer: list[Outcome] = []
    started = window_start = time.perf_counter()

    def flush() -> None:
        nonlocal window_start
        if not buffer:
            return
        now = time.perf_counter()
        apportion_gpu_cost(candidate, buffer, now - window_start)
        window_start = now
        sink(list(buffer))
        for row in buffer:
            stats.completed += 1
            if row.error_kind:
                stats.errors += 1
                stats.error_kinds[row.error_kind] = stats.error_kinds.get(row.error_kind, 0) + 1
        buffer.clear()

    async def one(item: Item) -> None:
        async with sem:
            outcome = await _evaluate_item(provider, candidate, suite, item, run_id)
        buffer.append(outcome)
        if on_progress:
            on_progress(1)
        if len(buffer) >= flush_every:
            flush()

    try:
        await asyncio.gather(*(one(it) for it in todo))
    finally:
        flush()
        if own_provider:
            await provider.aclose()
        stats.wall_s = time.perf_counter() - started
    return stats
