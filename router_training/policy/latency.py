"""Latency in the decision: each candidate's predicted latency, and budgets the knob certifies.

A policy trained on outcomes that measured latency carries, per kind (`ttft`: time to first
token; `latency`: end to end) and quantile (`p50`, `p95`), a linear model of the request: an
intercept and a slope per 1,000 characters of prompt, plus an offset per suite, per candidate
(the cost model's form, `routeopt.router_training.policy.scorer.CostModel`). The suite offsets
carry what differs between suites, each candidate's verbosity in them included.

A budget (`ttft <= 0.8 s`, say) is served by a tier: the largest budget the policy certified
that is no larger. The tier's mask allows the candidates whose predicted p95 is within its
`mask_s` (`budget_mask`: the budget itself, or a little more where training found the slack
for it); the tier's own knob, built and certified on the calibration requests
under that mask, serves the quality target among them. Each of its points is certified for a
target only where, on requests it was not chosen on, both the quality margin and the rate of
requests whose measured latency exceeded the budget pass their one-sided bounds
(`routeopt.router_training.fit.latency_fitting`). A budget below every tier is not certified:
the decision then takes the candidate predicted fastest and says that the budget was not met
where its prediction misses it.

Imports numpy and the standard library only: gateways embed it.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from routeopt.router_training.policy.knob import Knob
from routeopt.router_training.policy.scorer import CostModel

KINDS = ("ttft", "latency")
QUANTILES = ("p50", "p95")
BUDGET_QUANTILE = "p95"  # a candidate meets a budget when its predicted p95 does
KIND_COLUMNS = {"ttft": "ttft_s", "latency": "latency_s"}  # the outcome columns each kind learns from


def budget_mask(pred: np.ndarray, budget_s: float) -> np.ndarray:
    """Which candidates a budget allows (n, K): those whose predicted p95 is within it; a request
    none meets allows the one predicted fastest (the first such), so every row allows one."""
    pred = np.atleast_2d(pred)
    allowed = pred <= budget_s
    none = ~allowed.any(axis=1)
    if none.any():
        allowed[np.flatnonzero(none), pred[none].argmin(axis=1)] = True
    return allowed


@dataclass
class LatencyModel:
    """Per (kind, quantile), seconds predicted for each candidate, floored at the least measured."""

    models: dict[tuple[str, str], CostModel]

    def predict(self, kind: str, quantile: str, n_chars: np.ndarray, suite_pos: np.ndarray) -> np.ndarray:
        """(n, K) seconds; suite_pos is -1 for an unknown suite (no offset)."""
        return self.models[kind, quantile].predict(n_chars, np.asarray(suite_pos))

    def predict_one(self, kind: str, quantile: str, n_chars: int, suite_pos: int) -> list[float]:
        """`predict` of one request with Python's floats (`CostModel.predict_one`)."""
        return self.models[kind, quantile].predict_one(n_chars, suite_pos)

    @property
    def kinds(self) -> tuple[str, ...]:
        return tuple(k for k in KINDS if (k, BUDGET_QUANTILE) in self.models)


@dataclass(frozen=True)
class BudgetTier:
    """A budget the policy certified: its knob serves targets among the candidates it allows;
    `violation` is each knob point's rate of calibration requests over the budget."""

    kind: str
    budget_s: float
    knob: Knob
    violation: tuple[float, ...]
    mask_s: float = math.nan  # the mask's seconds: candidates predicted within them (the budget's, unset)

    def __post_init__(self) -> None:
        if math.isnan(self.mask_s):
            object.__setattr__(self, "mask_s", self.budget_s)

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "budget_s": self.budget_s,
            "mask_s": self.mask_s,
            "knob": self.knob.to_dict(),
            "violation": [_finite_or_none(v) for v in self.violation],
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "BudgetTier":
        kind = str(d["kind"])
        if kind not in KINDS:
            raise ValueError(f"unknown budget kind {kind!r}; this build reads {KINDS}")
        budget = float(d["budget_s"])
        if not (math.isfinite(budget) and budget > 0):
            raise ValueError(f"a tier's budget_s must be a positive number, got {d['budget_s']!r}")
        knob = Knob.from_dict(d["knob"])
        violation = tuple(math.nan if v is None else float(v) for v in d["violation"])
        if len(violation) != len(knob.points):
            raise ValueError(f"a tier has {len(knob.points)} points but {len(violation)} violation rates")
        mask = float(d.get("mask_s", budget))
        if not (math.isfinite(mask) and mask > 0):
            raise ValueError(f"a tier's mask_s must be a positive number, got {d['mask_s']!r}")
        return cls(kind, budget, knob, violation, mask)


