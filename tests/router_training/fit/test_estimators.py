"""The linear estimator's fitting: many logistic fits solved together are each column's own fit."""

import numpy as np
import pytest
import scipy.sparse as sp

from routeopt.router_training.fit import estimators as E
from routeopt.router_training.fit import logistic as L
from routeopt.router_training.policy import batch_features


def _problem(n: int = 400, d: int = 60, k: int = 6, seed: int = 0):
    rng = np.random.default_rng(seed)
    X = sp.random(n, d, density=0.1, random_state=seed, format="csr")
    W = rng.normal(size=(d, k)) * 3
    Y = (rng.random((n, k)) < 1 / (1 + np.exp(-(X @ W)))).astype(float)
    Y[rng.random((n, k)) < 0.2] = np.nan  # no outcome: not in that column's fit
    return X, Y


@pytest.mark.parametrize("k", [2, 6])  # below and above where the product switches to a block
def test_columns_fitted_together_are_each_columns_own_fit(k: int) -> None:
    X, Y = _problem(k=k)
    offset = np.random.default_rng(1).normal(size=Y.shape)
    W, b = L.fit_logistic(X, Y, 0.7, offset=offset)
    for j in range(k):
        rows = ~np.isnan(Y[:, j])
        w1, b1 = L.fit_logistic(X[rows], Y[rows, j], 0.7, offset=offset[rows, j])
        assert np.allclose(W[:, j], w1[:, 0], atol=1e-4) and abs(b[j] - b1[0]) < 1e-4


@pytest.mark.parametrize("k", [1, 3, 6])
def test_products_split_over_threads_are_the_whole_products_bit_for_bit(monkeypatch, k: int) -> None:
    X, _ = _problem(n=997, d=300, k=1)
    B = np.random.default_rng(2).normal(size=(X.shape[1], k))
    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    blocked = L.RowBlocks(X, threads=3)
    assert len(blocked.blocks) > 1 and blocked.blocks[-1][1] == X.shape[0]
    assert np.array_equal(blocked @ B, L._times(X, B))
    XT, G = X.T.tocsr(), np.random.default_rng(3).normal(size=(X.shape[0], k))
    assert np.array_equal(L.RowBlocks(XT, threads=2) @ G, L._times(XT, G))


def test_the_blocks_are_views_of_the_matrix_not_copies(monkeypatch) -> None:
    X, _ = _problem(n=997, d=300, k=1)
    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    blocks = L.RowBlocks(X, threads=2).blocks
    assert len(blocks) > 1
    for _, _, block in blocks:
        assert np.shares_memory(block.data, X.data) and np.shares_memory(block.indices, X.indices)


def test_a_fit_with_its_products_split_over_threads_is_the_same_fit(monkeypatch) -> None:
    X, Y = _problem(k=4)
    W1, b1 = L.fit_logistic(X, Y, 0.7)
    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    monkeypatch.setattr(batch_features, "available_cores", lambda: 2)
    W2, b2 = L.fit_logistic(X, Y, 0.7)
    assert np.array_equal(W1, W2) and np.array_equal(b1, b2)


def test_a_column_with_nothing_to_learn_gets_a_constant_model() -> None:
    X, Y = _problem(k=3)
    Y[:, 1] = np.where(np.isnan(Y[:, 1]), np.nan, 1.0)  # always passes
    Y[:, 2] = np.nan
    Y[:3, 2] = 0.0  # three rows: too few
    W, b = L.fit_logistic(X, Y, 1.0)
    assert not W[:, 1].any() and not W[:, 2].any() and W[:, 0].any()
    assert b[1] > 3 and b[2] < 0  # the smoothed rates' logits


@pytest.mark.parametrize("rank", [0, 10])  # without and with the Nystrom preconditioner
@pytest.mark.parametrize("C", [0.1, 3.0])
def test_each_fit_reaches_the_optimum_of_its_objective(C: float, rank: int) -> None:
    """Against scipy's L-BFGS-B run to its tightest tolerances on the same objective."""
    from scipy.optimize import minimize

    X, Y = _problem(n=600, d=80, k=3, seed=4)
    offset = np.random.default_rng(5).normal(size=Y.shape)
    W, b = L.fit_logistic(X, Y, C, offset=offset, rank=rank)
    for j in range(Y.shape[1]):
        rows = ~np.isnan(Y[:, j])
        Xj, y, o = X[rows], Y[rows, j], offset[rows, j]

        def fg(t: np.ndarray) -> tuple[float, np.ndarray]:
            z = Xj @ t[:-1] + t[-1] + o
            g = 1 / (1 + np.exp(-z)) - y
            f = np.sum(np.logaddexp(0, z) - y * z) + t[:-1] @ t[:-1] / (2 * C)
            return f, np.append(Xj.T @ g + t[:-1] / C, g.sum())

        best = minimize(
            fg,
            np.zeros(X.shape[1] + 1),
            jac=True,
            method="L-BFGS-B",
            options={"maxiter": 20_000, "ftol": 1e-15, "gtol": 1e-10},
        )
        ours = fg(np.append(W[:, j], b[j]))[0]
        assert ours <= best.fun + 1e-6 * abs(best.fun)
        assert np.allclose(W[:, j], best.x[:-1], atol=1e-3) and abs(b[j] - best.x[-1]) < 1e-3


