"""Shift monitor: do live requests still look like the requests the policy was certified on?

The knob's certificate holds for traffic like its calibration requests (or like what its
manifest says it assumes), so the first thing to watch in production is whether the traffic
still is. This needs no outcomes. Every logged decision carries its suite, the prompt's length
and the model the policy chose at the request's quality target; the policy's metrics carry a
sketch of its calibration requests (`reference_sketch`): suite counts, the deciles of the log
length with how many requests fell in each bin, and the models its knob chose for them at each
standard target (out-of-fold, as certified). Harder traffic moves the routing toward stronger
models, another suite mix moves the suite counts, longer prompts the length.

Per feature, the live counts are compared with the reference's by a chi-square test of
homogeneity; the p-values are Holm-adjusted over the features. The traffic has shifted when a
feature's adjusted p-value is below `alpha` and its distribution moved by at least `min_effect`
in total variation (binned): with thousands of requests a test finds shifts too small to
matter. Routing gets a larger threshold (`route_min_effect`): the policy's choices on new
requests (the mean of its fold models) differ a little from its out-of-fold ones (total
variation up to 0.055 on the shared sets' unshifted test splits). Its predicted pass
probabilities are not compared at all: out-of-fold and averaged predictions differ by up to 0.4
in total variation on the same requests. The report names the features and the suites that
moved (each suite's share, Holm-adjusted two-proportion tests).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

import numpy as np


ALPHA = 0.01
MIN_EFFECT = 0.05
ROUTE_MIN_EFFECT = 0.1
MIN_GROUP = 50  # logged requests at one target before its routing is compared
BINS = 10


def _edges(values: np.ndarray, bins: int = BINS) -> np.ndarray:
    """Inner bin edges at the quantiles of `values` (duplicates dropped: ties share a bin)."""
    return np.unique(np.quantile(values, np.linspace(0, 1, bins + 1)[1:-1]))


def _binned(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    return np.bincount(np.searchsorted(edges, values, side="right"), minlength=len(edges) + 1)


def _target_key(x: float) -> str:
    return f"{float(x):g}"


@dataclass
class Logged:
    """What the monitor reads of logged decisions: suite, prompt characters, the quality target
    each request was routed at and the model the policy chose for it (None where unknown)."""

    suites: list[str | None]
    chars: np.ndarray
    targets: list[float] = field(default_factory=list)
    routed: list[str | None] = field(default_factory=list)
    keys: list[str | None] | None = None  # each request's prompt hash, where logged

    def __len__(self) -> int:
        return len(self.suites)

    def distinct(self) -> int:
        """How many independent observations of the request distribution the log holds: its
        distinct prompts where hashes were logged (a prompt sent 100 times is one request
        text seen 100 times, not 100 draws), else every record."""
        if self.keys is None:
            return len(self)
        known = [k for k in self.keys if k]
        return len(set(known)) + (len(self.keys) - len(known))


def reference_sketch(
    suites: Sequence[str | None], chars: np.ndarray, routes: dict[float, Sequence[str]]
) -> dict:
    """What the monitor keeps of the calibration requests: suite counts, log-length deciles and
    counts, and per target the models the knob chose for them."""
    out: dict[str, Any] = {"n": len(suites), "suites": {}, "features": {}, "routes": {}}
    names, counts = np.unique(np.array([s or "" for s in suites], dtype=object), return_counts=True)
    out["suites"] = {str(k): int(v) for k, v in zip(names, counts)}
    values = np.log1p(np.asarray(chars, dtype=np.float64))
    edges = _edges(values)
    out["features"]["log_chars"] = {
        "edges": [round(float(e), 6) for e in edges],
        "counts": _binned(values, edges).tolist(),
    }
    for x, models in routes.items():
        m, c = np.unique(np.asarray(list(models), dtype=object), return_counts=True)
        out["routes"][_target_key(x)] = {str(k): int(v) for k, v in zip(m, c)}
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
            return (
                f"traffic shift: none on {self.n_live} logged requests (smallest adjusted p "
                f"{self.p_value:.2g}; the policy was certified on {self.n_reference})"
            )
        names = ", ".join(f"{f.feature} (TV {f.effect:.2f})" for f in self.moved()[:6])
        suites = "; ".join(
            f"{s['suite']} {s['reference']:.0%} -> {s['live']:.0%}" for s in self.suites_moved[:6]
        )
        return (
            f"traffic shift on {self.n_live} logged requests (p {self.p_value:.2g} < {self.alpha:g}): "
            f"{names}" + (f"; suites {suites}" if suites else "")
        )

    def to_dict(self) -> dict:
        return {
            "n_live": self.n_live,
            "n_reference": self.n_reference,
            "shifted": self.shifted,
            "p_value": self.p_value,
            "alpha": self.alpha,
            "min_effect": self.min_effect,
            "policy_version": self.policy_version,
            "summary": self.summary_line(),
            "features": [asdict(f) for f in self.features],
            "suites_moved": self.suites_moved,
        }


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


def _counts(reference: dict[str, int], live: dict[str, int]) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(set(reference) | set(live))
    return np.array([reference.get(k, 0) for k in keys]), np.array([live.get(k, 0) for k in keys])


def _tally(values: Sequence[Any]) -> dict[str, int]:
    names, counts = np.unique(np.array([v or "" for v in values], dtype=object), return_counts=True)
    return {str(k): int(v) for k, v in zip(names, counts)}


def detect_shift(
    reference: dict,
    live: Logged,
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    route_min_effect: float = ROUTE_MIN_EFFECT,
    min_group: int = MIN_GROUP,
) -> ShiftReport:
    """Compare logged requests with a policy's reference sketch: suites, lengths and, at every
    target with at least `min_group` logged requests, the models chosen."""
    report = ShiftReport(len(live), int(reference.get("n", 0)), alpha=alpha, min_effect=min_effect)
    if not len(live) or not reference.get("features"):
        return report
    live_suites = _tally(live.suites)
    rows = [("suite", *_counts(reference.get("suites", {}), live_suites), min_effect)]
    spec = reference["features"].get("log_chars")
    if spec is not None:
        rows.append(
            (
                "log_chars",
                np.asarray(spec["counts"]),
                _binned(np.log1p(live.chars), np.asarray(spec["edges"])),
                min_effect,
            )
        )
    groups: dict[str, list[str]] = {}
    for x, model in zip(live.targets, live.routed):
        if model is not None:
            groups.setdefault(_target_key(x), []).append(model)
    for key, models in sorted(groups.items()):
        ref = reference.get("routes", {}).get(key)
        if ref is not None and len(models) >= min_group:
            rows.append((f"route@{key}", *_counts(ref, _tally(models)), route_min_effect))
    # The live histograms keep their shares, but count as many observations as the log has
    # distinct requests: repeats of one prompt would make a chi-square test see a shift in any
    # finite set of prompts, however it was drawn.
    scale = live.distinct() / len(live)
    p = [chi2_homogeneity(a, b * scale) for _, a, b, _ in rows]
    for (name, a, b, threshold), raw, adj in zip(rows, p, holm(p)):
        tv = total_variation(a, b)
        report.features.append(FeatureShift(name, raw, float(adj), tv, bool(adj < alpha and tv >= threshold)))
    report.suites_moved = _suite_shares(
        reference.get("suites", {}), {k: v * scale for k, v in live_suites.items()}, alpha
    )
    return report


def logged(frame: Any, default_target: float) -> Logged:
    """What the monitor reads of a traffic frame (`routeopt.evals.storage.traffic`): a record without a
    quality target was routed at the policy's own (`default_target`)."""
    targets = [
        default_target if q is None or (isinstance(q, float) and math.isnan(q)) else float(q)
        for q in frame["quality_target"].tolist()
    ]
    routed = frame["policy_model"].where(frame["policy_model"].notna(), frame["model"]).tolist()
    chars = frame["prompt_chars"].to_numpy(dtype=np.float64)
    keys = (
        [k if isinstance(k, str) and k else None for k in frame["prompt_hash"].tolist()]
        if "prompt_hash" in frame
        else None
    )
    return Logged(
        [s if isinstance(s, str) else None for s in frame["suite"].tolist()],
        np.nan_to_num(chars, nan=0.0),
        targets,
        [m if isinstance(m, str) else None for m in routed],
        keys,
    )


