"""The arithmetic docs/policy-format.md specifies, so every runtime computes the same bits.

IEEE-754 doubles round +, -, *, / and sqrt exactly, but libraries differ in the last bit of log,
exp and tanh and in the order they add a long sum (BLAS blocks, numpy's pairwise sums). A policy
decided in Python and in JavaScript must agree, so the policy uses only: the five exact
operations, in a stated order; `ln1p_int` and `sigmoid` below, built from those operations; and
sums taken strictly left to right. Section 1 of the spec ("Numbers") states the same algorithms
with the same constants; the conformance vectors check them.
"""

from __future__ import annotations

import math
from typing import cast

import numpy as np

SQRT2 = 1.4142135623730951
LN2_HI = 6.93147180369123816490e-01  # ln 2 split as fdlibm does: k * LN2_HI is exact for |k| < 2**20
LN2_LO = 1.90821492927058770002e-10
INV_LN2 = 1.4426950408889634
ATANH_COEFS = tuple(1.0 / (2 * k + 1) for k in range(12, 0, -1))  # 1/25, 1/23, ..., 1/3 (Horner order)
EXP_COEFS = tuple(1.0 / math.factorial(n) for n in range(13, -1, -1))  # 1/13!, ..., 1/1!, 1/0!
EXP_FLOOR = -700.0  # exp(x) for x below this is taken as 0: far below any probability that matters
TF_TABLE_SIZE = 1 << 16


def ln1p_int(n: np.ndarray) -> np.ndarray:
    """ln(1 + n) for integers 0 <= n < 2**53, elementwise, by the spec's algorithm.

    x = 1 + n = m * 2**e with m in [sqrt(2)/2, sqrt(2)); ln m = 2 atanh(s), s = (m - 1) / (m + 1),
    as an odd series in s (12 terms: |s| <= 0.1716, so the next term is below 1e-17 of the sum).
    """
    x = 1.0 + np.asarray(n, dtype=np.float64)  # exact: n < 2**53
    frac, exp = np.frexp(x)  # x = frac * 2**exp, frac in [0.5, 1): exact
    m, e = frac * 2.0, (exp - 1).astype(np.float64)
    big = m > SQRT2
    m = np.where(big, m * 0.5, m)
    e = np.where(big, e + 1.0, e)
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    r = np.full_like(z, ATANH_COEFS[0])
    for c in ATANH_COEFS[1:]:
        r = r * z + c
    r = r * z
    log_m = 2.0 * (s + s * r)
    return e * LN2_HI + (e * LN2_LO + log_m)


def exp_nonpositive(x: np.ndarray) -> np.ndarray:
    """e**x for x <= 0 by the spec's algorithm: x = k ln 2 + r with |r| <= ln(2)/2, a degree-13
    Taylor polynomial in r (Horner), scaled by 2**k; 0 below EXP_FLOOR (k >= -1010: no subnormals).
    The Horner steps run in place: the same operations, without an array allocated per step."""
    x = np.asarray(x, dtype=np.float64)
    low = x < EXP_FLOOR
    any_low = bool(low.any())
    if any_low:
        x = np.where(low, 0.0, x)
    k = np.floor(x * INV_LN2 + 0.5)
    r = (x - k * LN2_HI) - k * LN2_LO
    p = np.full_like(r, EXP_COEFS[0])
    for c in EXP_COEFS[1:]:
        p *= r
        p += c
    out = np.ldexp(p, k.astype(np.int64), out=p)
    return np.where(low, 0.0, out) if any_low else out


_SCALAR_MAX = 64  # one request's candidates: below this, numpy's per-call cost exceeds the work


def sigmoid(t: np.ndarray) -> np.ndarray:
    """1 / (1 + e**-t) for t >= 0 and e**t / (1 + e**t) below, with e from `exp_nonpositive`."""
    t = np.asarray(t, dtype=np.float64)
    if t.ndim == 1 and len(t) <= _SCALAR_MAX:
        return np.array(sigmoid_list(t.tolist()))
    e = exp_nonpositive(-np.abs(t))
    d = 1.0 + e
    return np.where(t >= 0, 1.0 / d, e / d)


def sigmoid_list(t: list[float]) -> list[float]:
    """`sigmoid` of a few doubles as Python floats (`sigmoid_one` each while they are finite)."""
    if all(map(math.isfinite, t)):
        return [sigmoid_one(v) for v in t]
    e = exp_nonpositive(-np.abs(np.array(t, dtype=np.float64)))
    d = 1.0 + e
    return cast(list[float], np.where(np.array(t) >= 0, 1.0 / d, e / d).tolist())


def sigmoid_one(t: float) -> float:
    """`sigmoid` of one finite double with Python's floats: the same IEEE operations in the same
    order as the array code (neither fuses a multiply and an add), so the same bits; a decision's
    eleven values take about half the time of thirty array operations on them."""
    x = -abs(t)
    if x < EXP_FLOOR:
        e = 0.0
    else:
        k = float(math.floor(x * INV_LN2 + 0.5))
        r = (x - k * LN2_HI) - k * LN2_LO
        p = EXP_COEFS[0]
        for c in EXP_COEFS[1:]:
            p = p * r + c
        e = math.ldexp(p, int(k))
    d = 1.0 + e
    return 1.0 / d if t >= 0 else e / d


def ordered_sum(v: np.ndarray) -> float:
    """v[0] + v[1] + ... strictly left to right (numpy's own 1-d sum is pairwise); 0.0 if empty."""
    return float(np.asarray(v).cumsum()[-1]) if len(v) else 0.0


def ordered_row_sum(m: np.ndarray) -> np.ndarray:
    """Per column, the rows of m added in order, first row taken as is (0 rows: zeros).

    numpy reduces axis 0 of a C-contiguous 2-d array row by row (a test pins this down); a
    single column is a 1-d sum, which numpy would add pairwise, so that case goes through cumsum.
    """
    m = np.ascontiguousarray(m, dtype=np.float64)
    if m.shape[0] == 0:
        return np.zeros(m.shape[1:])
    if m.ndim == 2 and m.shape[1] >= 2:
        return cast(np.ndarray, np.add.reduce(m, axis=0))
    return cast(np.ndarray, np.cumsum(m, axis=0)[-1])


TF_TABLE = ln1p_int(np.arange(TF_TABLE_SIZE))
