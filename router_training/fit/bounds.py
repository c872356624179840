"""The knob's certificate: the largest quality target x a point keeps, and what it assumes.

A point keeps target x when the mean paired margin `y_point - x * y_reference` over the traffic
it serves is >= 0. The certificate is a one-sided lower confidence bound (normal approximation)
of that mean, computed three ways, by what is assumed of the traffic:

* **exchangeable** (the default): traffic is like the calibration requests; the plain mean.
* **traffic**: unlabelled traffic is known (`routeopt.router_training.fit.covariate`): each calibration
  request is weighted by its density ratio toward it; the weighted mean, with the standard
  error of a weighted mean (it rests on the Kish effective sample size, not on n).
* **robust**: nothing is known about the traffic; the bound holds for every traffic whose mix
  over cells (suite x difficulty band) differs from the calibration mix by at most a factor
  `gamma` in each cell, the requests within a cell unchanged. The worst such mix is found per
  point and target (a small linear programme solved greedily), and its stratified bound is used.

Pure functions over arrays; `X_GRID` is the grid of targets every bound is evaluated on.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from statistics import NormalDist

import numpy as np

X_GRID = np.round(np.arange(0.0, 2.0005, 0.0005), 4)
MODES = ("exchangeable", "traffic", "robust")


@dataclass(frozen=True)
class Assumption:
    """What a knob's certificate assumes of the traffic it serves (recorded in the manifest)."""

    mode: str = "exchangeable"
    gamma: float | None = None  # robust: the largest factor by which a cell's share may change
    cells: str | None = None  # robust: how requests are grouped
    traffic: dict = field(default_factory=dict)  # traffic: the sample and its weights' summary

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"certificate mode must be one of {MODES}, got {self.mode!r}")
        if self.mode == "robust" and not (self.gamma is not None and self.gamma >= 1):
            raise ValueError(f"a robust certificate needs gamma >= 1, got {self.gamma!r}")

    def describe(self) -> str:
        if self.mode == "traffic":
            ess = self.traffic.get("effective_sample_size")
            return (
                f"requests like the traffic sample of {self.traffic.get('n_traffic')} requests: calibration "
                f"requests weighted toward it (effective sample size {ess:.0f})"
                if ess is not None
                else "requests like the traffic sample"
            )
        if self.mode == "robust":
            return (
                f"any traffic whose mix over {self.cells} cells is within a factor {self.gamma:g} "
                "of the calibration mix, each cell's requests like its calibration requests"
            )
        return "requests exchangeable with the calibration requests (drawn like the eval suites)"

    def to_dict(self) -> dict:
        d = {k: v for k, v in asdict(self).items() if v not in (None, {})}
        d["assumes"] = self.describe()
        return d


def _z(confidence: float) -> float:
    return NormalDist().inv_cdf(confidence)


def _first_failure(ok: np.ndarray) -> np.ndarray:
    """Per row, the largest grid target such that it and every smaller one pass (0 if none)."""
    first_fail = np.where(ok.all(1), ok.shape[1], np.argmin(ok, axis=1))
    return np.where(first_fail > 0, X_GRID[: ok.shape[1]][np.maximum(first_fail - 1, 0)], 0.0)


def certified_targets(
    a: np.ndarray, r: np.ndarray, confidence: float, weights: np.ndarray | None = None
) -> np.ndarray:
    """Per point (rows of a), the largest x with LCB(mean(a - x r)) >= 0 on `X_GRID`.

    With `weights` the means are weighted and the standard error is that of a weighted mean,
    sqrt(n / (n - 1) * sum w^2 (d - mean)^2) / sum w, which for equal weights is the usual
    sd / sqrt(n). The grid is searched by bisection (`_bisected`), with the whole grid's answer
    to the bit."""
    n = a.shape[1]
    w = np.ones(n) if weights is None else np.asarray(weights, dtype=np.float64)
    total = w.sum()
    if n == 0 or total <= 0:
        return np.zeros(len(a))
    am, rm = (a * w).sum(1) / total, float((r * w).sum() / total)
    da, dr = a - am[:, None], r - rm
    w2 = w * w
    va, vr = (w2 * da * da).sum(1), float((w2 * dr * dr).sum())
    cov = (w2 * da * dr).sum(1)
    bound = _Bound(am, rm, va, vr, cov, total, n, _z(confidence))
    if n < 2 or not bound.z > 0:
        return _first_failure(bound.on_grid(np.arange(len(a))) >= 0)
    return _bisected(bound, len(a))


