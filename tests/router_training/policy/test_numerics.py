"""The spec's arithmetic: exact where it must be, within an ulp of libm where it approximates."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.policy.numerics import (
    TF_TABLE,
    exp_nonpositive,
    ln1p_int,
    ordered_row_sum,
    ordered_sum,
    sigmoid,
)


def _left_to_right(rows: np.ndarray) -> np.ndarray:
    total = rows[0].copy()
    for r in rows[1:]:
        total = total + r
    return total


@pytest.mark.parametrize("cols", [1, 2, 3, 44])
def test_ordered_sums_add_strictly_left_to_right(cols: int) -> None:
    """numpy's own sums are pairwise; these must not be: magnitudes from 1e-8 to 1e8 make any
    other order give other bits."""
    rng = np.random.default_rng(cols)
    for _ in range(200):
        n = int(rng.integers(1, 400))
        m = rng.standard_normal((n, cols)) * 10.0 ** rng.integers(-8, 9, size=(n, 1))
        np.testing.assert_array_equal(ordered_row_sum(m), _left_to_right(m))
        assert ordered_sum(m[:, 0]) == _left_to_right(m[:, :1])[0]
    assert ordered_sum(np.zeros(0)) == 0.0 and ordered_row_sum(np.zeros((0, 3))).tolist() == [0, 0, 0]


def test_ln1p_is_within_an_ulp_of_libm_and_exact_at_zero() -> None:
    n = np.concatenate(
        (np.arange(0, 70000), 2 ** np.arange(0, 53), np.random.default_rng(0).integers(0, 2**52, 5000))
    )
    got = ln1p_int(n)
    want = np.array([math.log1p(int(v)) for v in n])
    assert got[0] == 0.0
    assert np.all(np.abs(got - want) <= np.spacing(want))
    np.testing.assert_array_equal(TF_TABLE, got[: len(TF_TABLE)])


@settings(max_examples=300, deadline=None)
@given(st.floats(-745.0, 0.0))
def test_exp_is_within_an_ulp_of_libm(x: float) -> None:
    got = float(exp_nonpositive(np.array([x]))[0])
    if x < -700.0:
        assert got == 0.0
    else:
        assert abs(got - math.exp(x)) <= math.ulp(math.exp(x))


def test_sigmoid_is_symmetric_bounded_and_close_to_the_textbook_formula() -> None:
    t = np.concatenate((np.linspace(-60, 60, 20001), [-800.0, 800.0, 0.0, -0.0]))
    p = sigmoid(t)
    assert np.all((p >= 0) & (p <= 1)) and p[-2] == 0.5 and p[-3] == 1.0 and p[-4] == 0.0
    ref = np.array([1 / (1 + math.exp(-v)) if v >= 0 else math.exp(v) / (1 + math.exp(v)) for v in t[:-4]])
    assert np.max(np.abs(p[:-4] - ref) / ref) < 1e-15
    assert np.all(np.diff(p[:-4]) >= 0)


def test_a_requests_few_values_take_the_scalar_path_and_give_the_arrays_bits() -> None:
    """sigmoid of one request's candidates (<= 64 values) runs on Python floats; every value,
    zeros, the floor's edge and non-finite inputs included, has the bits of the array path."""
    rng = np.random.default_rng(3)
    edges = [
        0.0,
        -0.0,
        700.0,
        -700.0,
        699.9999999,
        -700.0000001,
        745.0,
        -745.0,
        5e-324,
        -5e-324,
        1e308,
        -1e308,
    ]
    values = np.concatenate([rng.standard_normal(40000) * s for s in (0.01, 1.0, 8.0, 300.0)] + [edges])
    wide = sigmoid(np.tile(values, (2, 1)))[0]  # 2-d: the array path
    for i in range(0, len(values), 11):
        got = sigmoid(values[i : i + 11])
        np.testing.assert_array_equal(got.view(np.uint64), wide[i : i + 11].view(np.uint64))
    with np.errstate(invalid="ignore"):  # not finite: the array path (numpy warns on NaN's exponent)
        odd = sigmoid(np.array([np.nan, np.inf, -np.inf, 1.0]))
    assert np.isnan(odd[0]) and odd[1:].tolist() == [1.0, 0.0, sigmoid(np.array([[1.0]]))[0, 0]]
