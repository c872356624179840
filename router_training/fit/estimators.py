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
from scipy.special import expit
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted

from routeopt.router_training.fit.data import release_free_memory
from routeopt.router_training.fit.logistic import FoldRows, StackedRows, fit_logistic, logit, soft_log_loss
from routeopt.router_training.policy.batch_features import (
    batch_features,
    concurrently,
    parallel_map,
    text_counts,
)
from routeopt.router_training.policy.features import EMBEDDING_DIM, STAT_NAMES, FeatureSpec
from routeopt.router_training.policy.scorer import CostModel, assign_clusters

ROWS_PER_BLOCK = 2048  # requests whose features are built at once
SELECTION_ROWS = 20_000  # requests the difficulty model's C is chosen on, at most
_HEAD_SCALE = 10.0  # suite one-hots enter the head scaled up, so their prior is barely shrunk


def _blocks(n: int) -> list[tuple[int, int]]:
    return [(lo, min(lo + ROWS_PER_BLOCK, n)) for lo in range(0, n, ROWS_PER_BLOCK)]


def fit_feature_spec(
    prompts: Sequence[str], suites: Sequence[str | None], **spec_kwargs: object
) -> FeatureSpec:
    """Learn the data-dependent parts of the features (suite list, idf, stat scaling) from the
    text steps of the batch feature path a gateway's self-check and `design_matrix` run too."""
    names = tuple(sorted({s for s in suites if s}))
    spec = FeatureSpec(suites=names, **spec_kwargs)  # type: ignore[arg-type]
    stats, df = text_counts(prompts, spec, ROWS_PER_BLOCK)  # raw: the spec has no scaling yet
    if not len(prompts):
        stats = np.zeros((1, len(STAT_NAMES)))
    std = stats.std(axis=0)
    return dataclasses.replace(
        spec,
        idf=tuple(float(v) for v in np.log((1 + len(prompts)) / (1 + df)) + 1.0),
        stat_mean=tuple(float(v) for v in stats.mean(axis=0)),
        stat_std=tuple(float(v) if v > 1e-9 else 1.0 for v in std),
    )


def design_matrix(prompts: Sequence[str], suites: Sequence[str | None], spec: FeatureSpec) -> sp.csr_matrix:
    """The sparse feature rows of many requests, exactly as the gateway computes them (the batch
    feature path, with the sentence embeddings appended to each row when the spec has them),
    built a block of requests at a time (a block per core) so the path's wide arrays stay bounded."""
    if not len(prompts):
        return sp.csr_matrix((0, spec.n_features))

    def block(span: tuple[int, int]) -> sp.csr_matrix:
        lo, hi = span
        f = batch_features(prompts[lo:hi], suites[lo:hi], spec)
        offsets, ids, vals = f.row_offsets, f.ids.astype(np.int32), f.vals
        if spec.embeddings:
            from routeopt.router_training.policy.embeddings import embed

            emb = np.asarray(embed(list(prompts[lo:hi])))
            offsets, ids, vals = _with_embeddings(offsets, ids, vals, emb, spec)
        return sp.csr_matrix((vals, ids, offsets), shape=(hi - lo, spec.n_features))

    spans = _blocks(len(prompts))
    # the sentence encoder runs its own threads
    parts = [block(b) for b in spans] if spec.embeddings else parallel_map(block, spans)
    return parts[0] if len(parts) == 1 else sp.vstack(parts, format="csr")


