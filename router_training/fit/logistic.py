"""L2 logistic regressions on pass fractions, many at a time: the solver the linear estimator's
difficulty model and per-candidate heads are fitted with (sklearn's objective and meaning of C).
"""

from __future__ import annotations

import functools
from typing import Callable, Sequence

import numpy as np
import scipy.sparse as sp
from scipy.linalg import solve_triangular
from scipy.special import expit

from routeopt.router_training.policy import batch_features

_EPS = 1e-6
NYSTROM_RANK = 50  # the preconditioner's rank: see nystrom_preconditioner


def logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def soft_log_loss(z: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(1.0 / (1.0 + np.exp(-z)), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def newton_together(
    parts: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray, np.ndarray]],
    hess: Callable[[np.ndarray, np.ndarray], np.ndarray],
    theta: np.ndarray,
    rtol: float = 1e-7,
    max_newton: int = 100,
    max_cg: int = 250,
    preconditioner: Callable[[np.ndarray], Callable[[np.ndarray], np.ndarray] | None] | None = None,
) -> np.ndarray:
    """Truncated Newton (Newton-CG with a backtracking line search) on each column of `theta`
    (p, m), the columns' products made together: `parts(theta[:, cols], cols)` gives the listed
    objectives (k,), gradients (p, k) and curvature weights (n, k); `hess(V, D)` the
    Hessian-vector products (p, k) at those weights. `preconditioner(D)`, called once with the
    starting weights, gives the conjugate gradients' preconditioner (a map of (p, k) blocks).

    Each column is its own minimisation: it stops when its Newton step would lower its
    objective by at most `rtol` of it. On the ill-conditioned sparse logistic fits this
    reaches the optimum to about 1e-5 of the objective with fewer products than L-BFGS needs
    to come within 1e-3 of it.
    """
    theta = np.array(theta, dtype=np.float64)
    active = np.arange(theta.shape[1])
    f, g, D = parts(theta, active)
    M = preconditioner(D) if preconditioner is not None else None
    for _ in range(max_newton):
        if not len(active):
            break
        s = _conjugate_gradient(hess, g, D, max_cg, M)
        dec = -np.einsum("ij,ij->j", g, s)  # twice the step's predicted decrease
        step, todo = np.ones(len(active)), np.arange(len(active))
        for _ in range(30):
            trial = theta[:, active[todo]] + step[todo] * s[:, todo]
            tf, tg, tD = parts(trial, active[todo])
            ok = tf <= f[todo] - 1e-4 * step[todo] * dec[todo]
            took = todo[ok]
            theta[:, active[took]] = trial[:, ok]
            f[took], g[:, took], D[:, took] = tf[ok], tg[:, ok], tD[:, ok]
            todo = todo[~ok]
            if not len(todo):
                break
            step[todo] *= 0.5
        done = dec / 2 <= rtol * np.maximum(np.abs(f), 1.0)
        done[todo] = True  # no step lowers it: at the optimum up to rounding
        keep = ~done
        active, f, g, D = active[keep], f[keep], g[:, keep], D[:, keep]
    return theta


def _conjugate_gradient(
    hess: Callable[[np.ndarray, np.ndarray], np.ndarray],
    g: np.ndarray,
    D: np.ndarray,
    max_cg: int,
    M: Callable[[np.ndarray], np.ndarray] | None = None,
) -> np.ndarray:
    """Per column, an approximate solution of H s = -g, to the relative residual
    min(0.5, sqrt(|g|)) that keeps Newton's convergence superlinear; preconditioned by `M`
    (an approximation of H's inverse) where given."""
    x, r = np.zeros_like(g), -g
    rr = np.einsum("ij,ij->j", g, g)
    z = r.copy() if M is None else M(r)
    p, rz = z.copy(), np.einsum("ij,ij->j", r, z)
    tol = np.minimum(0.5, rr**0.25) * np.sqrt(rr)
    live = np.arange(g.shape[1])
    for _ in range(max_cg):
        live = live[np.sqrt(rr[live]) > tol[live]]
        if not len(live):
            break
        Hp = hess(p[:, live], D[:, live])
        a = rz[live] / np.einsum("ij,ij->j", p[:, live], Hp)
        x[:, live] += a * p[:, live]
        r[:, live] -= a * Hp
        rr[live] = np.einsum("ij,ij->j", r[:, live], r[:, live])
        z = r[:, live] if M is None else M(r[:, live])
        new = np.einsum("ij,ij->j", r[:, live], z)
        p[:, live] = z + (new / rz[live]) * p[:, live]
        rz[live] = new
    return x


