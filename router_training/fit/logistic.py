"""L2 logistic regressions on pass fractions, many at a time: the solver the linear estimator's
difficulty model and per-candidate heads are fitted with (sklearn's objective and meaning of C).
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

import numpy as np
import scipy.sparse as sp
from scipy.optimize import minimize
from scipy.special import expit

_EPS = 1e-6


def logit(p: np.ndarray | float) -> np.ndarray:
    p = np.clip(p, _EPS, 1 - _EPS)
    return np.log(p / (1 - p))


def soft_log_loss(z: np.ndarray, y: np.ndarray) -> float:
    p = np.clip(1.0 / (1.0 + np.exp(-z)), _EPS, 1 - _EPS)
    return float(-np.mean(y * np.log(p) + (1 - y) * np.log(1 - p)))


def minimize_together(
    fg: Callable[[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]], theta: np.ndarray
) -> np.ndarray:
    """scipy's L-BFGS-B on each column of `theta` (p, m), the columns' evaluations made together:
    `fg(theta[:, cols], cols)` returns the listed objectives' values (k,) and gradients (p, k).

    Each column's minimisation is scipy's own, run in a thread of its own; a thread that needs
    its objective evaluated waits until every unfinished column's thread needs one, and one
    call evaluates them all. What that gains is `fg`'s: a design matrix shared by the columns
    is read once per round instead of once per column.
    """
    m = theta.shape[1]
    out = np.array(theta, dtype=np.float64)
    turn = threading.Condition()
    pending: dict[int, np.ndarray] = {}
    answers: dict[int, tuple[float, np.ndarray]] = {}
    state = {"running": m, "error": None}

    def evaluate_pending() -> None:  # with `turn` held
        cols = np.array(sorted(pending))
        try:
            f, g = fg(np.column_stack([pending[j] for j in cols]), cols)
            answers.update((j, (float(f[i]), g[:, i].copy())) for i, j in enumerate(cols))
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            state["error"] = exc
        pending.clear()
        turn.notify_all()

    def objective(j: int, x: np.ndarray) -> tuple[float, np.ndarray]:
        with turn:
            pending[j] = x.copy()
            if len(pending) == state["running"]:
                evaluate_pending()
            while j not in answers and state["error"] is None:
                turn.wait()
            if state["error"] is not None:
                raise RuntimeError("a joint evaluation failed") from state["error"]
            return answers.pop(j)

    def column(j: int) -> None:
        try:
            res = minimize(
                lambda x: objective(j, x),
                out[:, j],
                jac=True,
                method="L-BFGS-B",
                options={"maxiter": 300, "ftol": 1e-7, "gtol": 1e-5},
            )
            out[:, j] = res.x
        except BaseException as exc:  # noqa: BLE001  (re-raised in the caller's thread)
            with turn:
                state["error"] = state["error"] or exc
        finally:
            with turn:
                state["running"] -= 1
                if pending and len(pending) == state["running"]:
                    evaluate_pending()

    if m == 1:
        column(0)
    else:
        threads = [threading.Thread(target=column, args=(j,), daemon=True) for j in range(m)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    if state["error"] is not None:
        raise state["error"]
    return out


class RowBlocks:
    """A matrix whose products run a block of rows per thread: scipy's sparse products release
    the GIL, so on two cores a product takes about half the time. Each output row is computed
    by one block exactly as the whole product computes it, so results are the same bit for bit
    whatever the number of threads. The blocks are views of the matrix's arrays, not copies."""

    MIN_NNZ = 1 << 20  # below this a product is too short to be worth a second thread

    def __init__(self, A: sp.spmatrix | np.ndarray, threads: int | None = None):
        self.A = A
        threads = available_cores() if threads is None else threads
        if not sp.issparse(A) or A.nnz < self.MIN_NNZ or threads < 2:
            self.blocks: list[tuple[int, int, sp.csr_matrix]] = []
            return
        A = A.tocsr()
        parts = 4 * threads  # a busy core takes fewer blocks
        cuts = np.searchsorted(A.indptr, np.linspace(0, A.nnz, parts + 1)[1:-1])
        bounds = np.unique(np.concatenate(([0], cuts, [A.shape[0]])))
        self.blocks = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            s, e = A.indptr[lo], A.indptr[hi]
            view = sp.csr_matrix(
                (A.data[s:e], A.indices[s:e], A.indptr[lo : hi + 1] - s), shape=(hi - lo, A.shape[1]), copy=False
            )
            self.blocks.append((int(lo), int(hi), view))

    def __matmul__(self, B: np.ndarray) -> np.ndarray:
        """A @ B; for a sparse A and a few columns, one matrix-vector product per column, which
        is faster than scipy's sparse x dense block until about four columns."""
        if not self.blocks:
            return _times(self.A, B)
        out = np.empty((self.A.shape[0], B.shape[1]))

        def block(item: tuple[int, int, sp.csr_matrix]) -> None:
            lo, hi, view = item
            out[lo:hi] = _times(view, B)

        list(_pool().map(block, self.blocks))
        return out


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=available_cores(), thread_name_prefix="routeopt-product")


def _times(A: sp.spmatrix | np.ndarray, B: np.ndarray) -> np.ndarray:
    if sp.issparse(A) and B.shape[1] < 4:
        return np.column_stack([A @ np.ascontiguousarray(B[:, j]) for j in range(B.shape[1])])
    return np.asarray(A @ B)


def fit_logistic(
    X: sp.spmatrix | np.ndarray,
    Y: np.ndarray,
    C: float,
    start: np.ndarray | None = None,
    offset: np.ndarray | None = None,
    XT: sp.csr_matrix | np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """L2 logistic regressions on pass fractions in [0, 1] (sklearn's objective and meaning of
    C), one per column of `Y` (NaN: the row is not in that column's fit), on the design X and
    on top of a fixed per-row (or per-cell) `offset` logit.

    Each column is its own fit; they run together (`minimize_together`) so that X is read
    once per round for all of them. Returns weights (d, m) and intercepts (m,). A column whose
    target has a single value or too few rows gets a constant model: nothing to learn.
    `start` is a previous (weights; intercepts) stacked (d + 1, m).
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
    if XT is None:
        XT = X.T.tocsr() if sp.issparse(X) else X.T
    XB, XTB = RowBlocks(X), RowBlocks(XT)

    def fg(theta: np.ndarray, at: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        w = theta[:-1]
        z = XB @ w + theta[-1] + (base[:, at] if np.ndim(base) == 2 else base)
        loss = np.logaddexp(0.0, z) - y0[:, at] * z
        g = expit(z) - y0[:, at]
        if mask is not None:
            loss, g = loss * mask[:, at], g * mask[:, at]
        f = loss.sum(axis=0) + 0.5 * np.einsum("ij,ij->j", w, w) / C
        return f, np.vstack((XTB @ g + w / C, g.sum(axis=0)))

    theta = np.vstack((np.zeros((d, len(cols))), b[cols]))
    if start is not None:
        theta = np.asarray(start, dtype=np.float64).reshape(d + 1, -1)[:, cols]
    theta = minimize_together(fg, theta)
    W[:, cols], b[cols] = theta[:-1], theta[-1]
    return W, b
