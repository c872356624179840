"""One candidate's call path, shared by the runner's items and the judge's grading calls.

Per attempt: stop if the candidate's key was refused -> wait while the endpoint's breaker is
open -> reserve the attempt's worst-case cost under the spend caps -> RPM/TPM limiter -> the
provider call under the candidate's timeout -> settle the reservation with what the attempt
cost -> retry with exponential backoff and full jitter that honours Retry-After.

What an attempt costs: a complete answer costs its tokens at list price. A call that failed
after the server began to answer (a stream cut short, a timeout mid-stream, an error event, a
200 body without choices) is billed by the provider for the prompt and every token generated,
so it costs the prompt (as reported, else estimated) plus the output received (as reported,
else estimated from the text). A call refused before any answer (HTTP 4xx/5xx status, connection
refused) costs nothing. GPU-priced candidates pay for time instead: each attempt is settled at
its own GPU time and the runner books the difference when it apportions each window's cost.
"""

from __future__ import annotations

import asyncio
import logging
import math
import random
import time
from dataclasses import dataclass

from routeopt.common import tracing
from routeopt.evals.config import Candidate
from routeopt.evals.execution import spans
from routeopt.evals.execution.budget import (
    Budget,
    BudgetExhausted,
    Reservation,
    estimate_call_cost,
    gpu_provisional_cost,
)
from routeopt.evals.execution.limits import BREAKER_KINDS, Admission, EndpointLimits
from routeopt.evals.providers.base import (
    CALL_PROGRESS,
    CallProgress,
    Completion,
    Provider,
    ProviderError,
    Request,
)
from routeopt.evals.providers.sdk import estimate_tokens

log = logging.getLogger(__name__)
# Refused before any generation: the reserved tokens go back to the TPM bucket.
_REFUSED = frozenset({"rate_limited", "auth", "config", "client_error"})


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
    """Token-priced cost of one call; None for candidates priced by measured GPU time (costed
    per flush window). Prompt-cache reads and writes are priced as the candidate says
    (`Candidate.cache_prices`)."""
    if not candidate.gpu_metered:
        inp = candidate.input_cost_usd(
            c.input_tokens or 0, c.cached_input_tokens or 0, c.cache_write_input_tokens or 0
        )
        return inp + (c.output_tokens or 0) * candidate.token_prices()[1] / 1e6
    return None


def failed_attempt_cost(candidate: Candidate, request: Request, progress: CallProgress) -> float:
    """What the provider bills for a token-priced call that ended without a usable answer."""
    if candidate.gpu_metered or not progress.started:
        return 0.0
    inp = progress.input_tokens or estimate_tokens(request.prompt_text)
    out = progress.output_tokens
    if out is None:
        out = math.ceil(progress.output_chars / 4)
    price_in, price_out = candidate.token_prices()
    return (inp * price_in + out * price_out) / 1e6


@dataclass
class CallResult:
    """How one request ended after every attempt: an answer or the last error, and the cost.

    `cost_usd` is every attempt's cost for token-priced candidates, None for GPU-priced ones
    (their cost is apportioned over the rows of each flush window).
    """

    completion: Completion | None
    error: ProviderError | None
    attempts: int
    cost_usd: float | None


