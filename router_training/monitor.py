"""Shift monitor: do live requests still look like the requests the policy was certified on?

The knob's certificate holds for traffic like its calibration requests (or like what its
manifest says it assumes), so the first thing to watch in production is whether the traffic
still is. This needs no outcomes: every logged decision carries its suite, the prompt's length
and the serving policy's predicted pass probability of every candidate (the policy's view of a
request's difficulty and topic). The policy's metrics carry a sketch of its calibration
requests (`reference_sketch`): their suite counts, and per numeric feature the deciles and how
many requests fell in each decile bin.

Per feature, the live values are counted in the reference's bins and the two count vectors are
compared by a chi-square test of homogeneity (suites: their counts); the p-values are
Holm-adjusted over the features. The traffic has shifted when some feature's adjusted p-value is
below `alpha` and its distribution moved by at least `min_effect` in total variation (binned):
with thousands of requests a test also finds shifts too small to matter, and the policy's
predictions on new requests differ slightly from the out-of-fold ones it was calibrated on. The
report names the features and the suites that moved (each suite's share, Holm-adjusted
two-proportion tests). Pure functions over arrays and a traffic frame's columns.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np

from router_training.covariate import Sketch

ALPHA = 0.01
MIN_EFFECT = 0.05
BINS = 10


def _edges(values: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Inner bin edges at the quantiles of `values` (duplicates dropped: ties share a bin)."""
    return np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))


def _binned(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)


def reference_sketch(sketch: Sketch, candidates: Sequence[str]) -> dict:
    """What the monitor keeps of the calibration requests: suite counts, and per numeric feature
    (log characters, each candidate's pass probability) the decile edges and counts."""
    features = {"log_chars": np.log1p(sketch.chars)}
    if sketch.P is not None:
        features.update({f"p:{c}": sketch.P[:, j] for j, c in enumerate(candidates)})
    out: dict[str, Any] = {"n": len(sketch), "suites": {}, "features": {}}
    names, counts = np.unique(np.array([s or "" for s in sketch.suites], dtype=object), return_counts=True)
    out["suites"] = {str(k): int(v) for k, v in zip(names, counts)}
    for name, values in features.items():
        edges = _edges(values)
        out["features"][name] = {"edges": [round(float(e), 6) for e in edges],
                                 "counts": _binned(values, edges).tolist()}
    return out


def chi2_homogeneity(a: np.ndarray, b: np.ndarray) -> float:
    """p-value of the chi-square test that two count vectors come from one distribution
    (bins empty in both are dropped; one bin left: 1.0)."""
    from scipy.stats import chi2

    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    keep = (a + b) > 0
    a, b = a[keep], b[keep]
    if len(a) < 2 or a.sum() == 0 or b.sum() == 0:
        return 1.0
    total = a + b
    ea, eb = total * a.sum() / total.sum(), total * b.sum() / total.sum()
    stat = float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum())
    return float(chi2.sf(stat, len(a) - 1))


def total_variation(a: np.ndarray, b: np.ndarray) -> float:
    """Half the L1 distance between the two count vectors' shares (0: same, 1: disjoint)."""
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if a.sum() == 0 or b.sum() == 0:
        return 0.0
    return float(0.5 * np.abs(a / a.sum() - b / b.sum()).sum())


def holm(p: Sequence[float]) -> np.ndarray:
    """Holm's step-down adjusted p-values (family-wise error control)."""
    p = np.asarray(p, dtype=np.float64)
    m = len(p)
    if m == 0:
        return p
    order = np.argsort(p)
    adj = np.minimum(1.0, np.maximum.accumulate((m - np.arange(m)) * p[order]))
    out = np.empty(m)
    out[order] = adj
    return out


@dataclass
class FeatureShift:
    """One feature's comparison: p-value (raw, Holm-adjusted), total variation, what moved."""

    feature: str
    p_value: float
    p_adjusted: float
    effect: float
    moved: bool
    detail: str = ""


