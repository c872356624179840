import math

import numpy as np
from hypothesis import example, given, settings
from hypothesis import strategies as st

from routeopt.router_training.evaluation import metrics as M

points = st.lists(st.tuples(st.floats(0.01, 10), st.floats(0, 1)), min_size=1, max_size=30)


@given(points)
@example([(0.010000000000000002, 1.0), (0.01, 0.5)])  # the better point, dearer by rounding only
def test_frontier_is_non_decreasing_and_concave(pts):
    c, q = M.frontier(*np.array(pts).T)
    assert np.all(np.diff(c) > 0) and np.all(np.diff(q) > 0)
    slopes = np.diff(q) / np.diff(c)
    assert np.all(np.diff(slopes) <= 1e-9)
    # every input point lies on or under the hull
    for x, y in pts:
        assert M.quality_at_cost(c, q, x) >= y - 1e-9


@given(points, st.floats(0, 1))
def test_cost_at_quality_inverts_quality_at_cost(pts, target):
    c, q = M.frontier(*np.array(pts).T)
    cost = M.cost_at_quality(c, q, target)
    if math.isinf(cost):
        assert target > q.max()
    else:
        assert M.quality_at_cost(c, q, cost) >= target - 1e-9


@given(points)
def test_aiq_bounded_by_best_quality(pts):
    c, q = M.frontier(*np.array(pts).T)
    v = M.aiq(c, q, 0.01, 10)
    assert 0 <= v <= q.max() + 1e-12


def test_savings_examples():
    c, q = M.frontier(np.array([1.0, 10.0]), np.array([0.5, 0.9]))
    assert M.savings(c, q, 0.9, 10.0) == 0
    assert np.isclose(M.savings(c, q, 0.7, 10.0), 1 - 5.5 / 10)
    assert math.isnan(M.savings(c, q, 0.95, 10.0))
    assert np.isclose(M.aiq(c, q, 1, 10), 0.7)


@settings(max_examples=50)
@given(st.integers(1, 30), st.integers(2, 6), st.integers(0, 10**6))
def test_oracle_beats_every_fixed_choice(n, k, seed):
    rng = np.random.default_rng(seed)
    Y, C = (rng.random((n, k)) < 0.5).astype(float), rng.random((n, k))
    pick = M.oracle_choice(Y, C)
    rows = np.arange(n)
    oq, oc = Y[rows, pick].mean(), C[rows, pick].mean()
    other = rng.integers(0, k, n)
    assert oq >= Y[rows, other].mean() - 1e-12
    assert oq > Y[rows, other].mean() or oc <= C[rows, other].mean() + 1e-12


def test_empty_inputs_are_guarded():
    c, q = M.frontier(np.array([]), np.array([]))
    assert M.aiq(c, q, 0, 1) == 0 and math.isinf(M.cost_at_quality(c, q, 0.5))


def test_cost_at_quality_between_qualities_a_subnormal_apart():
    """np.interp's slope (cost per quality) overflows to inf here; the fraction does not."""
    c, q = M.frontier(np.array([1.0, 2.0]), np.array([0.0, 2.225073858507203e-309]))
    assert abs(M.cost_at_quality(c, q, 5e-324) - 1.0) < 1e-12
    assert M.cost_at_quality(c, q, 2.225073858507203e-309) == 2.0
    assert math.isinf(M.cost_at_quality(c, q, 0.5))