def _with_embeddings(
    offsets: np.ndarray, ids: np.ndarray, vals: np.ndarray, emb: np.ndarray, spec: FeatureSpec
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sparse rows with each request's embedding block after its statistics (`request_features`'s layout)."""
    n, lens = len(offsets) - 1, np.diff(offsets)
    new = np.concatenate(([0], np.cumsum(lens + EMBEDDING_DIM)))
    out_ids, out_vals = np.empty(new[-1], dtype=ids.dtype), np.empty(new[-1])
    dest = np.repeat(new[:-1], lens) + (np.arange(len(ids)) - np.repeat(offsets[:-1], lens))
    out_ids[dest], out_vals[dest] = ids, vals
    block = (new[1:] - EMBEDDING_DIM)[:, None] + np.arange(EMBEDDING_DIM)
    start = len(spec.suites) + spec.n_buckets + len(STAT_NAMES)
    out_ids[block], out_vals[block] = start + np.arange(EMBEDDING_DIM), emb.reshape(n, EMBEDDING_DIM)
    return new, out_ids, out_vals


class LinearPassEstimator(BaseEstimator):
    """Item-response-style router: a shared difficulty model plus small per-candidate models.

    A request's outcomes on every candidate are evidence of how hard it is, so one text model
    learns difficulty from all K outcomes per request (K times the data of any single
    candidate). Each candidate then gets a logistic model over its own per-suite prior, the
    (cross-fitted, so it is not over-trusted) difficulty and difficulty x suite. The gateway
    scores it with one sparse dot product: text -> difficulty, then a per-suite slope.
    With C='auto' the difficulty model's ridge is the grid value with the best out-of-fold
    log-loss.

    With `n_clusters`, requests are also grouped by topic (k-means on a low-rank projection of
    the text, computed the same way by the gateway), and each candidate gets a prior and a
    difficulty slope per topic too: a fleet whose suite labels say little (one label for
    math, code and knowledge questions) still learns which candidate is good at what. With
    `candidate_text`, each candidate also gets its own text weights, fitted on top of its head's
    logit with a strong ridge, so they only move it where the text says so.
    """

    def __init__(
        self,
        C: float | str = "auto",
        n_suites: int = 0,
        n_folds: int = 3,
        seed: int = 0,
        C_grid: tuple[float, ...] = (0.1, 0.3, 1.0, 3.0),
        n_clusters: int = 0,
        cluster_rank: int = 8,
        n_buckets: int = 2**14,
        candidate_text: float = 0.0,
        deploy: str = "refit",
    ):
        self.C = C
        self.n_suites = n_suites
        self.n_folds = n_folds
        self.seed = seed
        self.C_grid = C_grid
        self.n_clusters = n_clusters
        self.cluster_rank = cluster_rank
        self.n_buckets = n_buckets
        self.candidate_text = candidate_text
        self.deploy = deploy

    def _folds(self, n: int) -> np.ndarray:
        return np.random.default_rng(self.seed).permutation(n) % self.n_folds

    def _difficulty(self, X: sp.csr_matrix, ybar: np.ndarray, folds: np.ndarray):
        """Out-of-fold difficulty logits, the chosen C and the deployed model (weights,
        intercept): the mean of the fold models, or a refit on all rows. X's rows are grouped
        by fold (`folds` never decreases).

        C is chosen on at most `SELECTION_ROWS` requests (a fixed sample past that): which C
        wins settles long before the data ends, while the fits it takes grow with it. The
        out-of-fold logits at that C are then fitted on every request, from the sample's models."""
        grid = self.C_grid if self.C == "auto" else (float(self.C),)
        if X.shape[0] < 2 * self.n_folds or self.n_folds < 2:
            W, b = fit_logistic(X, ybar, grid[0])
            return X @ W[:, 0] + b[0], grid[0], W[:, 0], float(b[0])
        starts = None
        if len(grid) > 1 and X.shape[0] > SELECTION_ROWS:
            rows = np.sort(np.random.default_rng(self.seed).permutation(X.shape[0])[:SELECTION_ROWS])
            sample = FoldRows(X[rows], self._bounds(folds[rows]))
            C, _, starts = self._cross_fit_difficulty(sample, ybar[rows], grid)
            grid = (C,)
            del sample
        design = FoldRows(X, self._bounds(folds))
        C, oof, starts = self._cross_fit_difficulty(design, ybar, grid, starts)
        mean = np.mean(starts, axis=0)
        if self.deploy == "average":
            return oof, C, mean[:-1], float(mean[-1])
        W, b = fit_logistic(design.every(), ybar, C, mean)
        return oof, C, W[:, 0], float(b[0])

    def _bounds(self, folds: np.ndarray) -> np.ndarray:
        """Where each fold's rows begin and end, in rows grouped by fold."""
        return np.searchsorted(folds, np.arange(self.n_folds + 1))

    def _cross_fit_difficulty(
        self, design: FoldRows, ybar: np.ndarray, grid: tuple, starts: list | None = None
    ) -> tuple[float, np.ndarray, list]:
        """The C of `grid` whose fold models give the best out-of-fold log-loss, those logits and
        models; each fold's fit starts from its fit at the previous C (or from `starts`). The
        folds are fitted at the same time, each on the others' rows."""
        grid, bounds = sorted(grid), design.bounds
        oof = np.zeros((len(grid), len(ybar)))
        models: list[list] = [[None] * self.n_folds for _ in grid]

        def fold(f: int) -> None:
            lo, hi = bounds[f], bounds[f + 1]
            rest, y = design.without(f), np.concatenate((ybar[:lo], ybar[hi:]))
            start = starts[f] if starts is not None else None
            for i, C in enumerate(grid):
                W, b = fit_logistic(rest, y, C, start)
                start = models[i][f] = np.append(W[:, 0], b)
                oof[i, lo:hi] = design.fold(f) @ W[:, 0] + b[0]

        concurrently(fold, range(self.n_folds), design.nnz)
        best = None
        for i in range(len(grid)):
            loss = soft_log_loss(oof[i], ybar)
            if best is None or loss < best[0] - 1e-9:
                best = (loss, i)
        i = best[1]
        return grid[i], oof[i], models[i]

    def _topics(self, X: sp.csr_matrix) -> None:
        """Fit the text projection (top singular vectors of a row sample) and k-means centroids."""
        from sklearn.cluster import KMeans
        from sklearn.utils.extmath import randomized_svd

        text = _columns(X, self.n_suites, self.n_buckets)
        k = min(self.n_clusters, X.shape[0] // 5)
        rank = min(self.cluster_rank, min(text.shape) - 1)
        if k < 2 or rank < 1:
            self.cluster_basis_, self.centroids_ = np.zeros((self.n_buckets, 0)), np.zeros((0, 0))
            return
        rng = np.random.default_rng(self.seed)
        sample = text[np.sort(rng.permutation(text.shape[0])[:4000])]
        _, _, vt = randomized_svd(sample, rank, n_iter=4, random_state=self.seed)
        self.cluster_basis_ = np.ascontiguousarray(vt.T)
        Z = _unit_rows(np.asarray(text @ self.cluster_basis_))
        self.centroids_ = KMeans(k, n_init=4, random_state=self.seed).fit(Z).cluster_centers_

    def topics(self, X: sp.spmatrix) -> np.ndarray:
        """Each request's topic (-1 without topics), as the gateway assigns it."""
        check_is_fitted(self, "coef_")
        X = sp.csr_matrix(X)
        return self._clusters(X) if len(self.centroids_) else np.full(X.shape[0], -1)

    def _clusters(self, X: sp.csr_matrix) -> np.ndarray:
        if not len(self.centroids_):
            return np.zeros(X.shape[0], dtype=int)
        basis = np.zeros((X.shape[1], self.cluster_basis_.shape[1]))  # zero off the text columns
        basis[self.n_suites : self.n_suites + self.n_buckets] = self.cluster_basis_
        Z = np.asarray(X @ basis)
        return assign_clusters(Z, self.centroids_)

    def _head(self, X: sp.csr_matrix, d: np.ndarray) -> np.ndarray:
        """Per-candidate dense inputs: [suite one-hot, topic one-hot, d, d x suite, d x topic]."""
        onehot = X[:, : self.n_suites].toarray()
        topic = np.zeros((X.shape[0], len(self.centroids_)))
        if len(self.centroids_):
            topic[np.arange(X.shape[0]), self._clusters(X)] = 1.0
        groups = np.hstack([onehot, topic])
        return np.hstack([groups * _HEAD_SCALE, d[:, None], groups * d[:, None]])

    def _fit_heads(self, H: np.ndarray, T: sp.csr_matrix | StackedRows | None, Y: np.ndarray) -> tuple:
        """Per candidate: a logistic head on H, then (with candidate text) its own text weights
        on top of the head's logit; returns (head weights, bias, text weights, text bias).
        The candidates are fitted together, each on the rows where it has an outcome."""
        weights, bias = fit_logistic(H, Y, 1.0)
        if T is None:
            return weights, bias, np.zeros((0, Y.shape[1])), np.zeros(Y.shape[1])
        tw, tb = fit_logistic(T, Y, 1.0, offset=H @ weights + bias)
        return weights, bias, tw, tb

    @staticmethod
    def _head_logits(H: np.ndarray, T: sp.csr_matrix | None, params: tuple) -> np.ndarray:
        weights, bias, tw, tb = params
        z = H @ weights + bias
        return z if T is None else z + np.asarray(T @ tw) + tb

    def fit(self, X: sp.spmatrix, Y: np.ndarray) -> "LinearPassEstimator":
        X = sp.csr_matrix(X)
        Y = np.asarray(Y, dtype=np.float64)
        n, s = Y.shape[0], self.n_suites
        seen = ~np.isnan(Y)
        has = seen.any(1)
        ybar = np.where(seen, Y, 0.0).sum(1) / np.maximum(seen.sum(1), 1)
        self.folds_ = self._folds(n)
        # the fits see the requests fold by fold, so that a fold's rows and the others' are
        # ranges of one design (`FoldRows`); what they return is put back in request order
        order = np.argsort(self.folds_, kind="stable")
        self.oof_difficulty_ = np.zeros(n)
        if self.n_clusters:
            self._topics(X)
        else:
            self.cluster_basis_, self.centroids_ = np.zeros((self.n_buckets, 0)), np.zeros((0, 0))
        Xd = self._with_topics(X[order])  # a topic's mean difficulty is barely shrunk, as a suite's
        w_d, b_d, self.C_ = np.zeros(Xd.shape[1]), 0.0, self.C if self.C != "auto" else self.C_grid[0]
        kept = order[has[order]]
        if len(kept) >= 4:
            Xh = Xd if len(kept) == n else Xd[has[order]]  # no copy when every request has an outcome
            self.oof_difficulty_[kept], self.C_, w_d, b_d = self._difficulty(
                Xh, ybar[kept], self.folds_[kept]
            )
            del Xh
        T = _columns(Xd, s, self.n_buckets) if self.candidate_text else None
        del Xd  # as large as X: not held while the heads are fitted
        release_free_memory()
        self.topic_difficulty_ = w_d[X.shape[1] :]
        w_d = w_d[: X.shape[1]]
        H = self._head(X, self.oof_difficulty_)
        if T is not None and self.candidate_text != 1.0:
            T = T * self.candidate_text
        z, hw, hb, tw, tb = self._cross_fit_heads(H[order], T, Y[order])
        self.oof_logits_ = np.empty_like(z)
        self.oof_logits_[order] = z
        g = len(self.centroids_)
        coef = np.zeros((X.shape[1], Y.shape[1]))
        coef[:s] = hw[:s] * _HEAD_SCALE
        if T is not None:
            coef[s : s + self.n_buckets] = tw * self.candidate_text
        self.coef_, self.intercept_ = coef, hb + tb
        self.difficulty_coef_, self.difficulty_intercept_ = w_d, b_d
        slope = hw[s + g]
        self.slopes_ = np.vstack([slope + hw[s + g + 1 : 2 * s + g + 1], slope[None]])
        self.cluster_bias_ = hw[s : s + g] * _HEAD_SCALE
        self.cluster_slopes_ = hw[2 * s + g + 1 :]
        self.n_features_in_ = X.shape[1]
        return self

    def _cross_fit_heads(self, H: np.ndarray, T: sp.csr_matrix | None, Y: np.ndarray) -> tuple:
        """Out-of-fold logits from heads fitted without each fold, and the deployed heads: the
        mean of the fold heads (deploy='average') or a refit on all rows. The rows are grouped
        by fold; the folds are fitted at the same time."""
        if len(Y) < 2 * self.n_folds or self.n_folds < 2:
            params = self._fit_heads(H, T, Y)
            return (self._head_logits(H, T, params), *params)
        bounds = self._bounds(np.sort(self.folds_))
        text = None if T is None else FoldRows(T, bounds)
        z = np.zeros(Y.shape)

        def fold(f: int) -> tuple:
            lo, hi = bounds[f], bounds[f + 1]
            rest = lambda A: np.concatenate((A[:lo], A[hi:]))
            params = self._fit_heads(rest(H), None if text is None else text.without(f), rest(Y))
            z[lo:hi] = self._head_logits(H[lo:hi], None if text is None else text.fold(f), params)
            return params

        folds = concurrently(fold, range(self.n_folds), H.size + (0 if T is None else T.nnz))
        if self.deploy == "average":
            return (z, *(np.mean([p[i] for p in folds], axis=0) for i in range(4)))
        return (z, *self._fit_heads(H, None if text is None else text.every(), Y))

    def out_of_fold_logits(self) -> np.ndarray:
        """Logits of each training request from heads fitted without its fold, on its
        out-of-fold difficulty: honest inputs for calibration and policy tables."""
        check_is_fitted(self, "coef_")
        return self.oof_logits_

    def _with_topics(self, X: sp.csr_matrix) -> sp.csr_matrix:
        """X with a one-hot column per topic appended (X itself without topics)."""
        g = len(self.centroids_)
        if not g:
            return X
        return _append_one_hot(X, self._clusters(X), g)

    def difficulty(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = sp.csr_matrix(X)
        d = np.asarray(X @ self.difficulty_coef_) + self.difficulty_intercept_
        return d + self.topic_difficulty_[self._clusters(X)] if len(self.centroids_) else d

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "coef_")
        X = sp.csr_matrix(X)
        slope = self.slopes_[_suite_of(X, self.n_suites)]
        z = np.asarray(X @ self.coef_) + self.intercept_
        if len(self.centroids_):
            g = self._clusters(X)
            z, slope = z + self.cluster_bias_[g], slope + self.cluster_slopes_[g]
        return z + self.difficulty(X)[:, None] * slope

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        return expit(self.decision_function(X))


def _columns(X: sp.csr_matrix, start: int, width: int, chunk: int = 1 << 20) -> sp.csr_matrix:
    """Columns [start, start + width) of X, numbered from 0; about `chunk` entries of rows at a
    time, a core each, where scipy's column slice of a large matrix takes several times as long."""
    if not X.shape[0]:
        return sp.csr_matrix((0, width))
    cuts = np.searchsorted(X.indptr, np.arange(chunk, X.nnz, chunk))
    bounds = np.unique(np.concatenate(([0], cuts, [X.shape[0]])))

    def rows(span: tuple[int, int]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = span
        a, b = X.indptr[lo], X.indptr[hi]
        cols = X.indices[a:b]
        keep = (cols >= start) & (cols < start + width)
        kept = np.concatenate(([0], np.cumsum(keep)))[X.indptr[lo : hi + 1] - a]
        return X.data[a:b][keep], cols[keep] - start, np.diff(kept)

    data, indices, counts = zip(*parallel_map(rows, list(zip(bounds[:-1], bounds[1:]))))
    indptr = np.concatenate(([0], np.cumsum(np.concatenate(counts))))
    return sp.csr_matrix((np.concatenate(data), np.concatenate(indices), indptr), shape=(X.shape[0], width))


def _append_one_hot(X: sp.csr_matrix, column: np.ndarray, width: int) -> sp.csr_matrix:
    """[X | one-hot of `column` over `width` columns]: each row's entry goes after its own."""
    n, ends = X.shape[0], X.indptr[1:]
    data = np.insert(X.data, ends, 1.0)
    indices = np.insert(X.indices, ends, X.shape[1] + np.asarray(column, dtype=X.indices.dtype))
    return sp.csr_matrix((data, indices, X.indptr + np.arange(n + 1)), shape=(n, X.shape[1] + width))


def _unit_rows(Z: np.ndarray) -> np.ndarray:
    norm = np.linalg.norm(Z, axis=1, keepdims=True)
    return Z / np.where(norm > 0, norm, 1.0)


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
        p = expit(a * z + b)
        g = np.array([((p - t) * z).sum() + ridge * (a - 1), (p - t).sum()])
        w = p * (1 - p)
        H = np.array([[(w * z * z).sum() + ridge, (w * z).sum()], [(w * z).sum(), w.sum() + 1e-9]])
        step = np.linalg.solve(H, g)
        a, b = a - step[0], b - step[1]
        if np.abs(step).max() < 1e-8:
            break
    return float(a), float(b)


def fit_cost_model(
    n_chars: np.ndarray,
    suite_pos: np.ndarray,
    costs: np.ndarray,
    n_suites: int,
    ridge: float = 1e-3,
    topic_pos: np.ndarray | None = None,
    n_topics: int = 0,
) -> CostModel:
    """Least squares per candidate: cost ~ intercept + slope * kchars + suite offset (+ topic
    offset). A candidate with no recorded cost gets zero (and a note in the metrics, by the caller).
    """
    n, k = costs.shape
    A = np.zeros((n, 2 + n_suites + n_topics))
    A[:, 0] = 1.0
    A[:, 1] = np.asarray(n_chars, dtype=np.float64) / 1000.0
    known = suite_pos >= 0
    A[np.flatnonzero(known), 2 + suite_pos[known]] = 1.0
    if n_topics and topic_pos is not None:
        has = topic_pos >= 0
        A[np.flatnonzero(has), 2 + n_suites + topic_pos[has]] = 1.0
    coef = np.zeros((A.shape[1], k))
    floor = np.zeros(k)
    for j in range(k):
        ok = ~np.isnan(costs[:, j])
        if not ok.any():
            continue
        Aj, cj = A[ok], costs[ok, j]
        reg = ridge * np.eye(A.shape[1]) * max(float(cj.mean()) ** 2, 1e-12)
        gram, rhs = Aj.T @ Aj + reg + 1e-12 * np.eye(A.shape[1]), Aj.T @ cj
        try:
            coef[:, j] = np.linalg.solve(gram, rhs)
        except np.linalg.LinAlgError:
            # collinear columns (every request in a named suite) whose ridge, scaled by the
            # prices, vanishes beside the request counts: the least-norm solution
            coef[:, j] = np.linalg.lstsq(gram, rhs, rcond=None)[0]
        floor[j] = max(float(cj.min()), 0.0)
    topic_coef = coef[2 + n_suites :] if n_topics and topic_pos is not None else None
    return CostModel(coef=coef[: 2 + n_suites], floor=floor, topic_coef=topic_coef)


class LightGBMPassEstimator(BaseEstimator):
    """One gradient-boosted tree model per candidate (the brief's LightGBM router), as an option.

    Each candidate's model sees only the requests it has an outcome for; pass fractions are the
    labels of LightGBM's cross-entropy objective (binary labels are a special case). A candidate
    whose labels are constant (or too few) gets a constant logit instead of a booster. Fitting also
    computes out-of-fold logits (boosters fitted without each fold) for honest Platt calibration.
    With a `dask.distributed` `client`, each booster is trained across the cluster's workers by
    LightGBM's Dask interface, the rows split evenly among them (`_fit_dask`).
    """

    def __init__(
        self,
        n_estimators: int = 150,
        num_leaves: int = 15,
        min_child_samples: int = 10,
        learning_rate: float = 0.05,
        n_folds: int = 3,
        num_threads: int = 1,
        seed: int = 0,
        client: object = None,
    ):
        self.client = client
        self.n_estimators = n_estimators
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.learning_rate = learning_rate
        self.n_folds = n_folds
        self.num_threads = num_threads
        self.seed = seed

    def _params(self) -> dict:
        return {
            "objective": "cross_entropy",
            "num_leaves": self.num_leaves,
            "min_child_samples": self.min_child_samples,
            "learning_rate": self.learning_rate,
            "feature_fraction": 0.8,
            "bagging_fraction": 0.8,
            "bagging_freq": 1,
            "lambda_l2": 1.0,
            "verbose": -1,
            "num_threads": self.num_threads,
            "seed": self.seed,
            "deterministic": True,
            "force_row_wise": True,
        }

    def _fit_one(self, X: sp.csr_matrix, y: np.ndarray):
        """A booster, or a constant logit (float) when there is nothing to learn."""
        import lightgbm as lgb

        if len(y) < 2 * self.min_child_samples or np.ptp(y) < 1e-12:
            return float(logit((y.sum() + 0.5) / (len(y) + 1.0)))
        if self.client is not None:
            return self._fit_dask(X, y)
        data = lgb.Dataset(X, label=y, params={"verbose": -1}, free_raw_data=True)
        return lgb.train(self._params(), data, num_boost_round=self.n_estimators)

    def _fit_dask(self, X: sp.csr_matrix, y: np.ndarray):
        """A booster trained on the client's workers (pass fractions are labels of the
        cross-entropy objective, so it is LightGBM's Dask regressor, not its classifier)."""
        import dask.array as da
        import lightgbm as lgb

        workers = max(len(self.client.scheduler_info().get("workers", {})), 1)  # type: ignore[attr-defined]
        step = -(-X.shape[0] // workers)
        parts = [X[lo : lo + step] for lo in range(0, X.shape[0], step)]
        dX = da.concatenate([da.from_array(p, chunks=p.shape, asarray=False) for p in parts])
        dy = da.from_array(y, chunks=tuple(p.shape[0] for p in parts))
        params = {k: v for k, v in self._params().items() if k not in ("num_threads", "deterministic")}
        model = lgb.DaskLGBMRegressor(client=self.client, n_estimators=self.n_estimators, **params)
        return model.fit(dX, dy).booster_

    @staticmethod
    def _raw(model, X: sp.csr_matrix) -> np.ndarray:
        if isinstance(model, float):
            return np.full(X.shape[0], model)
        return np.asarray(model.predict(X, raw_score=True), dtype=np.float64)

    def _fit_all(self, X: sp.csr_matrix, Y: np.ndarray) -> list:
        models = []
        for j in range(Y.shape[1]):
            rows = ~np.isnan(Y[:, j])
            models.append(self._fit_one(X[rows], Y[rows, j]))
        return models

    def fit(self, X: sp.spmatrix, Y: np.ndarray) -> "LightGBMPassEstimator":
        X = sp.csr_matrix(X, dtype=np.float64)
        Y = np.asarray(Y, dtype=np.float64)
        self.models_ = self._fit_all(X, Y)
        self.n_features_in_ = X.shape[1]
        self.folds_ = np.random.default_rng(self.seed).permutation(len(Y)) % max(self.n_folds, 1)
        if len(Y) < 2 * self.n_folds or self.n_folds < 2:
            self.oof_logits_ = self.decision_function(X)
            return self
        self.oof_logits_ = np.zeros(Y.shape)
        for f in range(self.n_folds):
            te = self.folds_ == f
            for j, model in enumerate(self._fit_all(X[~te], Y[~te])):
                self.oof_logits_[te, j] = self._raw(model, X[te])
        return self

    def out_of_fold_logits(self) -> np.ndarray:
        """Logits of each training request from boosters fitted without its fold."""
        check_is_fitted(self, "oof_logits_")
        return self.oof_logits_

    def decision_function(self, X: sp.spmatrix) -> np.ndarray:
        check_is_fitted(self, "models_")
        X = sp.csr_matrix(X, dtype=np.float64)
        return np.column_stack([self._raw(m, X) for m in self.models_])

    def predict_proba(self, X: sp.spmatrix) -> np.ndarray:
        return expit(self.decision_function(X))

    def model_strings(self) -> list[str | float]:
        """Each candidate's booster in LightGBM's text format, or its constant logit."""
        check_is_fitted(self, "models_")
        return [m if isinstance(m, float) else m.model_to_string() for m in self.models_]