@dataclass
class TrafficCheck:
    """What the logged traffic says about a published policy: whether its requests still look
    like the certified ones (`shift`) and, with feedback, whether its target's promise holds on
    them (`promise`, `routeopt.router_training.live.promise.live_promise`)."""

    version: int | None
    target: float
    shift: ShiftReport | None
    promise: dict | None = None
    n_logged: int = 0
    note: str = ""

    @property
    def alert(self) -> bool:
        return bool((self.shift is not None and self.shift.shifted) or (self.promise or {}).get("broken"))

    def summary_line(self) -> str:
        who = f"policy version {self.version}" if self.version is not None else "the policy"
        parts = [self.shift.summary_line() if self.shift is not None else f"traffic shift: {self.note}"]
        if self.promise:
            m = self.promise["margin"]
            verdict = "BROKEN" if self.promise["broken"] else "held" if self.promise["held"] else "not shown"
            parts.append(
                f"promise at target {self.target:g} on {self.promise['n']} requests with feedback: "
                f"pass {self.promise['pass_rate']['value']:.3f} vs floor {self.promise['floor']:.3f} "
                f"(margin {m['value']:+.3f}, 95% CI {m['low']:+.3f}..{m['high']:+.3f}): {verdict}"
            )
        return f"{who}: " + "; ".join(parts)

    def to_dict(self) -> dict:
        return {
            "version": self.version,
            "target": self.target,
            "alert": self.alert,
            "n_logged": self.n_logged,
            "summary": self.summary_line(),
            "note": self.note,
            "shift": self.shift.to_dict() if self.shift is not None else None,
            "promise": self.promise,
        }


def check_traffic(
    frame: Any,
    policy: Any,
    version: int | None,
    *,
    alpha: float = ALPHA,
    min_effect: float = MIN_EFFECT,
    min_requests: int = 200,
    min_feedback: int = 200,
) -> TrafficCheck:
    """The shift monitor and the live promise for the policy that served `frame` (a traffic
    frame): the requests it served are compared with its reference sketch (its metrics'
    `shift_reference`); with at least `min_feedback` of them graded, its promise is estimated."""
    from routeopt.router_training.live.promise import live_promise

    mine = frame
    if version is not None and "policy_version" in frame:
        mine = frame[np.asarray(frame["policy_version"].to_numpy(dtype=float) == version)]
    target = float(policy.quality_target)
    reference = (getattr(policy, "metrics", None) or {}).get("shift_reference") or {}
    check = TrafficCheck(version, target, None, n_logged=len(mine))
    if not reference:
        check.note = "the policy carries no reference sketch (trained before the monitor existed)"
    elif len(mine) < min_requests:
        check.note = f"{len(mine)} logged requests, {min_requests} needed"
    else:
        check.shift = detect_shift(reference, logged(mine, target), alpha=alpha, min_effect=min_effect)
        check.shift.policy_version = version
    graded = int(np.isfinite(mine["passed"].to_numpy(dtype=float)).sum()) if "passed" in mine else 0
    if graded >= min_feedback:
        check.promise = live_promise(mine.reset_index(drop=True), version, policy)
    return check
