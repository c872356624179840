"""Latency budgets from the eval's own measurements: the latency model and the certified tiers.

**The model** (`fit_latency_model`). Per candidate, kind (`ttft`, `latency`) and quantile (p50,
p95): seconds = intercept + slope * kchars + suite offset. The slope is the least-squares slope
of the measured seconds on the prompt's length (never negative); the intercept is the
quantile of what the slope leaves over the candidate's requests, and a suite with at least
`MIN_SUITE_ROWS` measured requests gets the offset of its own quantile from that. Requests a
candidate has no measurement for (replayed or batch outcomes) are left out and counted; a kind
some candidate has fewer than `MIN_ROWS` measurements of gets no model (and no budgets).

**The tiers** (`budget_tiers`). For each budget on a grid spanning the candidates' predicted
p95 (cross-fitted: each calibration request's prediction comes from the model fitted on the
other folds), a knob is built on the calibration requests with every member restricted to the
candidates the budget allows (`budget_mask`). As for the quality knob, its hull is chosen on a
fixed random half of the requests and tested on the other half, dearest point first
(fixed-sequence testing), the reference's own restricted choice included: a point is certified
for target x only while every point before it and itself pass both tests, the quality margin's
lower bound (`routeopt.router_training.fit.bounds`) and the one-sided normal upper bound of its
violation rate (the share of requests whose measured seconds exceeded the budget) at or below
`alpha`. Requiring both (an intersection-union test) keeps each at the knob's confidence. A
budget whose knob certifies nothing is not offered. Requests without a measurement of the
chosen candidate are left out of the violation rate: the bound assumes they are missing at random.
"""

from __future__ import annotations

import math
from statistics import NormalDist
from typing import Any

import numpy as np

from routeopt.router_training.fit.bounds import Assumption
from routeopt.router_training.fit.knob_fitting import (
    Calibration,
    _hull_points,
    _mean,
    _members,
    _mix,
    certifier,
    selection_half,
)
from routeopt.router_training.policy.knob import Knob, OperatingPoint
from routeopt.router_training.policy.latency import (
    BUDGET_QUANTILE,
    QUANTILES,
    BudgetTier,
    LatencyModel,
    LatencyPolicy,
    budget_mask,
)
from routeopt.router_training.policy.scorer import CostModel

MIN_ROWS = 20  # measured requests every candidate needs before a kind gets a model
MIN_SUITE_ROWS = 20  # measured requests a suite needs before it gets its own offset
QUANTILE_LEVELS = {"p50": 0.5, "p95": 0.95}
GRID = 24  # budgets per kind (fewer where two allow the same candidates)
DEFAULT_ALPHA = 0.1  # the violation rate every offered budget is certified to keep


def fit_quantile_model(
    n_chars: np.ndarray, suite_pos: np.ndarray, seconds: np.ndarray, n_suites: int, quantile: str
) -> CostModel:
    """One (kind, quantile)'s model from (n, K) measured seconds (NaN: not measured)."""
    level = QUANTILE_LEVELS[quantile]
    n, k = seconds.shape
    x = np.asarray(n_chars, dtype=np.float64) / 1000.0
    coef, floor = np.zeros((2 + n_suites, k)), np.zeros(k)
    for j in range(k):
        ok = ~np.isnan(seconds[:, j])
        xj, yj, sj = x[ok], seconds[ok, j], suite_pos[ok]
        spread = float(((xj - xj.mean()) ** 2).sum())
        slope = max(float(((xj - xj.mean()) * (yj - yj.mean())).sum()) / spread, 0.0) if spread > 0 else 0.0
        rest = yj - slope * xj
        base = float(np.quantile(rest, level))
        coef[0, j], coef[1, j] = base, slope
        for s in range(n_suites):
            mine = rest[sj == s]
            if len(mine) >= MIN_SUITE_ROWS:
                coef[2 + s, j] = float(np.quantile(mine, level)) - base
        floor[j] = max(float(yj.min()), 0.0)
    return CostModel(coef=coef, floor=floor)


def fit_latency_model(
    n_chars: np.ndarray, suite_pos: np.ndarray, measured: dict[str, np.ndarray], n_suites: int
) -> tuple[LatencyModel | None, dict[str, Any]]:
    """The model of every kind each candidate has `MIN_ROWS` measurements of, and what was
    left out (per kind: requests measured, requests without a measurement, per candidate)."""
    models, report = {}, {}
    for kind, seconds in measured.items():
        counts = (~np.isnan(seconds)).sum(axis=0)
        report[kind] = {"measured": counts.tolist(), "not_measured": (len(seconds) - counts).tolist()}
        if not len(counts) or counts.min() < MIN_ROWS:
            report[kind]["no_model"] = f"a candidate has fewer than {MIN_ROWS} measured requests"
            continue
        for q in QUANTILES:
            models[kind, q] = fit_quantile_model(n_chars, suite_pos, seconds, n_suites, q)
    return (LatencyModel(models) if models else None), report


def cross_fitted_p95(
    n_chars: np.ndarray, suite_pos: np.ndarray, seconds: np.ndarray, n_suites: int, folds: np.ndarray
) -> np.ndarray:
    """(n, K) predicted p95 of each request from the model fitted on the other folds."""
    out = np.empty(seconds.shape)
    for f in np.unique(folds):
        mine = folds == f
        m = fit_quantile_model(n_chars[~mine], suite_pos[~mine], seconds[~mine], n_suites, BUDGET_QUANTILE)
        out[mine] = m.predict(n_chars[mine], suite_pos[mine])
    return out


