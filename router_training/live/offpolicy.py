"""Off-policy estimates: what another policy would have scored on traffic a logging policy served.

Each logged request i carries the served model a_i, the probability mu_i the logging policy gave
it (exploration included), and a reward r_i (passed, or the cost paid). A target policy puts
probability pi_i on a_i (1 or 0 for a deterministic one). With weights w_i = pi_i / mu_i:

* inverse propensity (IPS): mean(w * r), unbiased whenever mu_i > 0 wherever pi_i > 0;
* self-normalised IPS: sum(w * r) / sum(w), slightly biased, much less variable;
* doubly robust: mean(g_target_i + w_i * (r_i - g_logged_i)), where g is a reward model (the
  target policy's own pass probabilities or predicted costs): g_target_i its expectation under
  the target, g_logged_i its value for the served model. Unbiased if the propensities are right,
  whatever the reward model; close to it if the model is good.

Intervals are normal (z * standard error from the per-request terms, the delta method for the
self-normalised ratio). The effective sample size (sum w)^2 / sum w^2 says how many requests the
estimate really rests on. Pure functions over arrays; numpy only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z95 = 1.959963984540054


@dataclass(frozen=True)
class Estimate:
    """A value with its confidence interval, standard error and the data it rests on."""

    value: float
    low: float
    high: float
    se: float
    n: int
    ess: float

    def covers(self, x: float) -> bool:
        return self.low <= x <= self.high

    def to_dict(self) -> dict[str, float | int]:
        return {
            "value": self.value,
            "low": self.low,
            "high": self.high,
            "se": self.se,
            "n": self.n,
            "ess": self.ess,
        }


EMPTY = Estimate(math.nan, math.nan, math.nan, math.nan, 0, 0.0)


def _arrays(*xs: np.ndarray) -> list[np.ndarray]:
    out = [np.asarray(x, dtype=np.float64).ravel() for x in xs]
    if len({len(x) for x in out}) > 1:
        raise ValueError(f"arrays differ in length: {[len(x) for x in out]}")
    return out


def importance_weights(target_prob: np.ndarray, propensity: np.ndarray) -> np.ndarray:
    """pi / mu per request; a propensity outside (0, 1] is a logging bug and raises."""
    pi, mu = _arrays(target_prob, propensity)
    if len(mu) and (not np.all(np.isfinite(mu)) or mu.min() <= 0 or mu.max() > 1 + 1e-9):
        raise ValueError(
            "propensities must lie in (0, 1]; the log holds "
            f"{mu[~((mu > 0) & (mu <= 1 + 1e-9))][:3].tolist()}"
        )
    if len(pi) and (not np.all(np.isfinite(pi)) or pi.min() < 0 or pi.max() > 1 + 1e-9):
        raise ValueError("target probabilities must lie in [0, 1]")
    return pi / mu


def effective_sample_size(weights: np.ndarray) -> float:
    """Kish's (sum w)^2 / sum w^2: n for equal weights, 1 when one request carries everything."""
    (w,) = _arrays(weights)
    top = float(np.abs(w).max()) if len(w) else 0.0
    if top <= 0:
        return 0.0
    w = w / top  # scale-free, and tiny weights do not underflow when squared
    return float(w.sum() ** 2 / (w * w).sum())


def _interval(
    value: float, se: float, n: int, ess: float, z: float, bounds: tuple[float, float] | None
) -> Estimate:
    low, high = value - z * se, value + z * se
    if bounds is not None:
        low, high = max(low, bounds[0]), min(high, bounds[1])
    return Estimate(float(value), float(low), float(high), float(se), n, ess)