@dataclass
class ShiftReport:
    """Live traffic against the certified calibration requests."""

    n_live: int
    n_reference: int
    features: list[FeatureShift] = field(default_factory=list)
    suites_moved: list[dict] = field(default_factory=list)
    alpha: float = ALPHA
    min_effect: float = MIN_EFFECT
    policy_version: int | None = None

    @property
    def shifted(self) -> bool:
        return any(f.moved for f in self.features)

    @property
    def p_value(self) -> float:
        """The smallest Holm-adjusted p-value: the whole family's evidence of a shift."""
        return min((f.p_adjusted for f in self.features), default=1.0)

    def moved(self) -> list[FeatureShift]:
        return sorted((f for f in self.features if f.moved), key=lambda f: f.p_adjusted)

    def summary_line(self) -> str:
        if not self.features:
            return "traffic shift: nothing to compare (no logged decisions or no reference sketch)"
        if not self.shifted:
            return (f"traffic shift: none on {self.n_live} logged requests (smallest adjusted p "
                    f"{self.p_value:.2g}; the policy was certified on {self.n_reference})")
        names = ", ".join(f"{f.feature} (TV {f.effect:.2f})" for f in self.moved()[:6])
        suites = "; ".join(f"{s['suite']} {s['reference']:.0%} -> {s['live']:.0%}" for s in self.suites_moved[:6])
        return (f"traffic shift on {self.n_live} logged requests (p {self.p_value:.2g} < {self.alpha:g}): "
                f"{names}" + (f"; suites {suites}" if suites else ""))

    def to_dict(self) -> dict:
        return {"n_live": self.n_live, "n_reference": self.n_reference, "shifted": self.shifted,
                "p_value": self.p_value, "alpha": self.alpha, "min_effect": self.min_effect,
                "policy_version": self.policy_version, "summary": self.summary_line(),
                "features": [asdict(f) for f in self.features], "suites_moved": self.suites_moved}


def _suite_shares(reference: dict[str, int], live: dict[str, int], alpha: float) -> list[dict]:
    """Suites whose share moved significantly (two-proportion z-tests, Holm-adjusted)."""
    from scipy.stats import norm

    names = sorted(set(reference) | set(live))
    n_r, n_l = sum(reference.values()), sum(live.values())
    if not n_r or not n_l:
        return []
    rows, p = [], []
    for s in names:
        a, b = reference.get(s, 0) / n_r, live.get(s, 0) / n_l
        pooled = (reference.get(s, 0) + live.get(s, 0)) / (n_r + n_l)
        se = math.sqrt(max(pooled * (1 - pooled), 1e-12) * (1 / n_r + 1 / n_l))
        p.append(float(2 * norm.sf(abs(b - a) / se)))
        rows.append({"suite": s, "reference": a, "live": b})
    adj = holm(p)
    moved = [{**r, "p_adjusted": float(q)} for r, q in zip(rows, adj) if q < alpha]
    return sorted(moved, key=lambda r: -abs(r["live"] - r["reference"]))


def detect_shift(reference: dict, live: Sketch, candidates: Sequence[str], *, alpha: float = ALPHA,
               min_effect: float = MIN_EFFECT) -> ShiftReport:
    """Compare live requests (their suites, lengths and the serving policy's predictions, in
    `candidates` order) with the policy's reference sketch."""
    report = ShiftReport(len(live), int(reference.get("n", 0)), alpha=alpha, min_effect=min_effect)
    if not len(live) or not reference.get("features"):
        return report
    names, counts = np.unique(np.array([s or "" for s in live.suites], dtype=object), return_counts=True)
    live_suites = {str(k): int(v) for k, v in zip(names, counts)}
    ref_suites = reference.get("suites", {})
    keys = sorted(set(ref_suites) | set(live_suites))
    rows = [("suite", np.array([ref_suites.get(k, 0) for k in keys]), np.array([live_suites.get(k, 0) for k in keys]))]
    values = {"log_chars": np.log1p(live.chars)}
    if live.P is not None:
        values.update({f"p:{c}": live.P[:, j] for j, c in enumerate(candidates)})
    for name, spec in reference["features"].items():
        v = values.get(name)
        if v is None:
            continue
        ok = np.isfinite(v)
        rows.append((name, np.asarray(spec["counts"]), _binned(v[ok], np.asarray(spec["edges"]))))
    p = [chi2_homogeneity(a, b) for _, a, b in rows]
    for (name, a, b), raw, adj in zip(rows, p, holm(p)):
        tv = total_variation(a, b)
        report.features.append(FeatureShift(name, raw, float(adj), tv, bool(adj < alpha and tv >= min_effect)))
    report.suites_moved = _suite_shares(ref_suites, live_suites, alpha)
    return report


def live_sketch(frame: Any, candidates: Sequence[str]) -> Sketch:
    """The sketch of logged decisions (a traffic frame of `evals.storage.traffic`): suite,
    prompt characters and the logged pass probabilities in `candidates` order (NaN where a
    record lacks one)."""
    P = np.full((len(frame), len(candidates)), np.nan)
    for i, text in enumerate(frame["pass_probabilities_json"].tolist()):
        probs = json.loads(text) if isinstance(text, str) and text else {}
        P[i] = [probs.get(c, np.nan) for c in candidates]
    suites = [s if isinstance(s, str) else None for s in frame["suite"].tolist()]
    chars = frame["prompt_chars"].to_numpy(dtype=np.float64) if "prompt_chars" in frame else np.full(len(frame), np.nan)
    return Sketch(suites, np.nan_to_num(chars, nan=0.0), P)
