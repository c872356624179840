"""Pass-probability estimators in scikit-learn style, plus cost and calibration fitting.

Every estimator takes the sparse design built by `design_matrix` (suite one-hot | hashed text |
stats) and a target matrix Y (n, K) of pass fractions in [0, 1] with NaN where a candidate has
no outcome for a request, and predicts per-candidate pass probabilities (n, K).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.linear_model import LogisticRegression
from sklearn.utils.validation import check_is_fitted

from router_training.features import (
    STAT_NAMES, FeatureSpec, document_frequency, request_features, text_stats,
)
from router_training.policy import CostModel

_EPS = 1e-6


def fit_feature_spec(
    prompts: Sequence[str], suites: Sequence[str | None], **spec_kwargs: object
) -> FeatureSpec:
    """Learn the data-dependent parts of the features (suite list, idf, stat scaling)."""
    names = tuple(sorted({s for s in suites if s}))
    spec = FeatureSpec(suites=names, **spec_kwargs)  # type: ignore[arg-type]
    stats = np.array([text_stats(p) for p in prompts]) if prompts else np.zeros((1, len(STAT_NAMES)))
    std = stats.std(axis=0)
    return dataclasses.replace(
        spec,
        idf=document_frequency(prompts, spec),
        stat_mean=tuple(float(v) for v in stats.mean(axis=0)),
        stat_std=tuple(float(v) if v > 1e-9 else 1.0 for v in std),
    )


def design_matrix(
    prompts: Sequence[str], suites: Sequence[str | None], spec: FeatureSpec
) -> sp.csr_matrix:
    """The sparse feature rows of many requests, exactly as the gateway computes them."""
    indptr, indices, data = [0], [], []
    for p, s in zip(prompts, suites):
        ids, vals = request_features(p, s, spec)
        indices.append(ids)
        data.append(vals)
        indptr.append(indptr[-1] + len(ids))
    if not indices:
        return sp.csr_matrix((0, spec.n_features))
    return sp.csr_matrix(
        (np.concatenate(data), np.concatenate(indices), np.array(indptr)),
        shape=(len(indptr) - 1, spec.n_features),
    )


def _logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def _soft_rows(X: sp.csr_matrix, y: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray]:
    """Pass fractions as weighted 0/1 rows, so logistic regression can fit averaged outcomes."""
    if np.all((y == 0) | (y == 1)):
        return X, y.astype(int), np.ones(len(y))
    Xs = sp.vstack([X, X]).tocsr()
    ys = np.concatenate([np.ones(len(y), int), np.zeros(len(y), int)])
    ws = np.concatenate([y, 1 - y])
    keep = ws > 0
    return Xs[keep], ys[keep], ws[keep]


def _fit_logistic(X: sp.csr_matrix, y: np.ndarray, C: float) -> tuple[np.ndarray, float]:
    """Weights and intercept; a constant model when the target has one class (or few rows)."""
    rate = (y.sum() + 0.5) / (len(y) + 1.0)
    if len(y) < 4 or np.all(y == y[0]) or min(y.sum(), (1 - y).sum()) < 1:
        return np.zeros(X.shape[1]), float(_logit(rate))
    Xs, ys, ws = _soft_rows(X, y)
    model = LogisticRegression(C=C, max_iter=300, tol=1e-4, solver="lbfgs")
    model.fit(Xs, ys, sample_weight=ws)
    return model.coef_[0].astype(np.float64), float(model.intercept_[0])


class LinearPassEstimator(BaseEstimator):
    """Per-candidate logistic regression sharing strength through a common difficulty model.

    A first model learns how hard a request is for the fleet on average (every candidate's
    outcomes are evidence); each candidate's model then gets that difficulty as a feature
    (cross-fitted, so it is not over-trusted). Both are linear, so they fold into one
    weight matrix that the gateway scores with a sparse dot product.
    """

    def __init__(self, C: float = 1.0, shared: bool = True, n_folds: int = 2, seed: int = 0):
        self.C = C
        self.shared = shared
        self.n_folds = n_folds
        self.seed = seed

    def _shared_logits(self, X: sp.csr_matrix, ybar: np.ndarray) -> tuple[np.ndarray, np.ndarray, float]:
        w, b = _fit_logistic(X, ybar, self.C)
        oof = X @ w + b
        n = X.shape[0]
        if n >= 2 * self.n_folds and self.n_folds > 1:
            folds = np.random.default_rng(self.seed).permutation(n) % self.n_folds
            for f in range(self.n_folds):
                te = folds == f
                wf, bf = _fit_logistic(X[~te], ybar[~te], self.C)
                oof[te] = X[te] @ wf + bf
        return oof, w, b

    def fit(self, X: sp.spmatrix, Y: np.ndarray) -> "LinearPassEstimator":
        X = sp.csr_matrix(X)
        Y = np.asarray(Y, dtype=np.float64)
        n, k = Y.shape
        coef = np.zeros((X.shape[1], k))
        intercept = np.zeros(k)
        seen = ~np.isnan(Y)
        if self.shared and seen.any():
            ybar = np.nanmean(np.where(seen.any(1, keepdims=True), Y, 0.5), axis=1)
            oof, w_s, b_s = self._shared_logits(X, ybar)
        for j in range(k):
            rows = seen[:, j]
            Xj = X[rows]
            if self.shared:
                Xj = sp.hstack([Xj, sp.csr_matrix(oof[rows][:, None])]).tocsr()
            w, b = _fit_logistic(Xj, Y[rows, j], self.C)
            if self.shared:
                w, a = w[:-1], w[-1]
                w, b = w + a * w_s, b + a * b_s
            coef[:, j], intercept[j] = w, b
        self.coef_, self.intercept_ = coef, intercept
        self.n_features_in_ = X.shape[1]
        return self

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "coef_")
        return np.asarray(sp.csr_matrix(X) @ self.coef_) + self.intercept_

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        return 1.0 / (1.0 + np.exp(-self.decision_function(X)))


def _column_means(Y: np.ndarray, prior: np.ndarray, strength: float) -> np.ndarray:
    seen = ~np.isnan(Y)
    total = np.where(seen, Y, 0.0).sum(0)
    return (total + strength * prior) / (seen.sum(0) + strength)


class PerSuitePassEstimator(BaseEstimator):
    """Baseline: each candidate's pass rate within the request's suite (shrunk to its overall rate)."""

    def __init__(self, n_suites: int = 0, strength: float = 2.0):
        self.n_suites = n_suites
        self.strength = strength

    def fit(self, X: sp.spmatrix, Y: np.ndarray) -> "PerSuitePassEstimator":
        X = sp.csr_matrix(X)
        Y = np.asarray(Y, dtype=np.float64)
        overall = _column_means(Y, np.full(Y.shape[1], 0.5), 1.0)
        suite = _suite_of(X, self.n_suites)
        table = np.tile(overall, (self.n_suites + 1, 1))
        for s in range(self.n_suites):
            if (suite == s).any():
                table[s] = _column_means(Y[suite == s], overall, self.strength)
        self.table_ = table
        return self

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "table_")
        return self.table_[_suite_of(sp.csr_matrix(X), self.n_suites)]


def _suite_of(X: sp.csr_matrix, n_suites: int) -> np.ndarray:
    """Suite index per row; n_suites (the 'unknown' row of a table) when none is set."""
    if n_suites == 0:
        return np.zeros(X.shape[0], dtype=int)
    head = X[:, :n_suites].toarray()
    return np.where(head.any(1), head.argmax(1), n_suites)


class KNNPassEstimator(BaseEstimator):
    """Baseline: the candidates' mean outcome over the k most similar training requests (cosine)."""

    def __init__(self, k: int = 25, n_suites: int = 0):
        self.k = k
        self.n_suites = n_suites

    def _text(self, X: sp.spmatrix) -> sp.csr_matrix:
        X = sp.csr_matrix(X)
        return X[:, self.n_suites: X.shape[1] - len(STAT_NAMES)]

    def fit(self, X: sp.spmatrix, Y: np.ndarray) -> "KNNPassEstimator":
        self.text_ = self._text(X)
        self.Y_ = np.asarray(Y, dtype=np.float64)
        self.prior_ = _column_means(self.Y_, np.full(self.Y_.shape[1], 0.5), 1.0)
        return self

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "Y_")
        sims = np.asarray((self._text(X) @ self.text_.T).todense())
        k = min(self.k, self.Y_.shape[0])
        out = np.empty((sims.shape[0], self.Y_.shape[1]))
        for i, row in enumerate(sims):
            nearest = np.argpartition(-row, k - 1)[:k]
            out[i] = _column_means(self.Y_[nearest], self.prior_, 1.0)
        return out


