"""Cost-quality metrics as small pure functions over arrays.

A router traced over its parameter gives points (cost, quality). Randomly mixing two operating
points reaches any point on the segment between them, so what a router can achieve is the
non-decreasing upper convex hull of its points (RouterBench). Savings and AIQ read that hull.
"""

from __future__ import annotations

import math

import numpy as np


def frontier(costs: np.ndarray, quality: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The non-decreasing upper convex hull of (cost, quality) points, sorted by cost."""
    c = np.asarray(costs, dtype=np.float64).ravel()
    q = np.asarray(quality, dtype=np.float64).ravel()
    ok = np.isfinite(c) & np.isfinite(q)
    c, q = c[ok], q[ok]
    if len(c) == 0:
        return np.empty(0), np.empty(0)
    order = np.lexsort((-q, c))
    hull: list[tuple[float, float]] = []
    for x, y in zip(c[order], q[order]):
        if hull and y <= hull[-1][1]:
            continue  # dominated: no better than something as cheap
        if hull and x - hull[-1][0] <= 1e-12 * abs(x):
            # as cheap up to rounding, and better: it replaces the last point at that point's
            # (lower) cost, so the hull still starts at the cheapest input (0/0 otherwise)
            x = hull.pop()[0]
        while len(hull) >= 2:
            (x1, y1), (x2, y2) = hull[-2], hull[-1]
            if (y2 - y1) * (x - x1) <= (y - y1) * (x2 - x1):
                hull.pop()  # the middle point lies on or under the chord
            else:
                break
        hull.append((x, y))
    arr = np.array(hull)
    return arr[:, 0], arr[:, 1]


def quality_at_cost(hc: np.ndarray, hq: np.ndarray, cost: float) -> float:
    """Best quality reachable at a budget: 0 below the cheapest point, flat past the dearest."""
    if len(hc) == 0 or cost < hc[0]:
        return 0.0
    return float(np.interp(cost, hc, hq))


def cost_at_quality(hc: np.ndarray, hq: np.ndarray, quality: float) -> float:
    """Least cost that reaches a quality on the hull; inf when the router never gets there."""
    if len(hc) == 0 or quality > hq[-1] + 1e-12:
        return math.inf
    if quality <= hq[0]:
        return float(hc[0])
    if quality >= hq[-1]:  # the dearest point, or within the tolerance above it
        return float(hc[-1])
    i = min(int(np.searchsorted(hq, quality)), len(hq) - 1)  # hq[i-1] < quality <= hq[i]
    t = min((quality - hq[i - 1]) / (hq[i] - hq[i - 1]), 1.0)  # a fraction: np.interp's slope can overflow
    return float(hc[i - 1] + t * (hc[i] - hc[i - 1]))


def savings(hc: np.ndarray, hq: np.ndarray, quality: float, reference_cost: float) -> float:
    """1 - cost(reach quality) / reference cost; NaN when the quality is out of reach."""
    cost = cost_at_quality(hc, hq, quality)
    if not math.isfinite(cost) or reference_cost <= 0:
        return math.nan
    return 1.0 - cost / reference_cost


def aiq(hc: np.ndarray, hq: np.ndarray, cost_min: float, cost_max: float, n: int = 2001) -> float:
    """Average quality over the budget range [cost_min, cost_max] (RouterBench's AIQ)."""
    if len(hc) == 0:
        return 0.0
    if cost_max <= cost_min:
        return quality_at_cost(hc, hq, cost_max)
    grid = np.linspace(cost_min, cost_max, n)
    values = np.where(grid < hc[0], 0.0, np.interp(grid, hc, hq))
    return float(np.trapezoid(values, grid) / (cost_max - cost_min))


def confidence_at_least(successes: float, n: int, floor: float) -> float:
    """Approximate confidence that the true pass rate is >= floor, from n observed outcomes."""
    if n <= 0:
        return 0.0
    p = (successes + 0.5) / (n + 1)
    se = math.sqrt(p * (1 - p) / n)
    return 0.5 * (1 + math.erf((successes / n - floor) / (se * math.sqrt(2))))


def oracle_choice(Y: np.ndarray, C: np.ndarray) -> np.ndarray:
    """Per request, the cheapest candidate that passed, or the cheapest one if none did."""
    Y = np.nan_to_num(np.asarray(Y, dtype=np.float64), nan=0.0)
    C = np.nan_to_num(np.asarray(C, dtype=np.float64), nan=np.inf)
    passing = np.where(Y >= 0.5, C, np.inf)
    cheapest = C.argmin(axis=1)
    best = passing.argmin(axis=1)
    return np.where(np.isfinite(passing.min(axis=1)), best, cheapest)