def test_separable_data_under_a_weak_ridge_ends_with_finite_weights() -> None:
    """Without the ridge the optimum is at infinity; with a weak one it is far out, and each
    fit still ends there, finite, separating the classes."""
    rng = np.random.default_rng(6)
    X = sp.csr_matrix(rng.normal(size=(80, 5)))
    y = (X @ np.array([1.0, -2.0, 0.5, 0.0, 1.0]) > 0).astype(float)
    W, b = L.fit_logistic(X, np.column_stack([y, 1 - y]), 1e4)
    z = X @ W + b
    assert np.isfinite(W).all() and np.isfinite(b).all()
    assert ((z[:, 0] > 0) == (y == 1)).all() and ((z[:, 1] > 0) == (y == 0)).all()


def test_the_difficulty_C_chosen_on_a_sample_still_cross_fits_every_request(monkeypatch) -> None:
    X, Y = _problem(n=600, k=4, seed=3)
    whole = E.LinearPassEstimator(seed=0).fit(X, Y)
    monkeypatch.setattr(E, "SELECTION_ROWS", 10_000)
    assert np.array_equal(E.LinearPassEstimator(seed=0).fit(X, Y).oof_difficulty_, whole.oof_difficulty_)
    monkeypatch.setattr(E, "SELECTION_ROWS", 150)
    rows, fit = [], L.fit_logistic
    monkeypatch.setattr(
        E, "fit_logistic", lambda X, Y, *a, **k: rows.append(X.shape[0]) or fit(X, Y, *a, **k)
    )
    sampled = E.LinearPassEstimator(seed=0).fit(X, Y)
    difficulty = rows[: 4 * 3 + 3 + 1]  # the grid on the sample, then its C's folds and the refit on all
    has_any = int((~np.isnan(Y).all(axis=1)).sum())
    assert max(difficulty[:12]) < 150 and min(difficulty[12:15]) > 300 and difficulty[15] == has_any
    assert sampled.C_ in sampled.C_grid and np.isfinite(sampled.oof_difficulty_).all()
    # every request's out-of-fold logit comes from a model fitted without its fold, on all rows
    has = ~np.isnan(Y).all(axis=1)
    ybar = np.nanmean(Y[has], axis=1)
    assert np.corrcoef(sampled.oof_difficulty_[has], ybar)[0, 1] > 0.3
    assert not np.allclose(sampled.oof_difficulty_, whole.oof_difficulty_) or sampled.C_ == whole.C_


def test_the_cost_model_fits_many_requests_of_one_suite_at_tiny_prices() -> None:
    """The suite column repeats the intercept; at a hundred thousand requests of a fraction of a
    cent the ridge is below the Gram matrix's precision and the system is singular."""
    n = 100_000
    chars = np.random.default_rng(0).integers(100, 3000, n)
    costs = (1e-9 * chars + 1e-8)[:, None] * np.array([1.0, 2.0])
    model = E.fit_cost_model(chars, np.zeros(n, dtype=int), costs, 1)
    predicted = model.predict(chars, np.zeros(n, dtype=int))
    assert np.allclose(predicted, costs, rtol=1e-6)


def _text_like(n: int, d: int, seed: int) -> tuple[sp.csr_matrix, np.ndarray]:
    """Unit rows of hashed-word-like counts, a few words in most rows: a spectrum whose top
    directions have thousands of times the ridge's curvature, as the router's text designs."""
    rng = np.random.default_rng(seed)
    common = rng.random((n, 8)) < 0.6
    rare = sp.random(n, d - 8, density=0.02, random_state=seed, format="csr")
    X = sp.hstack([sp.csr_matrix(common.astype(float)), rare], format="csr")
    X = sp.csr_matrix(X.multiply(1 / np.sqrt(np.asarray(X.multiply(X).sum(1)) + 1e-12)))
    w = rng.normal(size=(d, 3))
    Y = (rng.random((n, 3)) < 1 / (1 + np.exp(-(X @ w) * 3))).astype(float)
    return X, Y