def nystrom_preconditioner(
    curvature: Callable[[np.ndarray], np.ndarray], dim: int, shift: float, rank: int, seed: int = 0
) -> Callable[[np.ndarray], np.ndarray] | None:
    """The randomized Nystrom preconditioner of `curvature` + `shift` I (Frangella, Tropp and
    Udell, "Randomized Nystrom preconditioning", SIAM J. Matrix Anal. Appl. 2023):
    `curvature(B)` is a symmetric positive semi-definite (dim, dim) matrix times a block B.
    One block product of `rank` columns finds its top eigenpairs U, L; the preconditioner
    maps r to (L_last + shift) U (L + shift)^-1 U^T r + (I - U U^T) r, which flattens the
    spectrum's top `rank` eigenvalues onto its rest. The fits' Hessians (text designs: a few
    directions with 1e4 to 1e5 times the ridge's curvature) then take a fifth to a half of the
    conjugate-gradient steps. None where the sketch is degenerate (no preconditioning)."""
    omega = _test_matrix(dim, rank, seed)
    Y = curvature(omega)
    nu = np.sqrt(dim) * np.finfo(np.float64).eps * np.linalg.norm(Y)  # Frobenius: a bound of the 2-norm
    Y += nu * omega
    try:
        chol = np.linalg.cholesky(omega.T @ Y)
    except np.linalg.LinAlgError:
        return None
    B = solve_triangular(chol, Y.T, lower=True).T
    # B's left singular vectors and values from its small Gram matrix (B = U S V^T), keeping the
    # directions whose U it gives accurately
    s2, V = np.linalg.eigh(B.T @ B)
    keep = s2 > s2[-1] * 1e-10
    if not keep.any():
        return None
    s2, V = s2[keep][::-1], V[:, keep][:, ::-1]
    U = (B @ V) / np.sqrt(s2)
    lam = np.maximum(s2 - nu, 0.0)
    scale = (lam[-1] + shift) / (lam + shift) - 1.0

    def apply(R: np.ndarray) -> np.ndarray:
        return R + U @ (scale[:, None] * (U.T @ R))

    return apply


@functools.lru_cache(maxsize=4)
def _test_matrix(dim: int, rank: int, seed: int) -> np.ndarray:
    """Orthonormal Gaussian test columns (dim, rank), made once per shape: every fit of a
    training run sketches with the same ones."""
    omega, _ = np.linalg.qr(np.random.default_rng(seed).standard_normal((dim, rank)))
    omega.flags.writeable = False
    return omega


def row_view(A: sp.csr_matrix, lo: int, hi: int) -> sp.csr_matrix:
    """Rows [lo, hi) of A as a matrix sharing A's arrays (scipy's constructor copies arrays that
    are small views of larger ones, "prune": they are set on an empty matrix instead)."""
    s, e = A.indptr[lo], A.indptr[hi]
    view = sp.csr_matrix((int(hi - lo), A.shape[1]), dtype=A.dtype)
    view.data, view.indices, view.indptr = A.data[s:e], A.indices[s:e], A.indptr[lo : hi + 1] - s
    return view


