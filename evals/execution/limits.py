"""Throughput limits and failure isolation for calls to one endpoint.

- `RateLimiter`: requests-per-minute and tokens-per-minute budgets as token buckets with
  one second of burst (vendors enforce per-minute limits over shorter windows). A call reserves
  its estimated tokens (prompt estimate + max_tokens) before it is sent and gives back what it
  did not use. Thread-safe and loop-agnostic: the same limiter serves every (suite, candidate)
  pair of a process, whether they run in one event loop or in several worker threads.
- `CircuitBreaker`: after K consecutive endpoint failures the breaker opens and further calls
  fail fast (recorded as `circuit_open` with the reason); after a cool-down one probe call is let
  through (half-open): success closes it, failure re-opens it.
"""

from __future__ import annotations

import asyncio
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from evals.config import Candidate
from evals.providers.base import ProviderError

# Faults that say the endpoint itself is unwell. Rate limits and client errors are answers from
# a live endpoint (they reset the count); they are handled by backoff or recorded per item.
BREAKER_KINDS: frozenset[str] = frozenset(
    {"server_error", "connection", "timeout", "bad_response", "truncated_stream", "auth"}
)


class _Bucket:
    """Virtual-scheduling token bucket: reserve now, wait until the level is back >= 0."""

    def __init__(self, per_minute: float, clock: Callable[[], float]):
        self.rate = per_minute / 60.0
        self.capacity = max(1.0, self.rate)
        self.level = self.capacity
        self.clock = clock
        self.stamp = clock()

    def take(self, n: float) -> float:
        now = self.clock()
        self.level = min(self.capacity, self.level + (now - self.stamp) * self.rate)
        self.stamp = now
        self.level -= n
        return max(0.0, -self.level / self.rate)

    def give(self, n: float) -> None:
        self.level = min(self.capacity, self.level + n)


class RateLimiter:
    """RPM and TPM limits of one candidate; `None` limits cost nothing."""

    def __init__(self, rpm: float | None = None, tpm: float | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._rpm = _Bucket(rpm, clock) if rpm else None
        self._tpm = _Bucket(tpm, clock) if tpm else None
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return self._rpm is not None or self._tpm is not None

    def reserve(self, tokens: int) -> float:
        """Take one request and `tokens` tokens; returns how long to wait before sending."""
        with self._lock:
            wait = self._rpm.take(1) if self._rpm else 0.0
            if self._tpm:
                wait = max(wait, self._tpm.take(tokens))
        return wait

    async def acquire(self, tokens: int) -> None:
        if self.active:
            wait = self.reserve(tokens)
            if wait > 0:
                await asyncio.sleep(wait)

    def refund(self, tokens: int) -> None:
        """Give back reserved tokens a call did not use (estimate minus actual)."""
        if self._tpm and tokens > 0:
            with self._lock:
                self._tpm.give(tokens)


@dataclass
class CircuitBreaker:
    """Per-endpoint breaker: closed -> open after `failures` in a row -> half-open after cool-down."""

    endpoint: str
    failures: int = 10
    cooldown_s: float = 30.0
    clock: Callable[[], float] = time.monotonic
    state: str = "closed"
    consecutive: int = 0
    opened_at: float = 0.0
    last_error: str = ""
    times_opened: int = 0
    _probe: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self) -> str | None:
        """None when a call may go (a half-open probe included), else why it may not."""
        with self._lock:
            if self.state == "closed":
                return None
            waited = self.clock() - self.opened_at
            if self.state == "open" and waited >= self.cooldown_s:
                self.state = "half_open"
            if self.state == "half_open" and not self._probe:
                self._probe = True
                return None
            left = max(0.0, self.cooldown_s - waited)
            return (
                f"circuit open for {self.endpoint} after {self.consecutive} consecutive failures "
                f"(last: {self.last_error}); next probe in {left:.1f}s"
            )

    def record(self, error: ProviderError | None) -> None:
        """Count a finished attempt: endpoint faults count, anything else resets the count."""
        with self._lock:
            was_probe, self._probe = self._probe, False
            if error is None or error.kind not in BREAKER_KINDS:
                self.consecutive = 0
                if self.state != "closed" and was_probe:
                    self.state = "closed"
                return
            self.consecutive += 1
            self.last_error = f"{error.kind}: {error.message[:200]}"
            if self.state == "half_open" or self.consecutive >= self.failures:
                if self.state == "closed":
                    self.times_opened += 1
                self.state, self.opened_at = "open", self.clock()

    def release(self) -> None:
        """A probe that ended without an answer (cancelled): let another probe go."""
        with self._lock:
            self._probe = False


class GpuMeter:
    """GPU-seconds of one self-hosted candidate, shared by every pair running on it.

    Pairs of the same GPU candidate may run at once (suites fanned out as threads); each flush
    takes the seconds since the previous flush of *any* of them, so the GPU's time is charged
    once, not once per pair. The meter restarts when the first pair starts, so the time
    between runs is left to the candidate's `utilization` instead of the next run's rows.
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic):
        self._clock = clock
        self._lock = threading.Lock()
        self._active = 0
        self._last = clock()

    def enter(self) -> None:
        with self._lock:
            if self._active == 0:
                self._last = self._clock()
            self._active += 1

    def exit(self) -> None:
        with self._lock:
            self._active -= 1

    def take(self) -> float:
        """Seconds not yet charged to any row."""
        with self._lock:
            now = self._clock()
            seconds, self._last = now - self._last, now
        return seconds


def shared_gpu_meter(candidate: Candidate) -> GpuMeter:
    key = ("gpu", candidate.name, candidate.model, candidate.variant, candidate.base_url)
    with _SHARED_LOCK:
        meter = _SHARED.setdefault(key, GpuMeter())
    assert isinstance(meter, GpuMeter)
    return meter


@dataclass
class EndpointLimits:
    """What the runner needs for one candidate: its rate limiter and its endpoint's breaker."""

    limiter: RateLimiter
    breaker: CircuitBreaker


_SHARED: dict[tuple, object] = {}
_SHARED_LOCK = threading.Lock()


def endpoint_of(candidate: Candidate) -> str:
    """What fails together: a server URL, or for an in-process model its checkpoint and variant."""
    if candidate.base_url:
        return candidate.base_url
    if candidate.provider == "local":
        return f"local:{candidate.model}:{candidate.variant}"
    return f"{candidate.provider}:default"


def shared_limits(candidate: Candidate, *, breaker_failures: int = 10,
                  breaker_cooldown_s: float = 30.0) -> EndpointLimits:
    """Process-wide limits: one limiter per candidate, one breaker per endpoint, so that pairs
    running in parallel threads respect the same RPM/TPM and see the same endpoint health."""
    endpoint = endpoint_of(candidate)
    lim_key = ("limiter", candidate.name, endpoint, candidate.requests_per_minute,
               candidate.tokens_per_minute)
    brk_key = ("breaker", endpoint, breaker_failures, breaker_cooldown_s)
    with _SHARED_LOCK:
        limiter = _SHARED.setdefault(
            lim_key, RateLimiter(candidate.requests_per_minute, candidate.tokens_per_minute))
        breaker = _SHARED.setdefault(
            brk_key, CircuitBreaker(endpoint, breaker_failures, breaker_cooldown_s))
    assert isinstance(limiter, RateLimiter) and isinstance(breaker, CircuitBreaker)
    return EndpointLimits(limiter, breaker)


def reset_shared_limits() -> None:
    """Forget process-wide limiters and breakers (tests; a new run in a long-lived process)."""
    with _SHARED_LOCK:
        _SHARED.clear()
