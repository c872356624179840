"""Latency budgets from the eval's own measurements: the latency model and the certified tiers.

**The model** (`fit_latency_model`). Per candidate, kind (`ttft`, `latency`) and quantile (p50,
p95): seconds = intercept + slope * kchars + suite offset. The slope is the least-squares slope
of the measured seconds on the prompt's length (never negative); the intercept is the
quantile of what the slope leaves over the candidate's requests, and a suite with at least
`MIN_SUITE_ROWS` measured requests gets the offset of its own quantile from that. Requests a
candidate has no measurement for (replayed or batch outcomes) are left out and counted; a kind
some candidate has fewer than `MIN_ROWS` measurements of gets no model (and no budgets).

**The tiers** (`latency_policy`). For each budget on a grid spanning the candidates' predicted
p95 (cross-fitted: each calibration request's prediction comes from the model fitted on the
other folds), a knob is built on the calibration requests with every member restricted to the
candidates the tier's mask allows (`budget_mask`: predicted p95 within the budget times a
scale, `mask_scale`, chosen on the selection half below; with `open_mask`, the widest scale
opens the mask to every candidate on every calibration request). As for the quality knob, its hull
is chosen on a fixed random half of the requests and tested on the other half in a fixed
sequence, the reference's own restricted choice included: a point is certified for target x
only while every point before it and itself pass both tests, the quality margin's lower bound
(`routeopt.router_training.fit.bounds`) and the one-sided normal upper bound of its violation
rate (the share of requests whose measured seconds exceeded the budget) at or below `alpha`.
Requiring both (an intersection-union test) keeps each at the knob's confidence. The sequence
and the mask's scale are chosen on the selection half alone (Pareto testing): the points
predicted to pass the violation test come first, dearest first, and the scale is the one whose
cheapest point predicted to serve the policy's target is cheapest. A budget whose knob
certifies nothing is not offered. Requests without a measurement of the chosen candidate are
left out of the violation rate: the bound assumes they are missing at random.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from statistics import NormalDist
from typing import Any

import numpy as np

from routeopt.router_training.fit.bounds import Assumption
from routeopt.router_training.fit.knob_fitting import (
    Calibration,
    Certifier,
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
MASK_SCALES = (1.0, 1.25, 1.5, 2.0)  # how far past its budget a tier's mask may reach (mask_scale)
# and, with `open_mask`, the scale that allows every candidate on every calibration request
# mask_scale's predictions: standard errors past the certificate's, chosen by cross-validation
# on the training splits (benchmarks/latency_budgets.py --cv); infinite keeps masks at the budget.
DEFAULT_MARGIN = 0.5


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


def _violation_ucb(v: np.ndarray, z: float, n: int | None = None) -> np.ndarray:
    """Per point (rows of `v`: 1 over budget, 0 within, NaN unmeasured), the one-sided normal
    upper bound of the mean violation over its measured requests; with `n`, the bound that mean
    would have on `n` requests (what the test half's bound is predicted to be)."""
    measured = ~np.isnan(v)
    count = measured.sum(axis=1)
    safe = np.maximum(count, 1)
    mean = np.where(measured, v, 0.0).sum(axis=1) / safe
    var = np.where(measured, (v - mean[:, None]) ** 2, 0.0).sum(axis=1) / np.maximum(count - 1, 1)
    ucb = mean + z * np.sqrt(var / (safe if n is None else max(n, 1)))
    return np.where(count >= 2, ucb, np.inf)


class _SeenMasks:
    """The members and choices of the last few masks: neighbouring budgets and scales often give
    the same mask, and choosing members is most of a tier's cost. Choices are held as the
    smallest unsigned integers that fit the candidates. It also keeps the one restricted knob
    `mask_scale` chose, which the tier's `budget_knob` then builds on instead of building it
    again."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._found: OrderedDict[bytes, tuple[list, np.ndarray]] = OrderedDict()
        self.kept: _Restricted | None = None

    def restricted(
        self,
        cal: Calibration,
        ref: int,
        allowed: np.ndarray,
        over: np.ndarray,
        w: np.ndarray,
        sel: np.ndarray,
    ) -> "_Restricted":
        """The restricted knob of these arguments: the kept one where it is that."""
        if self.kept is not None and self.kept.key == _Restricted.key_of(allowed, over, w, sel):
            return self.kept
        return _Restricted(cal, ref, allowed, over, w, sel, self)

    def members(self, cal: Calibration, ref: int, allowed: np.ndarray) -> tuple[list, np.ndarray]:
        key = allowed.tobytes()
        if key in self._found:
            self._found.move_to_end(key)
        else:
            members, choices = _members(cal, ref, allowed)
            self._found[key] = members, choices.astype(np.min_scalar_type(max(allowed.shape[1] - 1, 0)))
            if len(self._found) > self.size:
                self._found.popitem(last=False)
        return self._found[key]


def _chosen(values: np.ndarray, choices: np.ndarray) -> np.ndarray:
    """values[i, choices[m, i]] (members x n): each member's choice's value on every request."""
    flat = np.arange(0, values.size, values.shape[1]) + choices
    return values.ravel().take(flat)


class _Restricted:
    """One mask's members, the points of their hull on the selection half (the reference's own
    restricted choice first), the members' outcomes, costs and violations on every calibration
    request, and the fixed sequence its points are tested in."""

    def __init__(
        self,
        cal: Calibration,
        ref: int,
        allowed: np.ndarray,
        over: np.ndarray,
        w: np.ndarray,
        sel: np.ndarray,
        seen: "_SeenMasks",
    ) -> None:
        Y, C = cal.filled()
        self.key = self.key_of(allowed, over, w, sel)
        self.members, choices = seen.members(cal, ref, allowed)
        self.yq, self.cq, self.vq = _chosen(Y, choices), _chosen(C, choices), _chosen(over, choices)
        hull, _ = _hull_points(self.yq[:, sel], self.cq[:, sel], w[sel])
        self.points = [(0, 0, 1.0), *[p for p in hull if p != (0, 0, 1.0)]]
        self.cost_sel = _mix(self.points, _mean(self.cq[:, sel], w[sel]))

    @staticmethod
    def key_of(allowed: np.ndarray, over: np.ndarray, w: np.ndarray, sel: np.ndarray) -> tuple[bytes, ...]:
        return allowed.tobytes(), over.tobytes(), w.tobytes(), sel.tobytes()

    def sequence(self, sel: np.ndarray, n_test: int, z: float, alpha: float) -> np.ndarray:
        """The order the points are tested in, from the selection half alone (Pareto testing):
        the points whose violation rate there predicts a pass of the test half's bound, dearest
        first, then the others, dearest first. Dearest first alone would start with the slowest
        candidates, whose failed violation test would end the sequence before any faster,
        cheaper point is tested."""
        likely = _violation_ucb(_mix(self.points, self.vq[:, sel]), z, n_test) <= alpha
        return np.lexsort((-self.cost_sel, ~likely))

    def certified(
        self,
        Y: np.ndarray,
        ref: int,
        rows: np.ndarray,
        order: np.ndarray,
        certify: Certifier,
        z: float,
        alpha: float,
        n: int | None = None,
    ) -> np.ndarray:
        """Per point, the largest target it is certified for on `rows`, tested in `order`: a point
        passes for x while it and every point before it pass both the quality margin's bound and
        the violation rate's (`n`: that bound predicted at `n` requests)."""
        targets = certify(_mix(self.points, self.yq[:, rows])[order], Y[rows, ref], rows)
        ucb = _violation_ucb(_mix(self.points, self.vq[:, rows]), z, n)[order]
        out = np.empty(len(self.points))
        out[order] = np.minimum.accumulate(np.where(ucb <= alpha, targets, -math.inf))
        return out