class RowBlocks:
    """A matrix whose products run a block of rows per thread: scipy's sparse products release
    the GIL, so on two cores a product takes about half the time. Each output row is computed
    by one block exactly as the whole product computes it, so results are the same bit for bit
    whatever the number of threads. The blocks are views of the matrix's arrays, not copies."""

    def __init__(self, A: sp.spmatrix | np.ndarray, threads: int | None = None):
        self.A = A
        threads = batch_features.available_cores() if threads is None else threads
        if not sp.issparse(A) or A.nnz < batch_features.MIN_THREADED_SIZE or threads < 2:
            self.blocks: list[tuple[int, int, sp.csr_matrix]] = []
            return
        A = A.tocsr()
        parts = 4 * threads  # a busy core takes fewer blocks
        cuts = np.searchsorted(A.indptr, np.linspace(0, A.nnz, parts + 1)[1:-1])
        bounds = np.unique(np.concatenate(([0], cuts, [A.shape[0]])))
        self.blocks = [(int(lo), int(hi), row_view(A, lo, hi)) for lo, hi in zip(bounds[:-1], bounds[1:])]

    def __matmul__(self, B: np.ndarray) -> np.ndarray:
        if not self.blocks:
            return _times(self.A, B)
        out = np.empty((self.A.shape[0], B.shape[1]))

        def block(item: tuple[int, int, sp.csr_matrix]) -> None:
            lo, hi, view = item
            out[lo:hi] = _times(view, B)

        batch_features.parallel_map(block, self.blocks)
        return out


class StackedRows:
    """The row-stack [A_0; A_1; ...] of sparse parts with the same columns, given with each
    part's transpose: products with the stack and with its transpose made part by part, so
    the stack is never copied into a matrix of its own. A cross-fitting fold's design is the
    other folds' parts (`FoldRows`)."""

    def __init__(self, parts: Sequence[sp.csr_matrix], transposes: Sequence[sp.csr_matrix]):
        self.bounds = np.concatenate(([0], np.cumsum([p.shape[0] for p in parts]))).astype(int)
        self.shape = (int(self.bounds[-1]), parts[0].shape[1])
        self._rows = [RowBlocks(p) for p in parts]
        self._columns = [RowBlocks(t) for t in transposes]
        self.nnz = sum(p.nnz for p in parts)

    def __matmul__(self, B: np.ndarray) -> np.ndarray:
        out = np.empty((self.shape[0], B.shape[1]))
        for lo, hi, rows in zip(self.bounds[:-1], self.bounds[1:], self._rows):
            out[lo:hi] = rows @ B
        return out

    def transposed_times(self, U: np.ndarray) -> np.ndarray:
        """The stack's transpose times U (n, k): the parts' products added in their order."""
        out = self._columns[0] @ U[: self.bounds[1]]
        for lo, hi, columns in zip(self.bounds[1:-1], self.bounds[2:], self._columns[1:]):
            out += columns @ U[lo:hi]
        return out


class FoldRows:
    """A sparse design whose rows are grouped by cross-fitting fold (`bounds[k]` to
    `bounds[k + 1]` are fold k's), with each fold's transpose made once: the design without a
    fold is then the other folds' rows and transposes, and the folds' fits, run at the same
    time, share one copy of the design instead of each taking its own."""

    def __init__(self, X: sp.csr_matrix, bounds: np.ndarray):
        self.bounds, self.nnz = bounds, X.nnz
        self.parts = [row_view(X, lo, hi) for lo, hi in zip(bounds[:-1], bounds[1:])]
        self.transposes = batch_features.parallel_map(lambda part: part.T.tocsr(), self.parts)

    def fold(self, k: int) -> sp.csr_matrix:
        return self.parts[k]

    def without(self, k: int) -> StackedRows:
        keep = [j for j in range(len(self.parts)) if j != k]
        return StackedRows([self.parts[j] for j in keep], [self.transposes[j] for j in keep])

    def every(self) -> StackedRows:
        return StackedRows(self.parts, self.transposes)


def _times(A: sp.spmatrix | np.ndarray, B: np.ndarray) -> np.ndarray:
    """A @ B; for a sparse A and a few columns, one matrix-vector product per column, which is
    faster than scipy's sparse x dense block until about four columns."""
    if sp.issparse(A) and B.shape[1] < 4:
        return np.column_stack([A @ np.ascontiguousarray(B[:, j]) for j in range(B.shape[1])])
    return np.asarray(A @ B)


