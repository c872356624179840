"""Throughput limits, failure isolation and device time for calls to one endpoint.

- `RateLimiter`: requests-per-minute and tokens-per-minute budgets as token buckets with
  one second of burst (vendors enforce per-minute limits over shorter windows). A call reserves
  its estimated tokens (prompt estimate + max_tokens) before it is sent and gives back what it
  did not use. Thread-safe and loop-agnostic: the same limiter serves every (suite, candidate)
  pair of a process, whether they run in one event loop or in several worker threads.
- `CircuitBreaker`: one per endpoint and API key. After K consecutive endpoint faults the
  breaker opens and the queue *waits* (`admit`); after a cool-down one probe call is let through
  (half-open): success closes it and the queue moves on, failure re-opens it. Only when the
  endpoint has been down longer than the candidate's `circuit_breaker_max_wait_s` are the
  remaining calls given up (recorded as `circuit_open`, which a resumed run retries). Each change
  is said at once, with its reason, as a warning of this module's logger (on screen in a CLI
  run): opened, still down after a probe, answering again, given up.
- `GpuMeter` and `DeviceSlot`: the GPU time of self-hosted candidates. Candidates that share a
  device are measured one at a time, so each one's GPU-hour cost and latencies are its own.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import Callable

from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import ProviderError

# Faults that say the endpoint itself is unwell. Rate limits, client errors and authentication
# errors are answers from a live endpoint (they reset the count): backoff handles the first,
# the others are recorded per item, and an auth error stops its candidate's pair (a bad key
# is a configuration error, not an outage).
BREAKER_KINDS: frozenset[str] = frozenset(
    {"server_error", "connection", "timeout", "bad_response", "truncated_stream"}
)
_PROBE_POLL_S = 0.05  # how often waiting calls look whether a probe in flight has closed it
log = logging.getLogger(__name__)


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

    def __init__(
        self, rpm: float | None = None, tpm: float | None = None, clock: Callable[[], float] = time.monotonic
    ):
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
    down_since: float | None = None  # first opening since it was last closed
    last_error: str = ""
    times_opened: int = 0
    _probe: bool = False
    _gave_up: bool = False  # said once per outage that the queue stopped waiting
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def check(self) -> str | None:
        """None when a call may go now (a half-open probe included), else why it may not."""
        with self._lock:
            return self._check_locked().refused

    def _check_locked(self) -> "Admission":
        if self.state == "closed":
            return Admission()
        waited = self.clock() - self.opened_at
        if self.state == "open" and waited >= self.cooldown_s:
            self.state = "half_open"
        if self.state == "half_open" and not self._probe:
            self._probe = True
            return Admission(probe=True)
        left = max(0.0, self.cooldown_s - waited)
        return Admission(
            f"circuit open for {self.endpoint} after {self.consecutive} consecutive failures "
            f"(last: {self.last_error}); next probe in {left:.1f}s"
        )

    async def admit(self, max_wait_s: float) -> "Admission":
        """Wait until a call may go: closed, or this call is the half-open probe.

        Gives up (`refused` says why) only once the endpoint has been unavailable for
        `max_wait_s` since the breaker first opened; a probe due later still goes through.
        Polls instead of waiting on a condition: the breaker is shared by pairs in other
        threads and event loops.
        """
        while True:
            with self._lock:
                admission = self._check_locked()
                if admission.refused is None:
                    return admission
                now = self.clock()
                down_for = now - (self.down_since if self.down_since is not None else now)
                if down_for >= max_wait_s:
                    first, self._gave_up = not self._gave_up, True
                    refused = Admission(
                        f"{admission.refused}; gave up after waiting {down_for:.0f}s "
                        "(circuit_breaker_max_wait_s)"
                    )
                    break
                until_probe = self.cooldown_s - (now - self.opened_at)
                pause = until_probe if self.state == "open" and until_probe > 0 else _PROBE_POLL_S
                pause = min(pause, max_wait_s - down_for)
            await asyncio.sleep(max(pause, 0.001))
        if first:
            log.warning(
                "gave up waiting for %s after %.0fs down (circuit_breaker_max_wait_s); "
                "its remaining items are recorded as circuit_open, and resuming the run "
                "calls them again",
                self.endpoint,
                down_for,
            )
        return refused

    def record(self, error: ProviderError | None, admission: "Admission | None" = None) -> None:
        """Count a finished attempt: endpoint faults count, anything else resets the count.

        `admission`: how the call was let through; only the probe's answer closes the breaker
        (without it, any finished call is taken for the probe)."""
        with self._lock:
            was_probe = self._probe if admission is None else admission.probe
            if was_probe:
                self._probe = False
            notice = self._count(error, was_probe)
        if notice:
            log.warning(notice)

    def _count(self, error: ProviderError | None, was_probe: bool) -> str | None:
        """`record` under the lock; returns what to say when the breaker changed state."""
        now = self.clock()
        if error is None or error.kind not in BREAKER_KINDS:
            self.consecutive = 0
            if self.state != "closed" and was_probe:
                down = now - (self.down_since if self.down_since is not None else now)
                self.state, self.down_since, self._gave_up = "closed", None, False
                return f"{self.endpoint} answers again after {down:.0f}s down; its calls go on"
            return None
        self.consecutive += 1
        self.last_error = f"{error.kind}: {error.message[:200]}"
        if self.state != "half_open" and self.consecutive < self.failures:
            return None
        notice = None
        if self.state == "closed":
            self.times_opened += 1
            self.down_since = now
            notice = (
                f"circuit breaker open for {self.endpoint} after {self.consecutive} "
                f"consecutive failures (last: {self.last_error}); its calls wait for a "
                f"probe every {self.cooldown_s:g}s"
            )
        elif was_probe:
            down = now - (self.down_since if self.down_since is not None else now)
            notice = (
                f"{self.endpoint} is still down after {down:.0f}s (probe: {self.last_error}); "
                f"next probe in {self.cooldown_s:g}s"
            )
        self.state, self.opened_at = "open", now
        return notice

    def down_for(self) -> float:
        """Seconds since the breaker first opened in this outage (0 while it is closed)."""
        with self._lock:
            return 0.0 if self.down_since is None else self.clock() - self.down_since

    def release(self, admission: "Admission | None" = None) -> None:
        """A call let through that ended without an answer (cancelled, or never sent): if it
        was the probe, let another call probe."""
        with self._lock:
            if admission is None or admission.probe:
                self._probe = False


@dataclass(frozen=True)
class Admission:
    """The breaker's answer to one call: go (`refused` None; maybe as the probe) or why not."""

    refused: str | None = None
    probe: bool = False


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