class Caller:
    """One candidate's call path within one pair: provider, limits, breaker, budget, retries."""

    def __init__(
        self,
        candidate: Candidate,
        provider: Provider,
        limits: EndpointLimits,
        budget: Budget | None,
        retry: RetryPolicy,
        max_wait_s: float,
    ):
        self.candidate = candidate
        self.provider = provider
        self.limits = limits
        self.budget = budget
        self.retry = retry
        self.max_wait_s = max_wait_s
        self.calls = 0
        self.halted: str | None = None  # why this candidate stopped calling (a refused key)
        self.gpu_provisional_usd = 0.0  # settled provisionally since the last GPU window

    async def call(self, request: Request) -> CallResult:
        reserve_tokens = estimate_tokens(request.prompt_text) + request.settings.max_tokens
        attempts, retries, spent = 0, 0, 0.0
        last: ProviderError | None = None
        while True:
            admission, reservation, refused = await self._admit(request, last)
            if refused is not None:
                return self._result(None, refused, attempts, spent)
            attempts += 1
            completion, err, cost = await self._attempt(request, reserve_tokens, admission, reservation)
            spent += cost
            if completion is not None:
                return self._result(completion, None, attempts, spent)
            assert err is not None
            last = err
            if err.kind == "auth":
                self._halt(err)
            # A failed probe says the endpoint is still down, nothing about this item: it waits
            # for the next probe without using up its retries, until the endpoint has been down
            # for the breaker's wait (an item that kept drawing the probe looped for ever).
            retries += not (
                admission.probe
                and err.kind in BREAKER_KINDS
                and self.limits.breaker.down_for() < self.max_wait_s
            )
            if not err.retryable or retries > self.candidate.max_retries:
                self._traced_failure(err, None)
                return self._result(None, err, attempts, spent)
            delay = self.retry.delay(attempts, err)
            self._traced_failure(err, delay)
            await asyncio.sleep(delay)

    @staticmethod
    def _traced_failure(err: ProviderError, delay_s: float | None) -> None:
        """An event on the call's span (the current one) for each failed attempt."""
        if tracing.tracer() is not None:
            spans.record_attempt_failed(tracing.current_span(), err.kind, err.message, delay_s)

    def _result(
        self, completion: Completion | None, err: ProviderError | None, attempts: int, spent: float
    ) -> CallResult:
        cost = None if self.candidate.gpu_metered else spent
        return CallResult(completion, err, attempts, cost)

    def _halt(self, err: ProviderError) -> None:
        if self.halted is None:
            env = self.candidate.api_key_env
            self.halted = (
                f"not sent: candidate {self.candidate.name!r} stopped calling after its API key was "
                f"refused ({err.message[:300]}); fix {'$' + env if env else 'its credentials'} and "
                "resume the run, which retries these items"
            )
            log.warning(self.halted.removeprefix("not sent: "))  # on screen now, not at the end

    def _halted_error(self, last: ProviderError | None) -> ProviderError:
        assert self.halted is not None
        if last is None or last.kind == "auth":
            return ProviderError("auth", self.halted)
        return ProviderError(
            "auth", f"{self.halted}; this item's last error: {last.kind}: {last.message[:200]}"
        )

    async def _admit(
        self, request: Request, last: ProviderError | None
    ) -> tuple[Admission, Reservation | None, ProviderError | None]:
        """Wait for the breaker, then reserve this attempt's cost; or the error that refuses it."""
        if self.halted is not None:
            return Admission(), None, self._halted_error(last)
        admission = await self.limits.breaker.admit(self.max_wait_s)
        if admission.refused is not None:
            why = admission.refused
            if last is not None:
                why += f"; this item's last error: {last.kind}: {last.message[:200]}"
            return admission, None, ProviderError("circuit_open", why)
        if self.halted is not None:
            self.limits.breaker.release(admission)
            return admission, None, self._halted_error(last)
        if self.budget is None:
            return admission, None, None
        try:
            reservation = await self.budget.areserve(
                self.candidate.name, estimate_call_cost(self.candidate, request)
            )
        except BudgetExhausted as exc:
            self.limits.breaker.release(admission)
            return admission, None, ProviderError("budget", str(exc))
        except BaseException:
            self.limits.breaker.release(admission)
            raise
        return admission, reservation, None

    async def _attempt(
        self, request: Request, reserve_tokens: int, admission: Admission, reservation: Reservation | None
    ) -> tuple[Completion | None, ProviderError | None, float]:
        """One provider call under the limiter and the timeout; its cost is settled here."""
        progress = CallProgress()
        started = time.perf_counter()
        try:
            completion = await self._send(request, reserve_tokens, progress)
        except ProviderError as err:
            self.limits.breaker.record(err, admission)
            cost = self._failed_cost(request, progress, time.perf_counter() - started)
            self._settle(reservation, cost)
            return None, err, cost
        except BaseException:  # cancelled mid-call: it may have been billed in full
            self.limits.breaker.release(admission)
            if reservation is not None:
                self._settle(reservation, reservation.amount)
            raise
        self.limits.breaker.record(None, admission)
        cost = token_cost(self.candidate, completion)
        if cost is None:
            cost = self._gpu(completion.latency_s)
        self._settle(reservation, cost)
        return completion, None, cost

    def _failed_cost(self, request: Request, progress: CallProgress, elapsed_s: float) -> float:
        if self.candidate.gpu_metered:
            return self._gpu(elapsed_s)
        return failed_attempt_cost(self.candidate, request, progress)

    def _gpu(self, seconds: float) -> float:
        cost = gpu_provisional_cost(self.candidate, seconds) or 0.0
        self.gpu_provisional_usd += cost
        return cost

    def _settle(self, reservation: Reservation | None, cost: float) -> None:
        if reservation is not None and self.budget is not None:
            self.budget.settle(reservation, cost)

    async def _send(self, request: Request, reserve_tokens: int, progress: CallProgress) -> Completion:
        limiter = self.limits.limiter
        await limiter.acquire(reserve_tokens)
        self.calls += 1
        timeout = self.candidate.timeout_s
        token = CALL_PROGRESS.set(progress)
        try:
            async with asyncio.timeout(timeout):  # unlike wait_for, no extra task per call
                c = await self.provider.generate(request)
        except TimeoutError:
            raise ProviderError("timeout", f"no complete answer within {timeout:g}s") from None
        except ProviderError as err:
            if err.kind in _REFUSED:  # refused before any generation: its tokens were not used
                limiter.refund(reserve_tokens)
            raise
        except Exception as exc:  # a provider bug must cost this item, never the run
            raise ProviderError("internal", f"{type(exc).__name__}: {exc}") from None
        finally:
            CALL_PROGRESS.reset(token)
        limiter.refund(reserve_tokens - (c.input_tokens or 0) - (c.output_tokens or 0))
        return c
