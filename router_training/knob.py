"""The quality knob: which operating point serves a target, and how sure we are that it holds.

A policy's operating points are built on cross-fitted calibration data (out-of-fold pass
probabilities of the training requests, their recorded outcomes and costs):

1. **Members**: deterministic rules. `argmax p - lambda * cost` for a grid of lambdas (lambda = 0
   is the most likely to pass, a large lambda the cheapest), and "always candidate k" for every k.
2. **Hull**: the upper convex hull of the members' (cost, pass rate) points. Between two hull
   vertices a point mixes them per request (a hash of the prompt picks one), so every point of
   the hull is reachable and the knob is never below a cost-weighted mix of single models.
3. **Certification** (Learn-then-Test with fixed-sequence testing, Angelopoulos et al. 2021):
   walking the hull from the dearest point below the reference (the best single candidate on
   the training requests) to the cheapest, point j is certified for target x when the one-sided
   lower confidence bound of the mean paired difference `y_chosen - x * y_reference` is >= 0;
   the walk stops at the first point that fails. With the order fixed before testing, every
   certified point would keep the promise "pass rate >= x * reference pass rate" with the stated
   confidence at once (up to the normal approximation and cross-fitting). The hull is chosen on
   the same requests; below target 1 the certificates stayed conservative on CV of the shared
   sets' training splits. Always calling the reference keeps the promise for any x <= 1.
4. **Beating the reference** (targets of 1 and more): the top of the hull is the members that
   look best on these very requests, so there the hull of a random half of the requests is
   tested on the other half (Pareto testing), and the hull of all requests certifies targets
   below 1 only.

A target x is served by the cheapest point certified for x; a target nothing certifies (above
1 unless a point beats the reference significantly) gets the point with the best calibration
pass rate: the most the policy can do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist

import numpy as np

from router_training.policy import Knob, Member, OperatingPoint, member_choice

DEFAULT_CONFIDENCE = 0.95
STANDARD_TARGETS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 1.0, 1.05, 1.1)
MIX_STEPS = 8  # points per hull edge: the knob moves in steps of 1/8 of an edge
_X_GRID = np.round(np.arange(0.0, 2.0005, 0.0005), 4)


@dataclass
class Calibration:
    """Cross-fitted calibration data: predictions P, Cp and recorded outcomes Y, costs C (n, K)."""

    P: np.ndarray
    Cp: np.ndarray
    Y: np.ndarray
    C: np.ndarray

    def filled(self) -> tuple[np.ndarray, np.ndarray]:
        """Outcomes and costs with unobserved pairs replaced by their predictions."""
        Y = np.where(np.isnan(self.Y), self.P, self.Y)
        C = np.where(np.isnan(self.C), self.Cp, self.C)
        return Y, C


def lambda_grid(Cp: np.ndarray, n: int = 160) -> np.ndarray:
    """Lambdas from 0 (most likely to pass) to 'always the cheapest', scaled to the mean cost."""
    scale = float(np.nanmean(Cp)) or 1.0
    return np.concatenate(([0.0], np.geomspace(1e-3, 1e4, n) / scale))


def hull_vertices(cost: np.ndarray, quality: np.ndarray) -> np.ndarray:
    """Indices of the non-decreasing upper convex hull of (cost, quality) points, by cost."""
    order = np.lexsort((-quality, cost))
    hull: list[int] = []
    for i in order:
        if hull and quality[i] <= quality[hull[-1]] + 1e-12:
            continue  # no better than something as cheap
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            if (quality[b] - quality[a]) * (cost[i] - cost[a]) <= (quality[i] - quality[a]) * (cost[b] - cost[a]):
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, dtype=int)


def _members(cal: Calibration, ref: int) -> tuple[list[Member], np.ndarray]:
    """Distinct members and their choices on the calibration requests (members x n)."""
    members, choices, seen = [], [], set()
    k = cal.P.shape[1]
    candidates = [Member("single", float(ref))] + [Member("single", float(j)) for j in range(k) if j != ref]
    candidates += [Member("lambda", float(lam)) for lam in lambda_grid(cal.Cp)]
    for m in candidates:
        pick = member_choice(m, cal.P, cal.Cp)
        key = pick.tobytes()
        if key not in seen:
            seen.add(key)
            members.append(m)
            choices.append(pick)
    return members, np.array(choices)


def certified_targets(a: np.ndarray, r: np.ndarray, confidence: float) -> np.ndarray:
    """Per point (rows of a), the largest x with LCB(mean(a - x r)) >= 0, a normal-approximation
    one-sided bound; it and every smaller x must pass (the bound is tested on a fine grid)."""
    n = a.shape[1]
    z = NormalDist().inv_cdf(confidence)
    am, rm = a.mean(1), r.mean()
    va = a.var(1, ddof=1) if n > 1 else np.zeros(len(a))
    vr = r.var(ddof=1) if n > 1 else 0.0
    cov = ((a - am[:, None]) * (r - rm)).sum(1) / max(n - 1, 1)
    x = _X_GRID[None, :]
    mean = am[:, None] - x * rm
    sd = np.sqrt(np.maximum(va[:, None] - 2 * x * cov[:, None] + x * x * vr, 0.0))
    ok = mean - z * sd / math.sqrt(max(n, 1)) >= 0
    first_fail = np.where(ok.all(1), len(_X_GRID), np.argmin(ok, axis=1))
    return np.where(first_fail > 0, _X_GRID[np.maximum(first_fail - 1, 0)], 0.0)


def _mix(points: list[tuple[int, int, float]], values: np.ndarray) -> np.ndarray:
    """Per point (member a, member b, weight of a), the mix of the members' rows of `values`."""
    w = np.array([p[2] for p in points]).reshape(-1, *([1] * (values.ndim - 1)))
    return w * values[[p[0] for p in points]] + (1 - w) * values[[p[1] for p in points]]