class DeviceSlot:
    """One device, lent to one candidate at a time; that candidate's pairs may share it.

    Two self-hosted candidates on one GPU that run at once slow each other down, and each one's
    GPU-hour meter would charge it the whole wall time: both costs and both latencies would be
    wrong. Holding the slot for a whole pair measures each candidate alone on its device.
    """

    def __init__(self, device: str):
        self.device = device
        self._lock = threading.Lock()
        self._owner: str | None = None
        self._holders = 0

    def try_take(self, owner: str) -> bool:
        with self._lock:
            if self._owner not in (None, owner):
                return False
            self._owner, self._holders = owner, self._holders + 1
            return True

    async def take(self, owner: str, poll_s: float = 0.05) -> None:
        """Wait (without blocking the event loop) until the device is free or already ours."""
        while not self.try_take(owner):
            await asyncio.sleep(poll_s)

    def give(self) -> None:
        with self._lock:
            self._holders -= 1
            if self._holders == 0:
                self._owner = None


def device_of(candidate: Candidate) -> str | None:
    """The device a self-hosted candidate runs on, or None for API models (nothing shared).

    In-process models share their torch device (`auto` resolved as the provider resolves it);
    GPU-priced servers share their base URL.
    """
    if candidate.provider == "local":
        device = candidate.device or "auto"
        if device == "auto":
            import torch  # a local candidate imports it anyway to load its model

            device = "cuda" if torch.cuda.is_available() else "cpu"
        return "local:" + ("cuda:0" if device == "cuda" else device)
    if candidate.gpu_hour_usd is not None and candidate.base_url:
        return "server:" + candidate.base_url.rstrip("/")
    return None


def shared_device_slot(candidate: Candidate) -> DeviceSlot | None:
    device = device_of(candidate)
    if device is None:
        return None
    with _SHARED_LOCK:
        slot = _SHARED.setdefault(("device", device), DeviceSlot(device))
    assert isinstance(slot, DeviceSlot)
    return slot


@dataclass
class EndpointLimits:
    """What the runner needs for one candidate: its rate limiter and its endpoint's breaker."""

    limiter: RateLimiter
    breaker: CircuitBreaker


_SHARED: dict[tuple, object] = {}
_SHARED_LOCK = threading.Lock()
_KEY_SALT = os.urandom(16)  # key identities are salted hashes, meaningless outside this process
_DEFAULT_URLS = {
    "openai": ("OPENAI_BASE_URL", "https://api.openai.com/v1"),
    "anthropic": ("ANTHROPIC_BASE_URL", "https://api.anthropic.com"),
}


def endpoint_of(candidate: Candidate) -> str:
    """What fails together: a server URL (the SDK's default when none is configured), or for
    an in-process model its checkpoint and variant."""
    if candidate.base_url:
        return candidate.base_url
    if candidate.provider == "local":
        return f"local:{candidate.model}:{candidate.variant}"
    env, default = _DEFAULT_URLS.get(candidate.provider, ("", f"{candidate.provider}:default"))
    return (os.environ.get(env) or default) if env else default


def key_identity(candidate: Candidate) -> str:
    """Which credentials a candidate calls with, as a salted hash: never the key itself."""
    key = candidate.api_key()
    if not key:
        return f"no key ({candidate.api_key_env or 'none configured'})"
    return hashlib.blake2b(key.encode(), key=_KEY_SALT, digest_size=8).hexdigest()


def shared_limits(
    candidate: Candidate, *, breaker_failures: int = 10, breaker_cooldown_s: float = 30.0
) -> EndpointLimits:
    """Process-wide limits: one limiter per candidate, one breaker per endpoint and API key, so
    pairs running in parallel threads respect the same RPM/TPM and see the same endpoint health,
    while one account's outage (or rate limit) does not stop candidates on another."""
    endpoint = endpoint_of(candidate)
    lim_key = (
        "limiter",
        candidate.name,
        endpoint,
        candidate.requests_per_minute,
        candidate.tokens_per_minute,
    )
    brk_key = ("breaker", endpoint, key_identity(candidate), breaker_failures, breaker_cooldown_s)
    label = endpoint + (f" (key ${candidate.api_key_env})" if candidate.api_key_env else "")
    with _SHARED_LOCK:
        limiter = _SHARED.setdefault(
            lim_key, RateLimiter(candidate.requests_per_minute, candidate.tokens_per_minute)
        )
        breaker = _SHARED.setdefault(brk_key, CircuitBreaker(label, breaker_failures, breaker_cooldown_s))
    assert isinstance(limiter, RateLimiter) and isinstance(breaker, CircuitBreaker)
    return EndpointLimits(limiter, breaker)


def reset_shared_limits() -> None:
    """Forget process-wide limiters, breakers and device slots (tests; a new run in a
    long-lived process)."""
    with _SHARED_LOCK:
        _SHARED.clear()
