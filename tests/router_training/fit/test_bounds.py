"""The certificate's three assumptions: exchangeable, toward a traffic sample, robust to a mix."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.router_training.fit.bounds import (
    Assumption,
    certified_targets,
    difficulty_cells,
    robust_certified_targets,
    worst_case_mix,
)


def _pair(n: int, seed: int, rate: float = 0.8, lost: float = 0.1) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    ref = (rng.random(n) < rate).astype(float)
    return np.where(rng.random(n) < lost, 0.0, ref), ref


def test_equal_weights_are_the_plain_certificate_and_duplicates_are_weights():
    a, r = _pair(3000, 0)
    plain = certified_targets(a[None], r, 0.95)[0]
    assert certified_targets(a[None], r, 0.95, np.full(3000, 7.0))[0] == plain
    assert 0.85 < plain < a.mean() / r.mean()
    twice = np.r_[np.arange(3000), np.arange(1500)]
    w = np.r_[np.full(1500, 2.0), np.ones(1500)]
    assert certified_targets(a[None], r, 0.95, w)[0] == pytest.approx(
        certified_targets(a[twice][None], r[twice], 0.95)[0], abs=0.003
    )


def test_weights_move_the_certificate_to_the_traffic_and_cost_their_effective_sample_size():
    """Half the requests are 'hard' (the point loses 40% of the reference's passes there, none
    elsewhere): weighted toward the hard half, the certified target falls to what holds there."""
    n = 4000
    rng = np.random.default_rng(1)
    hard = np.arange(n) < n // 2
    r = (rng.random(n) < 0.8).astype(float)
    a = np.where(hard & (rng.random(n) < 0.4), 0.0, r)
    even = certified_targets(a[None], r, 0.95)[0]
    toward_hard = certified_targets(a[None], r, 0.95, np.where(hard, 9.0, 1.0))[0]
    only_hard = certified_targets(a[hard][None], r[hard], 0.95)[0]
    w = np.where(hard, 9.0, 1.0)
    assert toward_hard < even - 0.1
    assert only_hard - 0.01 < toward_hard < (w * a).sum() / (w * r).sum()  # 90% hard traffic


@settings(max_examples=60, deadline=None)
@given(st.integers(2, 8), st.floats(1.0, 5.0), st.integers(0, 10**6))
def test_the_worst_mix_is_feasible_and_no_feasible_mix_is_worse(g, gamma, seed):
    rng = np.random.default_rng(seed)
    p = rng.dirichlet(np.ones(g))
    m = rng.normal(size=g)
    pi = worst_case_mix(m, p, gamma)
    assert pi.sum() == pytest.approx(1.0)
    assert np.all(pi >= p / gamma - 1e-12) and np.all(pi <= np.minimum(1, gamma * p) + 1e-12)
    for _ in range(30):  # random feasible mixes never do worse
        other = np.clip(p * np.exp(rng.uniform(-np.log(gamma), np.log(gamma), g)), p / gamma, gamma * p)
        if (
            abs(other.sum() - 1) < 0.05
            and np.all(other / other.sum() <= np.minimum(1, gamma * p) + 1e-12)
            and np.all(other / other.sum() >= p / gamma - 1e-12)
        ):
            assert (pi * m).sum() <= (other / other.sum() * m).sum() + 1e-9
    assert np.allclose(worst_case_mix(m, p, 1.0), p)  # gamma 1: no room


def test_the_robust_certificate_prices_a_weak_cell_and_gamma_one_is_the_stratified_bound():
    """A point that fails in one cell only: robustly it is certified for less, the more the
    cell may grow; with gamma 1 it is about the plain certificate."""
    n = 6000
    rng = np.random.default_rng(2)
    cells = np.array(["a", "b", "c"])[np.arange(n) % 3]
    r = (rng.random(n) < 0.8).astype(float)
    a = np.where((cells == "c") & (rng.random(n) < 0.3), 0.0, r)
    plain = certified_targets(a[None], r, 0.95)[0]
    one = robust_certified_targets(a[None], r, 0.95, cells, 1.0)[0]
    two = robust_certified_targets(a[None], r, 0.95, cells, 2.0)[0]
    three = robust_certified_targets(a[None], r, 0.95, cells, 3.0)[0]
    assert abs(one - plain) < 0.01
    assert three < two < one
    c = cells == "c"
    worst = (2 / 3 * a[c].mean() + 1 / 3 * a[~c].mean()) / (2 / 3 * r[c].mean() + 1 / 3 * r[~c].mean())
    assert two <= worst + 0.005  # gamma 2 lets cell c take 2/3 of the traffic


def test_difficulty_cells_band_each_suite_by_its_own_scores():
    cells = difficulty_cells(["x"] * 6 + ["y"] * 3, np.array([0.9, 0.8, 0.7, 0.3, 0.2, 0.1, 0.5, 0.4, 0.6]))
    assert cells.tolist() == ["x|0", "x|0", "x|1", "x|1", "x|2", "x|2", "y|1", "y|2", "y|0"]


def test_the_assumption_says_what_it_assumes():
    assert "exchangeable" in Assumption().to_dict()["assumes"]
    robust = Assumption("robust", gamma=2.0, cells="9").to_dict()
    assert robust["gamma"] == 2.0 and "factor 2" in robust["assumes"]
    traffic = Assumption("traffic", traffic={"n_traffic": 50, "effective_sample_size": 31.2}).to_dict()
    assert "50 requests" in traffic["assumes"] and "effective sample size 31" in traffic["assumes"]
    with pytest.raises(ValueError, match="gamma"):
        Assumption("robust")
    with pytest.raises(ValueError, match="mode"):
        Assumption("hopeful")


def test_the_weighted_reference_moves_only_on_evidence():
    """Weights toward a traffic sample change the reference only when another candidate beats
    the unweighted best on the weighted requests with the certificate's confidence: a few heavy
    requests where it happened to pass are not that."""
    from routeopt.router_training.fit.certificate import Basis

    rng = np.random.default_rng(0)
    n = 400
    Y = np.zeros((n, 2))
    Y[:320, 0] = 1.0  # candidate 0 passes 0.80
    Y[48:328, 1] = 1.0  # candidate 1 passes 0.70, and 8 requests candidate 0 fails
    lucky = np.arange(320, 328)
    w = np.ones(n)
    w[lucky] = 8.0  # a handful of heavy requests where candidate 1 passed and 0 failed
    assert Basis(Assumption()).reference(Y) == 0
    weighted = Basis(Assumption("traffic"), weights=w)
    rates = (Y * w[:, None]).sum(0) / w.sum()
    assert rates[1] > rates[0]  # a plain weighted argmax would switch
    assert weighted.reference(Y) == 0
    # a traffic on which candidate 1 really is better everywhere it weighs: the reference moves
    Y2 = Y.copy()
    heavy = np.arange(n) < n // 2
    Y2[heavy, 1], Y2[heavy, 0] = 1.0, (rng.random(heavy.sum()) < 0.5)
    w2 = np.where(heavy, 10.0, 0.1)
    assert Basis(Assumption("traffic"), weights=w2).reference(Y2) == 1


def _whole_grid(a: np.ndarray, r: np.ndarray, confidence: float, w: np.ndarray | None) -> np.ndarray:
    """The certificate as its definition reads: the bound at every grid target, then the first
    target that fails."""
    from statistics import NormalDist

    from routeopt.router_training.fit.bounds import X_GRID

    n = a.shape[1]
    w = np.ones(n) if w is None else w
    total = w.sum()
    am, rm = (a * w).sum(1) / total, float((r * w).sum() / total)
    da, dr = a - am[:, None], r - rm
    va, vr, cov = (w * w * da * da).sum(1), float((w * w * dr * dr).sum()), (w * w * da * dr).sum(1)
    x = X_GRID[None, :]
    spread = np.sqrt(np.maximum(va[:, None] - 2 * x * cov[:, None] + x * x * vr, 0.0))
    se = spread / total * np.sqrt(n / (n - 1)) if n > 1 else np.full_like(spread, np.inf)
    ok = am[:, None] - x * rm - NormalDist().inv_cdf(confidence) * se >= 0
    first = np.where(ok.all(1), ok.shape[1], np.argmin(ok, axis=1))
    return np.where(first > 0, X_GRID[np.maximum(first - 1, 0)], 0.0)


@settings(max_examples=300)
@given(
    n=st.integers(1, 60),
    points=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    kind=st.sampled_from(["binary", "scores", "copies", "constant", "weighted"]),
    confidence=st.sampled_from([0.5, 0.8, 0.95, 0.999]),
)
def test_the_bisected_certificate_is_the_whole_grids(n, points, seed, kind, confidence):
    """Bisection over the grid gives the same target, to the bit, as evaluating every grid point:
    on pass/fail and fractional outcomes, points that copy the reference (bound exactly at the
    edge), constant outcomes (zero spread) and weights."""
    rng = np.random.default_rng(seed)
    r = (rng.random(n) < rng.random()).astype(float)
    if kind == "scores":
        r = rng.random(n)
    a = (rng.random((points, n)) < rng.random((points, 1))).astype(float)
    if kind == "scores":
        a = rng.random((points, n))
    if kind == "copies":
        a = np.vstack([r * rng.integers(1, 3) / 2 for _ in range(points)])
    if kind == "constant":
        a, r = np.full((points, n), float(rng.integers(0, 2))), np.full(n, float(rng.integers(0, 2)))
    w = rng.random(n) * 3 + 0.1 if kind == "weighted" else None
    got = certified_targets(a, r, confidence, w)
    assert np.array_equal(got, _whole_grid(a, r, confidence, w)), (got, _whole_grid(a, r, confidence, w))


def test_the_bisected_certificate_on_many_requests_is_the_whole_grids():
    for seed in range(40):
        a, r = _pair(2000, seed, rate=0.5 + seed / 100, lost=seed / 400)
        rows = np.vstack([a, r, np.maximum(a, r), 0.97 * r])
        assert np.array_equal(certified_targets(rows, r, 0.95), _whole_grid(rows, r, 0.95, None))


def test_a_bound_that_fails_at_0_keeps_no_target_even_where_it_holds_further_on():
    """The bound is concave in the target: two requests whose margin shrinks as the target
    grows can fail at 0 and hold at 2. The certificate is the first failure, so 0."""
    a, r = np.array([[0.30556628, 0.97211321]]), np.array([0.045778, 0.32945693])
    assert certified_targets(a, r, 0.999)[0] == 0.0 == _whole_grid(a, r, 0.999, None)[0]