@dataclass(frozen=True)
class _Bound:
    """The lower confidence bound of mean(a - x r) per point, from its sums."""

    am: np.ndarray
    rm: float
    va: np.ndarray
    vr: float
    cov: np.ndarray
    total: float
    n: int
    z: float

    def at(self, x: np.ndarray, rows: np.ndarray) -> np.ndarray:
        """The bound of each of `rows` at its own target (x: (k,)) or targets (x: (k, w)), by
        the same operations in the same order whatever the shape, so a point's bound is the
        same bits however it is reached."""
        col = (slice(None),) + (None,) * (x.ndim - 1)
        am, va, cov = self.am[rows][col], self.va[rows][col], self.cov[rows][col]
        mean = am - x * self.rm
        spread = np.sqrt(np.maximum(va - 2 * x * cov + x * x * self.vr, 0.0))
        n = self.n
        se = spread / self.total * math.sqrt(n / (n - 1)) if n > 1 else np.full_like(spread, np.inf)
        return mean - self.z * se

    def on_grid(self, rows: np.ndarray) -> np.ndarray:
        """The bound of `rows` at every target of `X_GRID` (k, len(X_GRID))."""
        return self.at(np.broadcast_to(X_GRID, (len(rows), len(X_GRID))), rows)


def _bisected(bound: _Bound, points: int) -> np.ndarray:
    """`_first_failure` over the whole grid, by bisection: the bound is a line minus a norm of
    an affine function of x, so concave, and where it holds at 0 it holds up to one end. The
    grid points around each end are evaluated one by one, and a row whose bound comes within
    rounding of 0 where concavity is relied on (0, the last target, the window's start) is
    evaluated on the whole grid."""
    rows, last = np.arange(points), len(X_GRID) - 1
    first_lcb = bound.at(np.full(points, X_GRID[0]), rows)
    last_lcb = bound.at(np.full(points, X_GRID[last]), rows)
    out = np.where((first_lcb >= 0) & (last_lcb >= 0), X_GRID[last], 0.0)  # failing at 0: 0
    ends = np.flatnonzero((first_lcb >= 0) & (last_lcb < 0))
    lo, hi = np.zeros(len(ends), dtype=np.intp), np.full(len(ends), last)
    while (wide := np.flatnonzero(hi - lo > 1)).size:
        mid = (lo[wide] + hi[wide]) // 2
        ok = bound.at(X_GRID[mid], ends[wide]) >= 0
        lo[wide[ok]], hi[wide[~ok]] = mid[ok], mid[~ok]
    near = np.clip(hi[:, None] + np.arange(-_WINDOW, _WINDOW + 1), 0, last)
    window = bound.at(X_GRID[near], ends)
    ok = window >= 0
    first = np.where(ok.all(1), last + 1, near[np.arange(len(ends)), np.argmin(ok, axis=1)])
    out[ends] = np.where(first > 0, X_GRID[np.maximum(first - 1, 0)], 0.0)
    doubtful = _near_zero(first_lcb) | _near_zero(last_lcb)
    doubtful[ends] |= _near_zero(window[:, 0]) | ~ok[:, 0]
    if doubtful.any():
        d = np.flatnonzero(doubtful)
        out[d] = _first_failure(bound.on_grid(d) >= 0)
    return out


