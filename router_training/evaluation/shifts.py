"""Shifted test sets of our own: the promise's regression tests for traffic unlike the suites.

A test split drawn like its training split says nothing about what happens when production
traffic drifts away from the eval suites, which is the normal case. Each shift here keeps a
test request with a probability that tilts the test split away from the training split along
one covariate, learned or read on the training split only (never on test outcomes):

* `hard`: harder requests, by a difficulty score learned on the training split: the plain
  reference router's (TF-IDF + suite, logistic, `baselines.ReferenceRouter`) mean predicted
  pass rate over the candidates. It is another model family than the router's, so the shift is
  not drawn along the router's own features;
* `suites`: another suite mix, each suite's weight set by a seeded random order of the suites;
* `long`: longer prompts (log characters).

P(keep i) = min(1, c exp(beta s_i)) for the standardised score s, with c such that `fraction`
of the requests are kept on average, drawn with a fixed seed. A kept set is an ordinary subset,
so every figure on it is a plain pass rate; the requests kept are the target traffic, and their
prompts (without outcomes) are the unlabelled sample a traffic-aware certificate may use. The
density ratio of a kept request is at most 1 / fraction, so the support stays the training's.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from routeopt.router_training.fit.data import RoutingData

SHIFTS = ("hard", "suites", "long")
DESCRIBE = {
    "hard": "harder requests (difficulty learned on the training split)",
    "suites": "another suite mix",
    "long": "longer prompts",
}


@dataclass(frozen=True)
class Shift:
    """A shifted test set: the kept test request indices and what was shifted."""

    name: str
    keep: np.ndarray
    description: str


def keep_probability(score: np.ndarray, fraction: float = 0.5, beta: float = 1.0) -> np.ndarray:
    """min(1, c exp(beta z)) for z the standardised score, c chosen (by bisection) so the mean
    is `fraction`; a constant score keeps every request with probability `fraction`."""
    s = np.asarray(score, dtype=np.float64)
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    if len(s) == 0:
        return np.empty(0)
    sd = s.std()
    z = (s - s.mean()) / sd if sd > 0 else np.zeros_like(s)
    tilt = np.exp(beta * np.clip(z, -6, 6))
    lo, hi = 0.0, 1.0 / tilt.min()
    for _ in range(100):
        c = (lo + hi) / 2
        if np.minimum(1.0, c * tilt).mean() < fraction:
            lo = c
        else:
            hi = c
    return np.minimum(1.0, hi * tilt)


def suite_order_score(suites: list[str | None], seed: int = 0) -> np.ndarray:
    """Each request's suite rank in a seeded random order of the suites (a new suite mix)."""
    names = sorted({s or "" for s in suites})
    order = np.random.default_rng(seed).permutation(len(names))
    rank = dict(zip(names, order.tolist()))
    return np.array([rank[s or ""] for s in suites], dtype=np.float64)


def shift_score(
    name: str, test: RoutingData, difficulty: np.ndarray | None = None, seed: int = 0
) -> np.ndarray | None:
    """The covariate a shift tilts along, per test request (higher: kept more often); None
    where the set cannot be shifted that way (one suite only)."""
    if name == "hard":
        if difficulty is None:
            raise ValueError("the 'hard' shift needs each test request's difficulty score")
        return np.asarray(difficulty, dtype=np.float64)
    if name == "suites":
        return None if len({s or "" for s in test.suites}) < 2 else suite_order_score(test.suites, seed)
    if name == "long":
        return np.log1p([len(p) for p in test.prompts])
    raise ValueError(f"unknown shift {name!r}; expected one of {SHIFTS}")


def shifted(
    name: str,
    test: RoutingData,
    difficulty: np.ndarray | None = None,
    *,
    seed: int = 0,
    fraction: float = 0.5,
    beta: float = 1.0,
) -> Shift | None:
    """The test requests a shifted traffic would bring (None where the shift does not apply)."""
    score = shift_score(name, test, difficulty, seed)
    if score is None:
        return None
    p = keep_probability(score, fraction, beta)
    keep = np.flatnonzero(np.random.default_rng(1000 + seed).random(len(p)) < p)
    return Shift(name, keep, DESCRIBE[name])
