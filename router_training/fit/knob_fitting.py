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
   the calibration requests) to the cheapest, point j is certified for target x when the
   one-sided lower confidence bound of the mean paired margin `y_chosen - x * y_reference` is
   >= 0 (`routeopt.router_training.fit.bounds`, under what the certificate assumes of the traffic); the walk
   stops at the first point that fails. The order must be fixed before the test sees its data.
4. **Selection** (Pareto testing, Laufer-Goldshtein et al. 2023): the hull is the members that
   look best on the requests it is chosen on, so points certified on those same requests are
   optimistic: on the demo's 315 calibration requests a cheap member passed 0.632 against the
   reference's 0.610, and 0.548 on held-out requests. `split` > 0 chooses the hull on a fixed
   random share of the requests and certifies it on the others, for every target. With
   `split` = 0 the hull of all requests certifies targets below 1 and, for targets of 1 and
   more, the hull of a random half is tested on the other half.

A target x is served by the cheapest point certified for x; a target nothing certifies (above
1 unless a point beats the reference significantly) gets the point with the best calibration
pass rate: the most the policy can do.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from routeopt.router_training.fit.bounds import Assumption, certified_targets, robust_certified_targets
from routeopt.router_training.policy.knob import lambda_choices
from routeopt.router_training.policy.routing import Knob, Member, OperatingPoint, member_choice

DEFAULT_CONFIDENCE = 0.95
STANDARD_TARGETS = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 1.0, 1.05, 1.1)
MIX_STEPS = 8  # points per hull edge: the knob moves in steps of 1/8 of an edge
Certifier = Callable[[np.ndarray, np.ndarray, np.ndarray], np.ndarray]


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
            if (quality[b] - quality[a]) * (cost[i] - cost[a]) <= (quality[i] - quality[a]) * (
                cost[b] - cost[a]
            ):
                hull.pop()
            else:
                break
        hull.append(int(i))
    return np.array(hull, dtype=int)


def _members(
    cal: Calibration, ref: int, allowed: np.ndarray | None = None
) -> tuple[list[Member], np.ndarray]:
    """Distinct members and their choices on the calibration requests (members x n), among
    the `allowed` candidates of each request where given (a latency budget's mask)."""
    members, choices, seen = [], [], set()
    k = cal.P.shape[1]
    singles = [Member("single", float(ref))] + [Member("single", float(j)) for j in range(k) if j != ref]
    lambdas = lambda_grid(cal.Cp)
    picks = [member_choice(m, cal.P, cal.Cp, allowed) for m in singles]
    picks += list(lambda_choices(lambdas, cal.P, cal.Cp, allowed))
    for m, pick in zip(singles + [Member("lambda", float(lam)) for lam in lambdas], picks):
        key = pick.tobytes()
        if key not in seen:
            seen.add(key)
            members.append(m)
            choices.append(pick)
    return members, np.array(choices)


def _mix(points: list[tuple[int, int, float]], values: np.ndarray) -> np.ndarray:
    """Per point (member a, member b, weight of a), the mix of the members' rows of `values`."""
    w = np.array([p[2] for p in points]).reshape(-1, *([1] * (values.ndim - 1)))
    return w * values[[p[0] for p in points]] + (1 - w) * values[[p[1] for p in points]]


def _mean(values: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted mean over requests (the last axis)."""
    return values @ w / w.sum()


def _hull_points(
    yq: np.ndarray, cq: np.ndarray, w: np.ndarray
) -> tuple[list[tuple[int, int, float]], np.ndarray]:
    """Points along the hull of members' (mean cost, mean outcome), weighted by `w`: (member a,
    member b, weight of a) and each point's mean cost."""
    quality, cost = _mean(yq, w), _mean(cq, w)
    verts = hull_vertices(cost, quality)
    points: list[tuple[int, int, float]] = [(int(verts[0]), int(verts[0]), 1.0)]
    for lo, hi in zip(verts[:-1], verts[1:]):
        points += [(int(hi), int(lo), s / MIX_STEPS) for s in range(1, MIX_STEPS + 1)]
    return points, _mix(points, cost)


def _fixed_sequence(
    a_out: np.ndarray,
    p_cost: np.ndarray,
    ref_cost: float,
    y_ref: np.ndarray,
    certify: Certifier,
    rows: np.ndarray,
) -> np.ndarray:
    """Certified target per point, its outcomes `a_out` on the requests `rows`: fixed-sequence
    testing from the dearest point below the reference's cost to the cheapest (-inf for points
    at or above the reference's cost)."""
    below = np.flatnonzero(p_cost < ref_cost - 1e-15)[::-1]  # dearest first: the fixed sequence
    certified = np.full(len(p_cost), -math.inf)
    if len(below):
        certified[below] = np.minimum.accumulate(certify(a_out[below], y_ref, rows))
    return certified