def _hull_points(yq: np.ndarray, cq: np.ndarray) -> tuple[list[tuple[int, int, float]], np.ndarray, np.ndarray]:
    """Points along the hull of members' (mean cost, mean outcome): (member a, member b, weight
    of a), each point's outcomes per request (points x n) and mean cost."""
    quality, cost = yq.mean(1), cq.mean(1)
    verts = hull_vertices(cost, quality)
    points: list[tuple[int, int, float]] = [(int(verts[0]), int(verts[0]), 1.0)]
    for lo, hi in zip(verts[:-1], verts[1:]):
        points += [(int(hi), int(lo), s / MIX_STEPS) for s in range(1, MIX_STEPS + 1)]
    return points, _mix(points, yq), _mix(points, cost)


def _fixed_sequence(a_out: np.ndarray, p_cost: np.ndarray, ref_cost: float, y_ref: np.ndarray,
                    confidence: float) -> np.ndarray:
    """Certified target per point: fixed-sequence testing from the dearest point below the
    reference's cost to the cheapest (-inf for points at or above the reference's cost)."""
    below = np.flatnonzero(p_cost < ref_cost - 1e-15)[::-1]  # dearest first: the fixed sequence
    certified = np.full(len(p_cost), -math.inf)
    if len(below):
        certified[below] = np.minimum.accumulate(certified_targets(a_out[below], y_ref, confidence))
    return certified


def selection_half(n: int) -> np.ndarray:
    """The calibration requests (a fixed random half) the hull that may beat the reference is
    chosen on; it is tested on the others."""
    return np.random.default_rng(0).random(n) < 0.5


def _beating_points(yq: np.ndarray, cq: np.ndarray, y_ref: np.ndarray, confidence: float):
    """Points of the hull of the selection half that the other half certifies for a target of
    1 or more: (points, certified targets, pass rates and costs over all requests)."""
    half = selection_half(yq.shape[1])
    sel, test = np.flatnonzero(half), np.flatnonzero(~half)
    if len(sel) < 2 or len(test) < 2:
        return [], np.empty(0), np.empty(0), np.empty(0)
    points, _, cost_sel = _hull_points(yq[:, sel], cq[:, sel])
    a_out = _mix(points, yq)
    cert = _fixed_sequence(a_out[:, test], cost_sel, float(cq[0, sel].mean()), y_ref[test], confidence)
    keep = np.flatnonzero(cert >= 1.0)
    cost = _mix(points, cq.mean(1))
    return [points[i] for i in keep], cert[keep], a_out[keep].mean(1), cost[keep]


def build_knob(cal: Calibration, ref: int, confidence: float, above_one: str = "split") -> Knob:
    """Members, hull points and their certified targets, from calibration data.

    Beating the reference (a target of 1 or more) needs evidence the hull was not chosen on
    (`above_one="split"`): the hull of one random half of the requests is tested on the other
    half, and points of the hull of all requests certify targets below 1 only. At the top of
    the hull the members are chosen for looking best on these very requests, and on CV of the
    shared sets' training splits the points certified at 1.0 on all of them fell short of the
    reference by 0.009 on average (openllm_bbh). `above_one="full"` certifies every target on
    all requests."""
    if above_one not in ("split", "full"):
        raise ValueError(f"above_one must be 'split' or 'full', got {above_one!r}")
    Y, C = cal.filled()
    members, choices = _members(cal, ref)
    rows = np.arange(Y.shape[0])
    yq = Y[rows, choices]  # members x n outcomes of each member's choice
    cq = C[rows, choices]
    ref_cost, ref_quality = float(cq[0].mean()), float(yq[0].mean())  # member 0: always the reference
    points, a_out, p_cost = _hull_points(yq, cq)
    certified = _fixed_sequence(a_out, p_cost, ref_cost, Y[:, ref], confidence)
    p_quality = a_out.mean(1)
    if above_one == "split":
        certified = np.minimum(certified, 1.0 - 1e-6)
        pts, cert, q, c = _beating_points(yq, cq, Y[:, ref], confidence)
        points += pts
        certified, p_quality, p_cost = (np.concatenate(v) for v in ((certified, cert), (p_quality, q), (p_cost, c)))
    ops = [OperatingPoint(a, b, float(wt), float(cx), float(q), float(c))
           for (a, b, wt), cx, q, c in zip(points, certified, p_quality, p_cost)]
    ref_point = OperatingPoint(0, 0, 1.0, 1.0, ref_quality, ref_cost)
    top = max(range(len(ops)), key=lambda i: (ops[i].pass_rate, -ops[i].cost))
    return Knob.from_points(members, ops, ref_point, ops[top], confidence)