def fit_logistic(
    X: sp.spmatrix | np.ndarray | StackedRows,
    Y: np.ndarray,
    C: float,
    start: np.ndarray | None = None,
    offset: np.ndarray | None = None,
    XT: sp.csr_matrix | np.ndarray | None = None,
    rank: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """L2 logistic regressions on pass fractions in [0, 1] (sklearn's objective and meaning of
    C), one per column of `Y` (NaN: the row is not in that column's fit), on the design X and
    on top of a fixed per-row (or per-cell) `offset` logit.

    Each column is its own fit; they run together (`newton_together`) so that X is read
    once per round for all of them. Returns weights (d, m) and intercepts (m,). A column whose
    target has a single value or too few rows gets a constant model: nothing to learn.
    `start` is a previous (weights; intercepts) stacked (d + 1, m); `XT`, X's transpose where
    it is at hand (a `StackedRows` X brings its own). The conjugate gradients are
    preconditioned (`nystrom_preconditioner`, of `rank`, NYSTROM_RANK by default; 0: none) where
    the design has more than twice that many columns and more non-zeros than its columns times
    the rank: at the starting point, with the columns' mean curvature weights. On a sparser
    design the preconditioner's dense (columns x rank) products cost more per conjugate-gradient
    step than the Hessian products they save.
    """
    Y = np.asarray(Y, dtype=np.float64)
    Y = Y[:, None] if Y.ndim == 1 else Y
    d, m = X.shape[1], Y.shape[1]
    seen = ~np.isnan(Y)
    counts = seen.sum(0)
    y0 = np.where(seen, Y, 0.0)
    rate = (y0.sum(0) + 0.5) / (counts + 1.0)
    span = np.where(seen, Y, -np.inf).max(axis=0) - np.where(seen, Y, np.inf).min(axis=0)
    live = (counts >= 4) & (span > 1e-12)
    W, b = np.zeros((d, m)), logit(rate) if offset is None else np.zeros(m)
    if not live.any():
        return W, b
    cols = np.flatnonzero(live)
    whole = seen[:, cols].all()
    mask, y0 = (None if whole else seen[:, cols].astype(np.float64)), y0[:, cols]
    base = 0.0 if offset is None else offset[:, cols] if offset.ndim == 2 else offset[:, None]
    if isinstance(X, StackedRows):
        forward, backward = X.__matmul__, X.transposed_times
    else:
        if XT is None:
            XT = X.T.tocsr() if sp.issparse(X) else X.T
        forward, backward = RowBlocks(X).__matmul__, RowBlocks(XT).__matmul__

    def parts(theta: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        w = theta[:-1]
        z = forward(w) + theta[-1] + (base[:, at] if np.ndim(base) == 2 else base)
        loss = np.logaddexp(0.0, z) - y0[:, at] * z
        q = expit(z)
        g, D = q - y0[:, at], q * (1.0 - q)
        if mask is not None:
            loss, g, D = loss * mask[:, at], g * mask[:, at], D * mask[:, at]
        f = loss.sum(axis=0) + 0.5 * np.einsum("ij,ij->j", w, w) / C
        return f, np.vstack((backward(g) + w / C, g.sum(axis=0))), D

    def hess(V: np.ndarray, D: np.ndarray) -> np.ndarray:
        u = D * (forward(V[:-1]) + V[-1])
        return np.vstack((backward(u) + V[:-1] / C, u.sum(axis=0)))

    theta = np.vstack((np.zeros((d, len(cols))), b[cols]))
    if start is not None:
        theta = np.asarray(start, dtype=np.float64).reshape(d + 1, -1)[:, cols]
    rank = NYSTROM_RANK if rank is None else rank

    def preconditioner(D: np.ndarray) -> Callable[[np.ndarray], np.ndarray] | None:
        w = D.mean(axis=1)[:, None]

        def curvature(B: np.ndarray) -> np.ndarray:
            u = w * (forward(B[:-1]) + B[-1])
            return np.vstack((backward(u), u.sum(axis=0)))

        return nystrom_preconditioner(curvature, d + 1, 1.0 / C, rank)

    nnz = X.nnz if isinstance(X, StackedRows) or sp.issparse(X) else np.size(X)
    sketched = 0 < 2 * rank < d + 1 and nnz >= (d + 1) * rank  # a few of many columns, and worth it
    theta = newton_together(parts, hess, theta, preconditioner=preconditioner if sketched else None)
    W[:, cols], b[cols] = theta[:-1], theta[-1]
    return W, b