@dataclass
class LatencyPolicy:
    """The latency model, the violation rate `alpha` every tier's points are certified to keep,
    and the tiers, by kind and rising budget."""

    model: LatencyModel
    alpha: float
    tiers: list[BudgetTier]
    metrics: dict[str, Any] = field(default_factory=dict)
    # the budget a request without one gets: by its suite, else "*" (any suite)
    defaults: dict[str, tuple[str, float]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for suite, (kind, seconds) in self.defaults.items():
            if kind not in self.model.kinds:
                raise ValueError(
                    f"the default budget of suite {suite!r} is of kind {kind!r}, which has no model"
                )
            if not (math.isfinite(seconds) and seconds > 0):
                raise ValueError(
                    f"the default budget of suite {suite!r} must be a positive number of seconds"
                )
        self.tiers = sorted(self.tiers, key=lambda t: (KINDS.index(t.kind), t.budget_s))
        self._by_kind = {k: [t for t in self.tiers if t.kind == k] for k in KINDS}
        self._budgets = {k: [t.budget_s for t in tiers] for k, tiers in self._by_kind.items()}
        for k, b in self._budgets.items():
            if any(y <= x for x, y in zip(b, b[1:])):
                raise ValueError(f"the {k} tiers' budgets must be distinct")

    def tier_for(self, kind: str, budget_s: float) -> BudgetTier | None:
        """The tier of the largest certified budget that is no larger than `budget_s` (None: below all)."""
        if kind not in KINDS:
            raise ValueError(f"budget kind must be one of {KINDS}, got {kind!r}")
        budgets = self._budgets[kind]
        i = bisect.bisect_right(budgets, budget_s) - 1
        if i < 0:
            return None
        return self._by_kind[kind][i]

    def default_for(self, suite: str | None) -> tuple[str, float] | None:
        """The budget a request of `suite` gets when it names none: its suite's, else "*"'s."""
        return self.defaults.get(suite or "*") or self.defaults.get("*")

    def budgets(self, kind: str) -> list[float]:
        return list(self._budgets[kind])

    def header(self) -> dict[str, Any]:
        """What policy.json holds (the models' arrays go to arrays.safetensors)."""
        return {
            "models": [[k, q] for k, q in sorted(self.model.models, key=_model_order)],
            "alpha": self.alpha,
            "tiers": [t.to_dict() for t in self.tiers],
            "metrics": self.metrics,
            "defaults": {suite: [kind, seconds] for suite, (kind, seconds) in sorted(self.defaults.items())},
        }

    def arrays(self) -> dict[str, np.ndarray]:
        out = {}
        for (k, q), m in self.model.models.items():
            out[f"latency.{k}.{q}.coef"], out[f"latency.{k}.{q}.floor"] = m.coef, m.floor
        return out


def _model_order(key: tuple[str, str]) -> tuple[int, int]:
    return KINDS.index(key[0]), QUANTILES.index(key[1])


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


def parse_budget(value: Any, what: str) -> float | None:
    """A budget in seconds from a call, a header or a setting: None, or a positive finite number."""
    if value is None or value == "":
        return None
    try:
        budget = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{what} must be a number of seconds, got {value!r}") from None
    if not (math.isfinite(budget) and budget > 0):
        raise ValueError(f"{what} must be a positive number of seconds, got {value!r}")
    return budget


def budget_request(ttft_budget_s: Any, latency_budget_s: Any) -> tuple[str, float] | None:
    """The budget a call asks for, (kind, seconds), or None without one; both kinds at once or
    a value that is not a positive number of seconds is a ValueError naming it."""
    ttft = parse_budget(ttft_budget_s, "ttft_budget_s")
    latency = parse_budget(latency_budget_s, "latency_budget_s")
    if ttft is not None and latency is not None:
        raise ValueError("give a TTFT budget or an end-to-end latency budget, not both")
    if ttft is not None:
        return "ttft", ttft
    if latency is not None:
        return "latency", latency
    return None


def serves(latency: LatencyPolicy | None, kind: str) -> bool:
    """Whether a policy's latency section can serve a budget of `kind`."""
    return latency is not None and kind in latency.model.kinds
