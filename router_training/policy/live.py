"""Live latency: what a gateway sees of each candidate's latency now, and when it moves a request.

Evals run at night; a provider's latency moves with its load during the day. A gateway feeds
each call's measured TTFT and end-to-end latency back (`LiveLatency.observe`), with the p95 the
policy predicted for that call where it has one, and keeps, per candidate and kind, its newest
observations of the last `window_s` seconds (at most `max_observations`): a bounded estimate
that forgets a slowdown `window_s` after it ends.

A slowdown is judged against each call's own prediction, not against one budget: a candidate's
live factor is the nearest-rank 95th percentile of measured / predicted over its recent calls
(about 1 when it runs as the evals measured it, whatever mix of short and long requests it
serves), and it is slow when that factor exceeds `slow_factor`. A decision under a budget whose
candidate, slowed by its factor, no longer fits the tier's mask moves to the first of its
fallbacks that does and is at least as likely to pass (so no request is sent to a candidate
less likely to pass than the one the certified knob chose); with none, it stays. Everything
here is a function of the observations and the clock the caller passes, so two runtimes given
the same sequence decide alike (docs/policy-format.md, 8.4). Standard library only.
"""

from __future__ import annotations

import math
import threading
from collections import deque
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

LIVE_KINDS = ("ttft", "latency")


@dataclass(frozen=True)
class LiveSettings:
    """How much a gateway remembers: `window_s` seconds, at most `max_observations` per
    candidate and kind, a live figure only from `min_observations` on; a candidate is slow when
    its live factor (measured / predicted p95) exceeds `slow_factor`."""

    window_s: float = 30.0
    max_observations: int = 256
    min_observations: int = 20
    slow_factor: float = 1.5

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
        if not (
            isinstance(self.slow_factor, (int, float))
            and not isinstance(self.slow_factor, bool)
            and math.isfinite(self.slow_factor)
            and self.slow_factor >= 1
        ):
            raise ValueError(f"slow_factor must be a finite number >= 1, got {self.slow_factor!r}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "window_s": self.window_s,
            "max_observations": self.max_observations,
            "min_observations": self.min_observations,
            "slow_factor": self.slow_factor,
        }


def nearest_rank_p95(values: Sequence[float]) -> float:
    """The ceil(0.95 n)-th smallest of n values (integer arithmetic for the rank)."""
    ordered = sorted(values)
    return ordered[(95 * len(ordered) + 99) // 100 - 1]


def _seconds(name: str, v: Any, positive: bool = False) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name} must be a non-negative number of seconds, got {v!r}")
    if positive and v == 0:
        raise ValueError(f"{name} must be a positive number of seconds, got {v!r}")
    return float(v)


