"""Covariate-shift weights: how much each calibration request counts toward the traffic served.

The knob's certificate is an average over the calibration requests; when production traffic is
not like them, the average that matters is over the traffic. Given unlabelled traffic (decision
logs with text, an imported sample, or a sketch the logs carry without text), each calibration
request i gets the density ratio w_i = q(x_i) / p(x_i) of its features under the traffic (q) and
the calibration data (p), estimated by a classifier that tells the two apart (Bickel et al.
2009): w = P(traffic | x) / P(calibration | x) with balanced classes. The weighted calibration
mean is then an estimate of the traffic mean, resting on the Kish effective sample size
(sum w)^2 / sum w^2 of the calibration requests, which the certificate uses for its width.

Features must mean the same on both sides. The suite and the prompt's length always do; where
text is there, so do the policy's deterministic text features: its standardised length and
structure statistics and the low-rank text projection its topics are read from (fitted without
outcomes). The policy's predicted pass probabilities do not: on its calibration requests they
are out-of-fold (one fold model each), on new requests the average of the fold models, and that
alone tells the two apart (total variation up to 0.4 on the shared sets' unshifted test splits).
They come from `sketch_features`; the weights are clipped at `max_weight` (times the mean),
which says how far from its calibration data a certificate may reach.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from routeopt.router_training.fit.estimators import design_matrix
from routeopt.router_training.policy.features import STAT_NAMES

MAX_WEIGHT = 20.0


@dataclass
class Sketch:
    """Requests without outcomes, as the certificate and the monitor see them: suite, prompt
    characters and (where text was there) text features `X` (n, d) that mean the same for
    calibration and traffic (`text_features`)."""

    suites: list[str | None]
    chars: np.ndarray
    X: np.ndarray | None = None

    def __post_init__(self) -> None:
        self.chars = np.asarray(self.chars, dtype=np.float64)
        if len(self.suites) != len(self.chars):
            raise ValueError(f"a sketch has {len(self.suites)} suites but {len(self.chars)} lengths")
        if self.X is not None:
            self.X = np.asarray(self.X, dtype=np.float64)
            if self.X.shape[0] != len(self.chars):
                raise ValueError(
                    f"a sketch has {len(self.chars)} requests but {self.X.shape[0]} feature rows"
                )

    def __len__(self) -> int:
        return len(self.chars)


def text_features(policy: Any, prompts: Sequence[str], suites: Sequence[str | None]) -> np.ndarray:
    """The policy's outcome-free text features of each prompt: its standardised length and
    structure statistics and, for a linear scorer with topics, the unit-length text projection
    its topics are read from. The same function of the text for calibration requests and new
    ones (unlike predicted pass probabilities)."""
    spec = policy.spec
    start = len(spec.suites) + spec.n_buckets
    weights = getattr(policy.scorer, "weights", None)
    k = len(policy.candidates)
    rank = (
        weights.shape[1] - k - 1
        if weights is not None and getattr(policy.scorer, "centroids", None) is not None
        else 0
    )
    out = np.zeros((len(prompts), len(STAT_NAMES) + rank))
    rows = design_matrix(prompts, suites, spec)
    for i in range(len(prompts)):
        a, b = rows.indptr[i], rows.indptr[i + 1]
        ids, vals = rows.indices[a:b], rows.data[a:b]
        stat = (ids >= start) & (ids < start + len(STAT_NAMES))
        out[i, ids[stat] - start] = vals[stat]
        if rank:
            z = vals @ np.take(weights[:, k + 1 :], ids, axis=0)
            norm = math.sqrt(float(z @ z))
            out[i, len(STAT_NAMES) :] = z / norm if norm > 0 else z
    return out


def sketch_features(sketch: Sketch, suites: Sequence[str], use_x: bool = True) -> np.ndarray:
    """[suite one-hot (the given names, then 'other'), log characters, text features]."""
    pos = {s: i for i, s in enumerate(suites)}
    onehot = np.zeros((len(sketch), len(suites) + 1))
    onehot[np.arange(len(sketch)), [pos.get(s or "", len(suites)) for s in sketch.suites]] = 1.0
    parts = [onehot, np.log1p(sketch.chars)[:, None]]
    if use_x and sketch.X is not None:
        parts.append(sketch.X)
    return np.hstack(parts)


@dataclass
class Weights:
    """Density-ratio weights of the calibration requests (mean 1) and what they rest on."""

    w: np.ndarray
    ess: float
    n_traffic: int
    clipped: int
    auc: float  # how well the features tell traffic from calibration (0.5: not at all)
    features: list[str] = field(default_factory=list)

    def summary(self) -> dict:
        return {
            "n_calibration": len(self.w),
            "n_traffic": self.n_traffic,
            "effective_sample_size": self.ess,
            "max_weight": float(self.w.max()) if len(self.w) else math.nan,
            "clipped": self.clipped,
            "separability_auc": self.auc,
            "features": self.features,
        }


def effective_sample_size(w: np.ndarray) -> float:
    """Kish's (sum w)^2 / sum w^2 (n for equal weights; 0 for none)."""
    w = np.asarray(w, dtype=np.float64)
    s2 = float((w * w).sum())
    return float(w.sum() ** 2 / s2) if s2 > 0 else 0.0


