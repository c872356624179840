"""Live latency: what a gateway sees of each candidate's latency now, and when it moves a request.

Evals run at night; a provider's latency moves with its load during the day. A gateway feeds
each call's measured TTFT and end-to-end latency back (`LiveLatency.observe`) and keeps, per
candidate and kind, its newest observations of the last `window_s` seconds (at most
`max_observations`): a bounded estimate that forgets a slowdown `window_s` after it ends. A
candidate's live p95 is the nearest-rank 95th percentile of those observations once there are
at least `min_observations` of them.

A decision under a budget whose chosen candidate's live p95 exceeds the budget moves to the
first of its fallbacks that is not over budget live, is predicted to keep the budget, and is at
least as likely to pass (so no request is sent to a candidate less likely to pass than the one
the certified knob chose); with none, it stays. Everything here is a function of the
observations and the clock the caller passes, so two runtimes given the same sequence decide
alike (docs/policy-format.md, 8.4). Standard library only.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

LIVE_KINDS = ("ttft", "latency")


@dataclass(frozen=True)
class LiveSettings:
    """How much a gateway remembers: `window_s` seconds, at most `max_observations` per
    candidate and kind, and a live p95 only from `min_observations` on."""

    window_s: float = 30.0
    max_observations: int = 256
    min_observations: int = 20

    def __post_init__(self) -> None:
        if not (math.isfinite(self.window_s) and self.window_s > 0):
            raise ValueError(f"window_s must be a positive number of seconds, got {self.window_s!r}")
        if not (isinstance(self.max_observations, int) and self.max_observations >= 1):
            raise ValueError(f"max_observations must be a positive integer, got {self.max_observations!r}")
        if not (
            isinstance(self.min_observations, int) and 1 <= self.min_observations <= self.max_observations
        ):
            raise ValueError(
                f"min_observations must be an integer from 1 to max_observations, got {self.min_observations!r}"
            )

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "max_observations": self.max_observations,
            "min_observations": self.min_observations,
        }


def nearest_rank_p95(values: Sequence[float]) -> float:
    """The ceil(0.95 n)-th smallest of n values (integer arithmetic for the rank)."""
    ordered = sorted(values)
    return ordered[(95 * len(ordered) + 99) // 100 - 1]


class LiveLatency:
    """Per (candidate, kind), the newest observations (time, seconds) in arrival order."""

    def __init__(self, settings: LiveSettings = LiveSettings()) -> None:
        self.settings = settings
        self._obs: dict[tuple[str, str], deque[tuple[float, float]]] = {}
        self._lock = threading.Lock()

    def observe(
        self, model: str, at: float, *, ttft_s: float | None = None, latency_s: float | None = None
    ) -> None:
        """One call of `model` at time `at` (seconds, the clock `p95` is asked with): its TTFT
        and end-to-end latency where measured. A value that is not a non-negative finite
        number is a ValueError (a gateway must not learn from garbage)."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if not (isinstance(at, (int, float)) and math.isfinite(at)):
            raise ValueError(f"the observation time must be a finite number, got {at!r}")
        if ttft_s is None and latency_s is None:
            raise ValueError("an observation needs ttft_s or latency_s")
        values = {}
        for kind, v in (("ttft", ttft_s), ("latency", latency_s)):
            if v is None:
                continue
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
                raise ValueError(f"{kind}_s must be a non-negative number of seconds, got {v!r}")
            values[kind] = float(v)
        with self._lock:
            for kind, v in values.items():
                q = self._obs.get((model, kind))
                if q is None:
                    q = self._obs[model, kind] = deque(maxlen=self.settings.max_observations)
                q.append((float(at), v))

    def p95(self, model: str, kind: str, now: float) -> float | None:
        """The live p95 of `kind` for `model` at `now`, or None with too few recent observations."""
        with self._lock:
            q = self._obs.get((model, kind))
            if not q:
                return None
            cutoff = now - self.settings.window_s
            while q and q[0][0] <= cutoff:  # arrival order: the oldest first
                q.popleft()
            recent = [v for t, v in q if t > cutoff]
        if len(recent) < self.settings.min_observations:
            return None
        return nearest_rank_p95(recent)

    def over(self, models: Iterable[str], kind: str, budget_s: float, now: float) -> list[str]:
        """The models whose live p95 of `kind` exceeds the budget at `now`, in the order given."""
        out = []
        for m in models:
            p = self.p95(m, kind, now)
            if p is not None and p > budget_s:
                out.append(m)
        return out

    def snapshot(self, now: float) -> dict[str, dict[str, float | None]]:
        """Every observed candidate's live p95 per kind at `now` (for status pages)."""
        with self._lock:
            models = sorted({m for m, _ in self._obs})
        return {m: {k: self.p95(m, k, now) for k in LIVE_KINDS} for m in models}


def live_shift(
    model: str,
    fallbacks: Sequence[str],
    pass_probabilities: dict[str, float],
    predicted_s: dict[str, float],
    budget_s: float,
    over: Sequence[str],
) -> tuple[str, tuple[str, ...]] | None:
    """Where a decision under a budget moves when its model is over budget live: the first
    fallback not over live, predicted within the budget, and at least as likely to pass; the
    new fallbacks are the old model and then the rest in order. None: it stays."""
    if model not in over:
        return None
    floor = pass_probabilities[model]
    for f in fallbacks:
        if f not in over and predicted_s[f] <= budget_s and pass_probabilities[f] >= floor:
            return f, (model, *(g for g in fallbacks if g != f))
    return None