def mean_estimate(
    terms: np.ndarray,
    weights: np.ndarray | None = None,
    *,
    z: float = Z95,
    bounds: tuple[float, float] | None = None,
) -> Estimate:
    """The mean of per-request terms with a normal interval (IPS and DR are such means)."""
    (t,) = _arrays(terms)
    n = len(t)
    if n == 0:
        return EMPTY
    ess = effective_sample_size(weights) if weights is not None else float(n)
    se = float(t.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return _interval(float(t.mean()), se, n, ess, z, bounds)


def ips_terms(rewards: np.ndarray, weights: np.ndarray) -> np.ndarray:
    r, w = _arrays(rewards, weights)
    return w * r


def dr_terms(
    rewards: np.ndarray, weights: np.ndarray, g_logged: np.ndarray, g_target: np.ndarray
) -> np.ndarray:
    """g_target + w * (r - g_logged): the reward model's guess, corrected where it was observed."""
    r, w, gl, gt = _arrays(rewards, weights, g_logged, g_target)
    return gt + w * (r - gl)


def ips(
    rewards: np.ndarray, weights: np.ndarray, *, z: float = Z95, bounds: tuple[float, float] | None = None
) -> Estimate:
    return mean_estimate(ips_terms(rewards, weights), weights, z=z, bounds=bounds)


def snips(
    rewards: np.ndarray, weights: np.ndarray, *, z: float = Z95, bounds: tuple[float, float] | None = None
) -> Estimate:
    """sum(w r) / sum(w); its standard error by the delta method."""
    r, w = _arrays(rewards, weights)
    n, total = len(r), float(w.sum())
    if n == 0 or total <= 0:
        return Estimate(math.nan, math.nan, math.nan, math.nan, n, effective_sample_size(w))
    # the weights normalised before the products: w r of a subnormal w rounds (5e-324 * 0.75 is
    # 5e-324), so sum(w r) / sum(w) could leave the rewards' range; a mean of them cannot
    share = w / total
    value = float(np.clip((share * r).sum(), r.min(), r.max()))
    d = n * share * (r - value)
    se = float(d.std(ddof=1) / math.sqrt(n)) if n > 1 else math.inf
    return _interval(value, se, n, effective_sample_size(w), z, bounds)


def dr_model_variance(g_target: np.ndarray, target_propensity: np.ndarray) -> np.ndarray:
    """Per request, the variance of a doubly robust term for a 0/1 reward if the reward model is
    calibrated: g(1 - g) / mu, mu the logging probability of the target's choice. Where mu is 0
    (the logging policy could not choose it) the term is the model's guess, with variance g(1 - g)."""
    g, mu = _arrays(g_target, target_propensity)
    spread = g * (1 - g)
    return np.where(mu > 0, spread / np.where(mu > 0, mu, 1.0), spread)


def doubly_robust(
    rewards: np.ndarray,
    weights: np.ndarray,
    g_logged: np.ndarray,
    g_target: np.ndarray,
    *,
    z: float = Z95,
    bounds: tuple[float, float] | None = None,
    model_variance: np.ndarray | None = None,
) -> Estimate:
    """The doubly robust mean. With `model_variance` (see `dr_model_variance`) the standard error
    is at least what the reward model predicts: with few explored requests the sample variance
    is itself noisy and too often small, which would make the interval too narrow."""
    est = mean_estimate(dr_terms(rewards, weights, g_logged, g_target), weights, z=z, bounds=bounds)
    if model_variance is None or est.n < 2:
        return est
    (mv,) = _arrays(model_variance)
    (gt,) = _arrays(g_target)
    floor = math.sqrt((float(mv.mean()) + float(gt.var(ddof=1))) / est.n)
    return _interval(est.value, max(est.se, floor), est.n, est.ess, z, bounds)


def all_estimates(
    rewards: np.ndarray,
    weights: np.ndarray,
    g_logged: np.ndarray | None = None,
    g_target: np.ndarray | None = None,
    *,
    z: float = Z95,
    bounds: tuple[float, float] | None = None,
    model_variance: np.ndarray | None = None,
) -> dict[str, Estimate]:
    """IPS, self-normalised IPS and (given a reward model) doubly robust, on the same requests."""
    out = {
        "ips": ips(rewards, weights, z=z, bounds=bounds),
        "snips": snips(rewards, weights, z=z, bounds=bounds),
    }
    if g_logged is not None and g_target is not None:
        out["dr"] = doubly_robust(
            rewards, weights, g_logged, g_target, z=z, bounds=bounds, model_variance=model_variance
        )
    return out


def paired_difference(
    terms_a: np.ndarray,
    terms_b: np.ndarray,
    *,
    z: float = Z95,
    model_variance: np.ndarray | None = None,
    baseline_diff: np.ndarray | None = None,
) -> Estimate:
    """A - B from per-request terms of two policies on the same requests (their noise is shared,
    so the interval is narrower than the two intervals side by side). `model_variance` (per
    request, e.g. the two policies' `dr_model_variance` where they choose differently) and
    `baseline_diff` (g_target of A minus that of B) floor the standard error as in
    `doubly_robust`."""
    a, b = _arrays(terms_a, terms_b)
    est = mean_estimate(a - b, z=z)
    if model_variance is None or est.n < 2:
        return est
    (mv,) = _arrays(model_variance)
    spread = float(np.var(baseline_diff, ddof=1)) if baseline_diff is not None else 0.0
    floor = math.sqrt((float(mv.mean()) + spread) / est.n)
    return _interval(est.value, max(est.se, floor), est.n, est.ess, z, None)