class LiveLatency:
    """Per (candidate, kind), the newest observations (time, seconds, seconds / predicted or
    NaN without a prediction) in arrival order."""

    def __init__(self, settings: LiveSettings = LiveSettings()) -> None:
        self.settings = settings
        self._obs: dict[tuple[str, str], deque[tuple[float, float, float]]] = {}
        self._lock = threading.Lock()

    def observe(
        self,
        model: str,
        at: float,
        *,
        ttft_s: float | None = None,
        latency_s: float | None = None,
        predicted_ttft_s: float | None = None,
        predicted_latency_s: float | None = None,
    ) -> None:
        """One call of `model` at time `at` (seconds, the clock asked with): its TTFT and
        end-to-end latency where measured, each with the p95 the policy predicted for the call
        where known (a decision's `budget.predicted_s` of that model). A value that is not a
        non-negative finite number, a prediction that is not positive, or a prediction without
        its measurement is a ValueError (a gateway must not learn from garbage)."""
        if not isinstance(model, str) or not model:
            raise ValueError(f"model must be a non-empty string, got {model!r}")
        if isinstance(at, bool) or not (isinstance(at, (int, float)) and math.isfinite(at)):
            raise ValueError(f"the observation time must be a finite number, got {at!r}")
        if ttft_s is None and latency_s is None:
            raise ValueError("an observation needs ttft_s or latency_s")
        rows = {}
        for kind, v, pred in (
            ("ttft", ttft_s, predicted_ttft_s),
            ("latency", latency_s, predicted_latency_s),
        ):
            if v is None:
                if pred is not None:
                    raise ValueError(f"predicted_{kind}_s was given without {kind}_s")
                continue
            value = _seconds(f"{kind}_s", v)
            ratio = math.nan if pred is None else value / _seconds(f"predicted_{kind}_s", pred, positive=True)
            rows[kind] = (float(at), value, ratio)
        with self._lock:
            for kind, row in rows.items():
                q = self._obs.get((model, kind))
                if q is None:
                    q = self._obs[model, kind] = deque(maxlen=self.settings.max_observations)
                q.append(row)

    def _recent(self, model: str, kind: str, now: float, column: int) -> float | None:
        """The nearest-rank p95 of one column (1: seconds, 2: ratios, NaNs left out) of the
        observations after `now - window_s`, or None with fewer than `min_observations`."""
        with self._lock:
            q = self._obs.get((model, kind))
            if not q:
                return None
            cutoff = now - self.settings.window_s
            while q and q[0][0] <= cutoff:  # arrival order: the oldest first
                q.popleft()
            recent = [row[column] for row in q if row[0] > cutoff and not math.isnan(row[column])]
        if len(recent) < self.settings.min_observations:
            return None
        return nearest_rank_p95(recent)

    def p95(self, model: str, kind: str, now: float) -> float | None:
        """The live p95 of `kind` for `model` at `now` in seconds (for status pages), or None."""
        return self._recent(model, kind, now, 1)

    def factor(self, model: str, kind: str, now: float) -> float | None:
        """The live factor: the p95 of measured / predicted over the recent calls that carried
        a prediction, or None with too few of them."""
        return self._recent(model, kind, now, 2)

    def slow(self, models: Iterable[str], kind: str, now: float) -> dict[str, float]:
        """The models slow at `now` (live factor over `slow_factor`), each with its factor."""
        out = {}
        for m in models:
            f = self.factor(m, kind, now)
            if f is not None and f > self.settings.slow_factor:
                out[m] = f
        return out

    def snapshot(self, now: float) -> dict[str, dict[str, float | None]]:
        """Every observed candidate's live p95 and live factor per kind at `now` (status pages)."""
        with self._lock:
            models = sorted({m for m, _ in self._obs})
        return {
            m: {
                **{k: self.p95(m, k, now) for k in LIVE_KINDS},
                **{f"{k}_factor": self.factor(m, k, now) for k in LIVE_KINDS},
            }
            for m in models
        }


def live_move(
    model: str,
    fallbacks: Sequence[str],
    candidates: Sequence[str],
    pass_probabilities: Mapping[str, float],
    predicted_s: Mapping[str, float],
    limit_s: float,
    slow: Mapping[str, float],
) -> tuple[str, tuple[str, ...], list[str]] | None:
    """Where a decision under a budget moves when its model, slowed by its live factor, is
    predicted past `limit_s` (the tier's mask): the first fallback whose prediction, slowed
    likewise where it is slow, is within the limit and which is at least as likely to pass.
    Returns the new model, the new fallbacks (the old model, then the rest in order) and the
    candidates over the limit live, in candidate order; None: it stays."""

    def live(k: str) -> float:
        f = slow.get(k)
        return predicted_s[k] if f is None else predicted_s[k] * f

    if model not in slow or live(model) <= limit_s:
        return None
    floor = pass_probabilities[model]
    for f in fallbacks:
        if live(f) <= limit_s and pass_probabilities[f] >= floor:
            over = [k for k in candidates if k in slow and live(k) > limit_s]
            return f, (model, *(g for g in fallbacks if g != f)), over
    return None