def budget_grid(pred: np.ndarray, n: int = GRID) -> list[float]:
    """Budgets from the fastest candidate's typical p95 to the slowest's, geometric, two
    significant digits."""
    lo = float(np.quantile(pred.min(axis=1), 0.1))
    hi = float(np.quantile(pred.max(axis=1), 0.9))
    lo = max(lo, 1e-3)
    if not hi > lo:
        hi = lo * 2
    raw = np.geomspace(lo, hi, n)
    return sorted({float(f"{b:.2g}") for b in raw})


def _violation_ucb(v: np.ndarray, measured: np.ndarray, z: float) -> np.ndarray:
    """Per point (rows), the one-sided normal upper bound of the mean violation over measured requests."""
    n = measured.sum(axis=1)
    safe = np.maximum(n, 1)
    mean = np.where(measured, v, 0.0).sum(axis=1) / safe
    var = np.where(measured, (v - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(n - 1, 1)
    ucb = mean + z * np.sqrt(var / safe)
    return np.where(n >= 2, ucb, np.inf)


def budget_knob(
    cal: Calibration,
    ref: int,
    allowed: np.ndarray,
    over: np.ndarray,
    confidence: float,
    alpha: float,
    assumption: Assumption = Assumption(),
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
) -> tuple[Knob, tuple[float, ...]] | None:
    """The knob of one budget: members restricted to `allowed`, points certified for a target
    only with their violation rate (`over`: 1 where the measured seconds exceeded the budget,
    0 within, NaN unmeasured) bounded by `alpha`; None when it certifies nothing."""
    Y, C = cal.filled()
    n = Y.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    certify = certifier(confidence, assumption, w, cells)
    members, choices = _members(cal, ref, allowed)
    rows = np.arange(n)
    yq, cq, vq = Y[rows, choices], C[rows, choices], over[rows, choices]
    sel = selection_half(n)
    test, sel_rows = np.flatnonzero(~sel), np.flatnonzero(sel)
    if len(test) < 2 or len(sel_rows) < 2:
        return None
    hull, _ = _hull_points(yq[:, sel_rows], cq[:, sel_rows], w[sel_rows])
    points = [(0, 0, 1.0), *[p for p in hull if p != (0, 0, 1.0)]]  # the reference's own choice too
    cost_sel = _mix(points, _mean(cq[:, sel_rows], w[sel_rows]))
    order = np.argsort(-cost_sel, kind="stable")  # the fixed sequence: dearest first
    targets = certify(_mix(points, yq[:, test])[order], Y[test, ref], test)
    v_test = np.nan_to_num(_mix(points, vq[:, test]), nan=0.0)
    measured = ~np.isnan(_mix(points, vq[:, test]))
    ucb = _violation_ucb(v_test, measured, NormalDist().inv_cdf(confidence))[order]
    certified = np.empty(len(points))
    certified[order] = np.minimum.accumulate(np.where(ucb <= alpha, targets, -math.inf))
    if not np.isfinite(certified).any():
        return None
    quality, cost = _mix(points, _mean(yq, w)), _mix(points, _mean(cq, w))
    v_all = _mix(points, vq)
    violation = np.array([float(np.nanmean(r)) if (~np.isnan(r)).any() else math.nan for r in v_all])
    ops = [
        OperatingPoint(a, b, float(wt), float(cx), float(q), float(c))
        for (a, b, wt), cx, q, c in zip(points, certified, quality, cost)
    ]
    top = max(ops, key=lambda p: (p.pass_rate, -p.cost))
    knob = Knob.from_points(members, ops[1:], ops[0], top, confidence)
    rate = {(p.a, p.b, p.weight): v for p, v in zip(ops, violation)}
    return knob, tuple(rate[p.a, p.b, p.weight] for p in knob.points)


def latency_policy(
    cal: Calibration,
    ref: int,
    n_chars: np.ndarray,
    suite_pos: np.ndarray,
    measured: dict[str, np.ndarray],
    n_suites: int,
    folds: np.ndarray,
    confidence: float,
    alpha: float = DEFAULT_ALPHA,
    assumption: Assumption = Assumption(),
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
) -> tuple[LatencyPolicy | None, dict[str, Any]]:
    """The latency section of a policy from its calibration requests' measurements (None when
    nothing was measured enough to model), and what was measured of each kind."""
    model, report = fit_latency_model(n_chars, suite_pos, measured, n_suites)
    if model is None:
        return None, {"measurements": report}
    tiers, offered = [], {}
    for kind in model.kinds:
        pred = cross_fitted_p95(n_chars, suite_pos, measured[kind], n_suites, folds)
        offered[kind], previous = [], None
        for budget in budget_grid(pred):
            allowed = budget_mask(pred, budget)
            if previous is not None and np.array_equal(allowed, previous):
                continue  # the same candidates as a smaller budget: that tier serves this one too
            previous = allowed
            over = np.where(np.isnan(measured[kind]), np.nan, (measured[kind] > budget).astype(np.float64))
            built = budget_knob(cal, ref, allowed, over, confidence, alpha, assumption, weights, cells)
            if built is not None:
                tiers.append(BudgetTier(kind, budget, *built))
                offered[kind].append(budget)
    metrics = {
        "alpha": alpha,
        "measurements": report,
        "budgets": offered,
        "method": "per budget, the knob's hull restricted to the candidates whose cross-fitted "
        "predicted p95 meets it, chosen on a fixed random half of the calibration requests and "
        "certified on the other: a point serves target x when the quality margin's lower bound "
        "is >= 0 and the one-sided normal upper bound of its violation rate is <= alpha, for it "
        "and every dearer point (fixed-sequence testing)",
    }
    return LatencyPolicy(model, alpha, tiers, metrics), metrics