def selection_half(n: int, fraction: float = 0.5) -> np.ndarray:
    """The calibration requests (a fixed random share) a hull is chosen on when it is
    certified on the others."""
    return np.random.default_rng(0).random(n) < fraction


def certifier(
    confidence: float,
    assumption: Assumption,
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
) -> Certifier:
    """certify(a, y_ref, rows): certified targets of points with outcomes `a` on requests `rows`,
    under the assumption (weights for 'traffic', cells for 'robust')."""
    if assumption.mode == "robust":
        if cells is None:
            raise ValueError("a robust certificate needs each calibration request's cell")
        return lambda a, r, rows: robust_certified_targets(a, r, confidence, cells[rows], assumption.gamma)
    if assumption.mode == "traffic":
        if weights is None:
            raise ValueError("a traffic certificate needs the calibration requests' weights")
        return lambda a, r, rows: certified_targets(a, r, confidence, weights[rows])
    return lambda a, r, rows: certified_targets(a, r, confidence)


def _split_points(
    yq: np.ndarray, cq: np.ndarray, y_ref: np.ndarray, w: np.ndarray, certify: Certifier, sel: np.ndarray
) -> tuple[list, np.ndarray]:
    """Points of the hull chosen on the requests `sel` and their targets certified on the rest."""
    test = np.flatnonzero(~sel)
    sel_rows = np.flatnonzero(sel)
    if len(sel_rows) < 2 or len(test) < 2:
        return [], np.empty(0)
    points, cost_sel = _hull_points(yq[:, sel_rows], cq[:, sel_rows], w[sel_rows])
    a_out = _mix(points, yq[:, test])
    ref_cost = float(_mean(cq[0, sel_rows], w[sel_rows]))
    return points, _fixed_sequence(a_out, cost_sel, ref_cost, y_ref[test], certify, test)


def build_knob(
    cal: Calibration,
    ref: int,
    confidence: float,
    above_one: str = "split",
    *,
    split: float = 0.0,
    assumption: Assumption = Assumption(),
    weights: np.ndarray | None = None,
    cells: np.ndarray | None = None,
) -> Knob:
    """Members, hull points and their certified targets, from calibration data.

    `split` > 0: the hull is chosen on that share of the requests (`selection_half`) and every
    target is certified on the others. `split` = 0: the hull of all requests certifies targets
    below 1, and beating the reference (a target of 1 or more) needs evidence the hull was not
    chosen on (`above_one="split"`: the hull of one random half tested on the other half;
    `"full"` certifies every target on all requests). `weights` (for a traffic certificate) also
    weight the hull, the points' pass rates and costs, and the reference's."""
    if above_one not in ("split", "full"):
        raise ValueError(f"above_one must be 'split' or 'full', got {above_one!r}")
    if not 0 <= split < 1:
        raise ValueError(f"split must be in [0, 1), got {split}")
    Y, C = cal.filled()
    n = Y.shape[0]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    certify = certifier(confidence, assumption, w, cells)
    members, choices = _members(cal, ref)
    rows = np.arange(n)
    yq = Y[rows, choices]  # members x n outcomes of each member's choice
    cq = C[rows, choices]
    ref_cost, ref_quality = float(_mean(cq[0], w)), float(_mean(yq[0], w))  # member 0: the reference
    if split > 0:
        points, certified = _split_points(yq, cq, Y[:, ref], w, certify, selection_half(n, split))
    else:
        points, p_cost = _hull_points(yq, cq, w)
        certified = _fixed_sequence(_mix(points, yq), p_cost, ref_cost, Y[:, ref], certify, rows)
        if above_one == "split":
            certified = np.minimum(certified, 1.0 - 1e-6)
            pts, cert = _split_points(yq, cq, Y[:, ref], w, certify, selection_half(n))
            keep = np.flatnonzero(cert >= 1.0)
            points += [pts[i] for i in keep]
            certified = np.concatenate((certified, cert[keep]))
    p_quality, p_cost = _mix(points, _mean(yq, w)), _mix(points, _mean(cq, w))
    ops = [
        OperatingPoint(a, b, float(wt), float(cx), float(q), float(c))
        for (a, b, wt), cx, q, c in zip(points, certified, p_quality, p_cost)
    ]
    ref_point = OperatingPoint(0, 0, 1.0, 1.0, ref_quality, ref_cost)
    # past every certified target: what passed most often, the reference included (it can pass
    # more often than every hull point, whose top is then a cheaper mix)
    top = max([*ops, ref_point], key=lambda p: (p.pass_rate, -p.cost))
    return Knob.from_points(members, ops, ref_point, top, confidence)
