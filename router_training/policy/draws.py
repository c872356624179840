"""Exploration and canary draws: the gateway's randomness, fixed by keyed hashes of request ids.

They are part of the policy format (docs/policy-format.md, "Decision": exploration and canary)
because a JavaScript gateway and a Python one must put a request id in the same canary arm and
explore it the same way, and the conformance vectors check that. `routeopt.artifacts.serving.gateway` builds
its Gateway on these functions and re-exports them.

The propensity composes the policy's own randomisation with exploration:
``P(model) = (1 - rate) * P_policy(model) + rate * [model eligible] / n_eligible``. A policy whose
decision exposes its whole choice distribution (`choice_probabilities`) gets the marginal; one that
exposes only the chosen model's probability (`policy_probability`, as
`routeopt.artifacts.serving.loader.ServedDecision` names it, `probability`, or `propensity`, as the
policy's own decision names it) gets the propensity conditional on its own per-request draw, which is as exact
and as unbiased for off-policy estimates, since that draw is a hash of the request, not of the
outcome. `policy_probability` records the policy's own figure: below 1 where a knob point mixes
two rules and the two would choose differently.
"""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from typing import Any, Mapping, NamedTuple

from routeopt.router_training.policy.features import text_bytes


def unit_draw(key: bytes, request_id: str) -> tuple[float, float]:
    """Two uniform numbers in [0, 1] from BLAKE2b-128 of the request id's bytes keyed with `key`:
    the first and last 8 digest bytes, big-endian, divided by 2**64."""
    digest = hashlib.blake2b(text_bytes(request_id), digest_size=16, key=key).digest()
    return int.from_bytes(digest[:8], "big") / 2.0**64, int.from_bytes(digest[8:], "big") / 2.0**64


def derive_key(label: str, seed: int | str | None) -> bytes:
    """SHA-256 of "routeopt-<label>:<seed>" (a random key per process when there is no seed)."""
    if seed is None:
        return os.urandom(32)
    return hashlib.sha256(text_bytes(f"routeopt-{label}:{seed}")).digest()


@dataclass(frozen=True)
class Exploration:
    """Send a `rate` share of requests to a uniformly drawn eligible candidate.

    Eligible: not in `exclude`, and an expected cost at most `max_cost_usd` and at most
    `max_cost_ratio` times the policy's own choice's. `seed` makes the draws reproducible per
    request id (default: a random key per process).
    """

    rate: float = 0.0
    exclude: frozenset[str] = frozenset()
    max_cost_usd: float | None = None
    max_cost_ratio: float | None = None
    seed: int | str | None = None

    def __post_init__(self) -> None:
        if not (isinstance(self.rate, (int, float)) and 0 <= self.rate <= 1):
            raise ValueError(f"exploration rate must be in [0, 1], got {self.rate!r}")
        for name in ("max_cost_usd", "max_cost_ratio"):
            value = getattr(self, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ValueError(f"exploration {name} must be a positive number, got {value!r}")
        object.__setattr__(self, "exclude", frozenset(self.exclude))

    @property
    def capped(self) -> bool:
        """Whether eligibility depends on the request (its expected costs), not only on names."""
        return self.max_cost_usd is not None or self.max_cost_ratio is not None

    def eligible(self, decision: Any) -> tuple[str, ...]:
        """Candidates exploration may send this request to, in the policy's candidate order;
        under a latency budget, only those predicted to meet it (`budget_limits`)."""
        costs: Mapping[str, float] = decision.expected_cost_usd
        cap = math.inf if self.max_cost_usd is None else self.max_cost_usd
        if self.max_cost_ratio is not None:
            cap = min(cap, self.max_cost_ratio * costs.get(decision.model, math.inf))
        limits = budget_limits(decision)
        return tuple(
            c
            for c in decision.pass_probabilities
            if c not in self.exclude
            and costs.get(c, math.inf) <= cap
            and (limits is None or limits[0].get(c, math.inf) <= limits[1])
        )


def budget_limits(decision: Any) -> tuple[Mapping[str, float], float] | None:
    """(each candidate's predicted p95, the budget asked for) when the decision was made under a
    latency budget the policy serves (docs/policy-format.md, 8.1 and 8.3); else None."""
    budget = getattr(decision, "budget", None)
    if budget is None:
        return None
    if isinstance(budget, Mapping):
        predicted, limit = budget.get("predicted_s"), budget.get("budget_s")
    else:  # the policy's own BudgetOutcome
        predicted, limit = getattr(budget, "predicted_s", None), getattr(budget, "budget_s", None)
    return None if predicted is None or limit is None else (predicted, float(limit))


class Choice(NamedTuple):
    """The model served, the probability it had, and how it came about."""

    model: str
    propensity: float
    policy_probability: float
    explored: bool
    eligible: tuple[str, ...]


def own_probability(decision: Any) -> float:
    """The policy's own probability of its chosen model, under any name a decision gives it
    (`choice_probabilities`, `probability`, the runtime's `policy_probability`, or the policy's
    own `propensity`); 1 when it says none."""
    full = getattr(decision, "choice_probabilities", None)
    if full:
        return float(full.get(decision.model, 0.0))
    for name in ("probability", "policy_probability", "propensity"):
        stated = getattr(decision, name, None)
        if stated is not None:
            return float(stated)
    return 1.0


def policy_distribution(decision: Any) -> tuple[dict[str, float], float]:
    """(the distribution the propensity composes with, the policy's own P(chosen model))."""
    full = getattr(decision, "choice_probabilities", None)
    if full:
        return dict(full), own_probability(decision)
    return {decision.model: 1.0}, own_probability(decision)


def choose(
    decision: Any,
    exploration: Exploration | None,
    u: float,
    v: float,
    eligible: tuple[str, ...] | None = None,
) -> Choice:
    """The served model for uniform draws `u` (explore?) and `v` (which one), with its propensity.

    `eligible` may be passed when already known (it depends only on the candidates without a
    cost cap); by default it is `exploration.eligible(decision)`.
    """
    chosen = decision.model
    full = getattr(decision, "choice_probabilities", None)
    own = own_probability(decision)
    base = own if full else 1.0  # what the propensity composes with (see the module docstring)
    if exploration is None or exploration.rate <= 0:
        return Choice(chosen, base, own, False, ())
    if eligible is None:
        eligible = exploration.eligible(decision)
    if not eligible:
        return Choice(chosen, base, own, False, ())
    rate = exploration.rate
    explored = u < rate
    model = eligible[min(int(v * len(eligible)), len(eligible) - 1)] if explored else chosen
    policy_p = base if model == chosen else (float(full.get(model, 0.0)) if full else 0.0)
    share = rate / len(eligible) if model in eligible else 0.0
    return Choice(model, (1 - rate) * policy_p + share, own, explored, eligible)