_WINDOW = 4  # grid points either side of a bisected end that are evaluated one by one


def _near_zero(bound: np.ndarray) -> np.ndarray:
    """Where a bound is >= 0 by less than rounding could move it, or not a number."""
    return ~((bound > _ROUNDING) | (bound < 0))


_ROUNDING = 1e-9  # a bound this close to 0 may be on either side of it after rounding


def worst_case_mix(m: np.ndarray, p: np.ndarray, gamma: float) -> np.ndarray:
    """The cell shares pi minimising sum(pi * m) over pi in [p / gamma, gamma * p] (at most 1),
    sum(pi) = 1: every cell starts at its lowest share and the rest of the mass goes to the
    cells with the lowest m first. `m` may be (..., cells); `p` is (cells,), summing to 1."""
    m = np.asarray(m, dtype=np.float64)
    p = np.asarray(p, dtype=np.float64)
    lo, hi = p / gamma, np.minimum(1.0, p * gamma)
    order = np.argsort(m, axis=-1, kind="stable")
    room = np.take(hi - lo, order)
    rest = 1.0 - lo.sum()
    before = np.cumsum(room, axis=-1) - room
    extra = np.clip(rest - before, 0.0, room)
    pi = np.broadcast_to(lo, m.shape).copy()
    np.put_along_axis(pi, order, np.take_along_axis(pi, order, -1) + extra, -1)
    return pi


def robust_certified_targets(
    a: np.ndarray, r: np.ndarray, confidence: float, cells: np.ndarray, gamma: float
) -> np.ndarray:
    """Per point, the largest x whose bound holds under the worst cell mix within `gamma` of the
    calibration mix: sum(pi_c m_c) - z sqrt(sum(pi_c^2 s_c^2 / n_c)), with m_c and s_c the
    cell's mean and standard deviation of the margin (a cell of one request counts its
    margin's whole range, 1 + x, as its spread)."""
    cells = np.asarray(cells)
    names, idx = np.unique(cells, return_inverse=True)
    g, n = len(names), len(cells)
    counts = np.bincount(idx, minlength=g).astype(float)
    p = counts / n
    onehot = np.zeros((n, g))
    onehot[np.arange(n), idx] = 1.0
    am, rm = (a @ onehot) / counts, (r @ onehot) / counts
    da, dr = a - am[:, idx], r - rm[idx]
    denom = np.maximum(counts - 1, 1)
    va, vr = ((da * da) @ onehot) / denom, ((dr * dr) @ onehot) / denom
    cov = ((da * dr) @ onehot) / denom
    z = _z(confidence)
    out = np.zeros(len(a))
    x = X_GRID[:, None]
    for j in range(len(a)):
        m = am[j][None, :] - x * rm[None, :]  # (grid, cells)
        var = np.maximum(va[j] - 2 * x * cov[j] + x * x * vr, 0.0)
        var = np.where(counts > 1, var, (1 + x) ** 2)
        pi = worst_case_mix(m, p, gamma)
        lcb = (pi * m).sum(1) - z * np.sqrt((pi * pi * var / counts).sum(1))
        out[j] = _first_failure((lcb >= 0)[None, :])[0]
    return out


def difficulty_cells(suites: list[str | None], score: np.ndarray, bands: int = 3) -> np.ndarray:
    """Cell labels 'suite|band': each suite's requests cut into `bands` equal-count bands of a
    difficulty score (the reference candidate's predicted pass probability), easiest first."""
    suites_arr = np.array([s or "" for s in suites], dtype=object)
    score = np.asarray(score, dtype=np.float64)
    out = np.empty(len(score), dtype=object)
    for s in np.unique(suites_arr):
        rows = np.flatnonzero(suites_arr == s)
        rank = np.argsort(np.argsort(-score[rows], kind="stable"), kind="stable")
        band = (rank * bands) // max(len(rows), 1)
        out[rows] = [f"{s}|{b}" for b in band]
    return out.astype(str)