def fit_platt(z: np.ndarray, y: np.ndarray, iters: int = 50) -> tuple[float, float]:
    """Platt scaling p = sigmoid(a z + b) by Newton's method, with Platt's smoothed targets.

    The smoothed targets keep the fit finite when calibration data has one class; a tiny ridge
    keeps it stable with few rows.
    """
    ok = ~np.isnan(y)
    z, y = z[ok], y[ok]
    if len(y) == 0:
        return 1.0, 0.0
    n_pos, n_neg = y.sum(), (1 - y).sum()
    t = np.where(y >= 0.5, (n_pos + 1) / (n_pos + 2), 1 / (n_neg + 2)) if np.all((y == 0) | (y == 1)) else y
    a, b = 1.0, 0.0
    ridge = 1e-3
    for _ in range(iters):
        p = 1.0 / (1.0 + np.exp(-(a * z + b)))
        g = np.array([((p - t) * z).sum() + ridge * (a - 1), (p - t).sum()])
        w = p * (1 - p)
        H = np.array([[(w * z * z).sum() + ridge, (w * z).sum()], [(w * z).sum(), w.sum() + 1e-9]])
        step = np.linalg.solve(H, g)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-8:
            break
    return float(a), float(b)


def fit_cost_model(
    n_chars: np.ndarray, suite_pos: np.ndarray, costs: np.ndarray, n_suites: int, ridge: float = 1e-3
) -> CostModel:
    """Least squares per candidate: cost ~ intercept + slope * kchars + suite offset.

    A candidate with no recorded cost gets zero (and a note in the metrics, by the caller).
    """
    n, k = costs.shape
    A = np.zeros((n, 2 + n_suites))
    A[:, 0] = 1.0
    A[:, 1] = np.asarray(n_chars, dtype=np.float64) / 1000.0
    known = suite_pos >= 0
    A[np.flatnonzero(known), 2 + suite_pos[known]] = 1.0
    coef = np.zeros((2 + n_suites, k))
    floor = np.zeros(k)
    for j in range(k):
        ok = ~np.isnan(costs[:, j])
        if not ok.any():
            continue
        Aj, cj = A[ok], costs[ok, j]
        reg = ridge * np.eye(A.shape[1]) * max(float(cj.mean()) ** 2, 1e-12)
        coef[:, j] = np.linalg.solve(Aj.T @ Aj + reg + 1e-12 * np.eye(A.shape[1]), Aj.T @ cj)
        floor[j] = max(float(cj.min()), 0.0)
    return CostModel(coef=coef, floor=floor)