def open_scale(pred: np.ndarray, budget: float) -> float:
    """The mask scale, in hundredths, that lets every candidate through on every request of
    `pred` (their predicted p95): the widest `mask_scale` tries."""
    return math.ceil(float(pred.max()) / budget * 100) / 100


def mask_scale(
    cal: Calibration,
    ref: int,
    pred: np.ndarray,
    budget: float,
    over: np.ndarray,
    confidence: float,
    alpha: float,
    target: float,
    assumption: Assumption = Assumption(),
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
    seen: _SeenMasks | None = None,
    margin: float = DEFAULT_MARGIN,
    open_mask: bool = False,
) -> float:
    """How far past its budget a tier's mask reaches: the one of `MASK_SCALES` (and, with
    `open_mask`, `open_scale`) whose cheapest point predicted to be certified for the policy's
    `target` is cheapest, all of it measured on the selection half (the test half's bounds
    predicted at its size, `margin` standard errors surer than the certificate asks: the
    selection half chose the hull it predicts on); the smaller of two as cheap; 1 where none
    is, and with an infinite margin.

    A mask of predicted p95 <= budget lets through only candidates that each exceed it on about
    5% of requests, where alpha allows that share over all requests: a wider mask spends the
    slack on candidates that pass more often. The test half is untouched by the choice, so the
    certificate that follows holds as it does for any fixed mask."""
    if not math.isfinite(margin):
        return 1.0  # never surer than that: the mask stays at the budget
    Y, _ = cal.filled()
    n = Y.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    sure = NormalDist().cdf(NormalDist().inv_cdf(confidence) + margin)
    certify = certifier(sure, assumption, w, cells)
    sel = selection_half(n)
    sel_rows, n_test, z = np.flatnonzero(sel), int((~sel).sum()), NormalDist().inv_cdf(sure)
    if n_test < 2 or len(sel_rows) < 2:
        return 1.0
    best, chosen, kept = math.inf, 1.0, None
    seen, tried = seen if seen is not None else _SeenMasks(), set()
    widest = open_scale(pred, budget) if open_mask else 0.0
    for scale in (*MASK_SCALES, *([widest] if widest > MASK_SCALES[-1] else [])):
        allowed = budget_mask(pred, budget * scale)
        if allowed.tobytes() in tried:
            continue  # a smaller scale's mask: the same cost, which never beats itself
        tried.add(allowed.tobytes())
        r = _Restricted(cal, ref, allowed, over, w, sel, seen)
        order = r.sequence(sel, n_test, z, alpha)
        ok = r.certified(Y, ref, sel_rows, order, certify, z, alpha, n_test) >= target - 1e-12
        cost = float(r.cost_sel[ok].min()) if ok.any() else math.inf
        if cost < best or kept is None:
            kept = r
        if cost < best:
            best, chosen = cost, scale
    seen.kept = kept
    return chosen


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
    seen: _SeenMasks | None = None,
    margin: float = DEFAULT_MARGIN,
) -> tuple[Knob, tuple[float, ...]] | None:
    """The knob of one budget: members restricted to `allowed`, points certified for a target
    only with their violation rate (`over`: 1 where the measured seconds exceeded the budget,
    0 within, NaN unmeasured) bounded by `alpha`; None when it certifies nothing. The points
    predicted (`margin` standard errors surer) to pass the violation test lead the sequence."""
    Y, _ = cal.filled()
    n = Y.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    certify = certifier(confidence, assumption, w, cells)
    sel = selection_half(n)
    test, z = np.flatnonzero(~sel), NormalDist().inv_cdf(confidence)
    if len(test) < 2 or sel.sum() < 2:
        return None
    r = (seen if seen is not None else _SeenMasks()).restricted(cal, ref, allowed, over, w, sel)
    order = r.sequence(sel, len(test), z + (margin if math.isfinite(margin) else 0.0), alpha)
    certified = r.certified(Y, ref, test, order, certify, z, alpha)
    if not np.isfinite(certified).any():
        return None
    points = r.points
    quality, cost = _mix(points, _mean(r.yq, w)), _mix(points, _mean(r.cq, w))
    v_all = _mix(points, r.vq)
    violation = np.array([float(np.nanmean(v)) if (~np.isnan(v)).any() else math.nan for v in v_all])
    ops = [
        OperatingPoint(a, b, float(wt), float(cx), float(q), float(c))
        for (a, b, wt), cx, q, c in zip(points, certified, quality, cost)
    ]
    top = max(ops, key=lambda p: (p.pass_rate, -p.cost))
    knob = Knob.from_points(r.members, ops[1:], ops[0], top, confidence)
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
    target: float,
    alpha: float = DEFAULT_ALPHA,
    assumption: Assumption = Assumption(),
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
    margin: float = DEFAULT_MARGIN,
    open_mask: bool = False,
) -> tuple[LatencyPolicy | None, dict[str, Any]]:
    """The latency section of a policy from its calibration requests' measurements (None when
    nothing was measured enough to model), and what was measured of each kind."""
    model, report = fit_latency_model(n_chars, suite_pos, measured, n_suites)
    if model is None:
        return None, {"measurements": report}
    tiers, offered = [], {}
    for kind in model.kinds:
        pred = cross_fitted_p95(n_chars, suite_pos, measured[kind], n_suites, folds)
        offered[kind], previous, seen = [], None, _SeenMasks()
        for budget in budget_grid(pred):
            over = np.where(np.isnan(measured[kind]), np.nan, (measured[kind] > budget).astype(np.float64))
            scale = mask_scale(
                cal,
                ref,
                pred,
                budget,
                over,
                confidence,
                alpha,
                target,
                assumption,
                weights,
                cells,
                seen,
                margin,
                open_mask,
            )
            allowed = budget_mask(pred, budget * scale)
            built = budget_knob(
                cal, ref, allowed, over, confidence, alpha, assumption, weights, cells, seen, margin
            )
            if built is None:
                continue
            same = previous is not None and np.array_equal(allowed, previous[0])
            if same and built[0].to_dict() == previous[1]:
                continue  # the smaller budget's tier makes the same choices under the same certificates
            previous = allowed, built[0].to_dict()
            tiers.append(BudgetTier(kind, budget, *built, mask_s=budget * scale))
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