def test_the_preconditioned_fit_is_the_same_optimum_in_fewer_hessian_products(monkeypatch) -> None:
    X, Y = _text_like(3000, 400, seed=8)
    products: list[int] = []  # Hessian products of each fit
    solve = L.newton_together

    def counting(parts, hess, theta, **kw):
        products.append(0)

        def counted(V, D):
            products[-1] += 1
            return hess(V, D)

        return solve(parts, counted, theta, **kw)

    monkeypatch.setattr(L, "newton_together", counting)
    plain = L.fit_logistic(X, Y, 3.0, rank=0)
    preconditioned = L.fit_logistic(X, Y, 3.0, rank=30)

    def objective(W: np.ndarray, b: np.ndarray) -> np.ndarray:
        z = X @ W + b
        return (np.logaddexp(0, z) - Y * z).sum(0) + 0.5 * (W * W).sum(0) / 3.0

    f0, f1 = objective(*plain), objective(*preconditioned)
    assert np.all(np.abs(f1 - f0) <= 1e-6 * np.abs(f0))
    assert np.allclose(X @ plain[0] + plain[1], X @ preconditioned[0] + preconditioned[1], atol=2e-3)
    assert products[1] < products[0] / 2, products


def test_the_nystrom_preconditioner_flattens_the_top_of_the_spectrum() -> None:
    rng = np.random.default_rng(9)
    Q, _ = np.linalg.qr(rng.normal(size=(200, 200)))
    eig = np.concatenate([np.geomspace(1e5, 1e2, 15), rng.uniform(0, 1, 185)])
    A = (Q * eig) @ Q.T
    shift = 0.5
    M = L.nystrom_preconditioner(lambda B: A @ B, 200, shift, rank=20)
    assert M is not None
    H = A + shift * np.eye(200)
    before = np.linalg.cond(H)
    PH = M(H)  # P^-1 H: its eigenvalues are those of the symmetric P^-1/2 H P^-1/2
    after = np.abs(np.linalg.eigvals(PH))
    assert before > 1e5 and after.max() / after.min() < 50
    assert L.nystrom_preconditioner(lambda B: 0 * B, 200, shift, rank=20) is None  # nothing to learn


def test_a_design_without_a_fold_is_that_folds_rows_left_out_sharing_their_memory(monkeypatch) -> None:
    X, _ = _problem(n=997, d=300, k=1)
    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    bounds = np.array([0, 331, 660, 997])
    design = L.FoldRows(X, bounds)
    B, U = np.random.default_rng(2).normal(size=(300, 5)), np.random.default_rng(3).normal(size=(668, 5))
    rest = sp.vstack([X[:331], X[660:]]).tocsr()
    assert np.array_equal(design.without(1) @ B, rest @ B)  # each row as the whole product makes it
    assert np.allclose(design.without(1).transposed_times(U), rest.T @ U, rtol=1e-12, atol=1e-12)
    assert design.without(1).shape == rest.shape and (design.fold(1) != X[331:660]).nnz == 0
    assert np.shares_memory(design.fold(2).data, X.data) and np.shares_memory(
        design.fold(0).indices, X.indices
    )
    whole = design.every()
    assert np.array_equal(whole @ B, X @ B) and whole.shape == X.shape


def test_a_fit_on_stacked_parts_is_the_fit_on_their_stack() -> None:
    X, Y = _problem(n=600, k=3, seed=4)
    design = L.FoldRows(X, np.array([0, 200, 410, 600]))
    W1, b1 = L.fit_logistic(design.without(0), Y[200:], 0.7)
    W2, b2 = L.fit_logistic(X[200:], Y[200:], 0.7)
    assert np.allclose(W1, W2, atol=1e-8) and np.allclose(b1, b2, atol=1e-8)


def test_folds_fitted_at_the_same_time_are_the_fits_made_one_by_one(monkeypatch) -> None:
    """The cross-fitting folds run concurrently where there are several cores; the estimator
    they make is the one a single core makes, bit for bit."""
    X, Y = _problem(n=900, d=200, k=5, seed=5)
    X = sp.hstack([sp.csr_matrix(np.eye(3)[np.arange(900) % 3]), X]).tocsr()  # 3 suites
    make = lambda: E.LinearPassEstimator(n_suites=3, n_clusters=2, n_buckets=200, candidate_text=1.0).fit(
        X, Y
    )
    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    monkeypatch.setattr(batch_features, "available_cores", lambda: 1)
    alone = make()
    monkeypatch.setattr(batch_features, "available_cores", lambda: 3)
    threads = []
    real = batch_features.concurrently
    monkeypatch.setattr(E, "concurrently", lambda fn, items, size: threads.append(1) or real(fn, items, size))
    together = make()
    assert len(threads) >= 2  # the difficulty's folds and the heads'
    for name in ("coef_", "intercept_", "difficulty_coef_", "slopes_", "oof_logits_", "oof_difficulty_"):
        assert np.array_equal(getattr(alone, name), getattr(together, name)), name
