"""The router and its baselines traced on the same held-out requests, side by side.

Baselines: best single candidate (best on training data), zero router (random mixes of single
candidates: the hull of their points), per-suite router, kNN over text, and the oracle. Every
score-based router shares the policy's cost model and decision rule, so differences come from
the pass-probability estimates alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from router_training import metrics as M
from router_training.data import RoutingData
from router_training.estimators import KNNPassEstimator, PerSuitePassEstimator, design_matrix
from router_training.policy import RoutingPolicy, choose


@dataclass
class Curve:
    """Operating points of one router on test data: mean cost per request and pass rate."""

    name: str
    costs: np.ndarray
    quality: np.ndarray
    pair_share: np.ndarray = field(default_factory=lambda: np.empty(0))
    pair_quality: np.ndarray = field(default_factory=lambda: np.empty(0))


def param_grid(rule: str, C: np.ndarray) -> np.ndarray:
    """Rule parameters dense enough to trace a full curve, from 'max quality' to 'cheapest'."""
    if rule == "threshold":
        return np.concatenate((np.linspace(0.0, 1.0, 401), [1.01]))
    scale = float(np.nanmean(C)) or 1.0
    return np.concatenate(([0.0], np.geomspace(1e-4, 1e6, 500) / scale))


def outcomes_of(choice: np.ndarray, data: RoutingData) -> tuple[float, float]:
    """Test pass rate and mean cost per request of one choice per request."""
    rows = np.arange(len(data))
    return float(np.mean(data.Y[rows, choice])), float(np.mean(data.C[rows, choice]))


def sweep(name: str, P: np.ndarray, Cp: np.ndarray, data: RoutingData, rule: str) -> Curve:
    """Trace a score-based router over its rule parameter."""
    points = [outcomes_of(choose(P, Cp, rule, t)[:, 0], data) for t in param_grid(rule, Cp)]
    q, c = np.array(points).T
    return Curve(name, c, q)


def pair_sweep(curve: Curve, P: np.ndarray, data: RoutingData, strong: int, weak: int) -> None:
    """Trace a two-candidate router (strong vs weak) by thresholding the pass-probability gap."""
    gap = P[:, strong] - P[:, weak]
    shares, quality = [], []
    for t in np.unique(np.concatenate((gap, [np.inf]))):
        choice = np.where(gap >= t, strong, weak)
        shares.append(float(np.mean(choice == strong)))
        quality.append(outcomes_of(choice, data)[0])
    curve.pair_share, curve.pair_quality = np.array(shares), np.array(quality)


def summarise(curve: Curve, ref_quality: float, ref_cost: float, cost_range: tuple[float, float],
              pair: tuple[float, float] | None) -> dict:
    """Savings at the best single's quality and at 95% of it, AIQ, and APGR/CPT for the pair."""
    hc, hq = M.frontier(curve.costs, curve.quality)
    row = {
        "savings_at_best": M.savings(hc, hq, ref_quality, ref_cost),
        "savings_at_95": M.savings(hc, hq, 0.95 * ref_quality, ref_cost),
        "aiq": M.aiq(hc, hq, *cost_range),
        "max_quality": float(hq.max()) if len(hq) else math.nan,
    }
    if pair is not None and len(curve.pair_share):
        q_weak, q_strong = pair
        row["apgr"] = M.apgr(curve.pair_share, curve.pair_quality, q_weak, q_strong)
        row["cpt50"] = M.cpt(curve.pair_share, curve.pair_quality, q_weak, q_strong, 0.5)
        row["cpt80"] = M.cpt(curve.pair_share, curve.pair_quality, q_weak, q_strong, 0.8)
    return row


def _train_rates(train: RoutingData) -> tuple[np.ndarray, np.ndarray]:
    return np.nanmean(train.Y, axis=0), np.nanmean(train.C, axis=0)


def evaluate(policy: RoutingPolicy, train: RoutingData, test: RoutingData, knn_k: int = 25,
             others: dict[str, RoutingPolicy] | None = None) -> dict:
    """Every router's curve and summary on complete test requests; JSON-serialisable.

    `others` adds more trained policies (same candidates) as rows, each traced with its own rule.
    """
    test = test.align(policy.candidates).complete()
    train = train.align(policy.candidates)
    if len(test) == 0:
        raise ValueError("no test request has outcomes for every candidate: cannot evaluate")
    spec = policy.spec
    X_tr = design_matrix(train.prompts, train.suites, spec)
    X_te = design_matrix(test.prompts, test.suites, spec)
    P, Cp = policy.predict(test.prompts, test.suites)
    n_suites = len(spec.suites)
    scored = {
        "router": P,
        "per_suite": PerSuitePassEstimator(n_suites=n_suites).fit(X_tr, train.Y).predict_proba(X_te),
        "knn": KNNPassEstimator(k=knn_k, n_suites=n_suites, n_buckets=spec.n_buckets).fit(X_tr, train.Y).predict_proba(X_te),
    }
    rate, mean_cost = _train_rates(train)
    best, cheapest = int(np.nanargmax(rate)), int(np.nanargmin(mean_cost))
    singles = [outcomes_of(np.full(len(test), j), test) for j in range(len(policy.candidates))]
    sq, sc = np.array(singles).T
    oracle_q, oracle_c = outcomes_of(M.oracle_choice(test.Y, test.C), test)
    curves = [sweep(name, p, Cp, test, policy.rule) for name, p in scored.items()]
    for curve, p in zip(curves, scored.values()):
        pair_sweep(curve, p, test, best, cheapest)
    for name, other in (others or {}).items():
        P_o, Cp_o = other.predict(test.prompts, test.suites)
        curves.insert(1, sweep(name, P_o, Cp_o, test, other.rule))
        pair_sweep(curves[1], P_o, test, best, cheapest)
    curves += [
        Curve("zero_router", sc, sq),
        Curve("best_single", sc[best: best + 1], sq[best: best + 1]),
        Curve("oracle", np.array([oracle_c]), np.array([oracle_q])),
    ]
    cost_range = (float(sc.min()), float(sc.max()))
    pair = (float(sq[cheapest]), float(sq[best])) if best != cheapest else None
    table = {c.name: summarise(c, sq[best], sc[best], cost_range, pair) for c in curves}
    return {
        "n_test_requests": len(test),
        "best_single": {"model": policy.candidates[best], "pass_rate": sq[best], "cost": sc[best]},
        "cheapest_single": {"model": policy.candidates[cheapest], "pass_rate": sq[cheapest],
                            "cost": sc[cheapest]},
        "oracle": {"pass_rate": oracle_q, "cost": oracle_c},
        "per_candidate": {m: {"pass_rate": float(q), "cost": float(c)}
                          for m, q, c in zip(policy.candidates, sq, sc)},
        "pair": {"strong": policy.candidates[best], "weak": policy.candidates[cheapest]},
        "table": table,
        "curves": {c.name: {"cost": c.costs.tolist(), "quality": c.quality.tolist()} for c in curves},
    }