def capped(w: np.ndarray, max_weight: float) -> tuple[np.ndarray, int]:
    """min(c w, max_weight) with c such that the mean is 1 (bisection), and how many were cut."""
    if max_weight < 1:
        raise ValueError(f"max_weight must be >= 1 (the mean weight), got {max_weight}")
    w = np.asarray(w, dtype=np.float64)
    if w.max() <= max_weight:
        return w / w.mean(), 0
    lo, hi = 0.0, max_weight / w.min() if w.min() > 0 else max_weight / 1e-300
    for _ in range(200):
        c = (lo + hi) / 2
        lo, hi = (c, hi) if np.minimum(c * w, max_weight).mean() < 1 else (lo, c)
    out = np.minimum(hi * w, max_weight)
    return out / out.mean(), int((hi * w > max_weight).sum())


def _auc(score: np.ndarray, label: np.ndarray) -> float:
    """Mann-Whitney AUC of `score` for label 1 against label 0 (ties count half)."""
    from scipy.stats import rankdata

    n1, n0 = int(label.sum()), int((1 - label).sum())
    if n1 == 0 or n0 == 0:
        return 0.5
    r = rankdata(score)
    return float((r[label == 1].sum() - n1 * (n1 + 1) / 2) / (n1 * n0))


def density_ratio(
    calibration: Sketch,
    traffic: Sketch,
    suites: Sequence[str],
    *,
    max_weight: float = MAX_WEIGHT,
    C: float = 1.0,
) -> Weights:
    """w_i = q(x_i) / p(x_i) for every calibration request, from a logistic classifier of
    traffic against calibration on their sketch features (balanced classes, standardised),
    clipped at `max_weight` times the mean and scaled to mean 1."""
    from sklearn.linear_model import LogisticRegression
    from sklearn.preprocessing import StandardScaler

    if len(traffic) == 0:
        raise ValueError("the traffic sample is empty: nothing to weight the calibration requests toward")
    use_x = calibration.X is not None and traffic.X is not None
    Xc, Xt = sketch_features(calibration, suites, use_x), sketch_features(traffic, suites, use_x)
    X = np.vstack([Xc, Xt])
    label = np.r_[np.zeros(len(Xc)), np.ones(len(Xt))]
    scaler = StandardScaler().fit(X)
    clf = LogisticRegression(C=C, class_weight="balanced", max_iter=2000).fit(scaler.transform(X), label)
    z = clf.decision_function(scaler.transform(Xc))
    w = np.exp(np.clip(z, -30, 30))
    w, clipped = capped(w / w.mean(), max_weight)
    auc = _auc(clf.decision_function(scaler.transform(X)), label)
    names = [f"suite={s}" for s in suites] + ["suite=other", "log_chars"]
    if use_x:
        names += [f"text[{j}]" for j in range(calibration.X.shape[1])]
    return Weights(w, effective_sample_size(w), len(traffic), clipped, auc, names)
