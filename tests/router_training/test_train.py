import threading

import numpy as np
import pandas as pd
import pytest
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from routeopt.router_training.fit.data import routing_data
from routeopt.router_training.fit.estimators import (
    LinearPassEstimator,
    PerSuitePassEstimator,
    design_matrix,
    fit_feature_spec,
    fit_platt,
)
from routeopt.router_training import train as train_module
from routeopt.router_training.train import train_router
from tests.router_training.conftest import demo_frame


def test_split_is_disjoint_and_complete(trained, demo):
    s = trained.split
    assert not set(s["train"]) & set(s["test"])
    assert len(s["train"]) + len(s["test"]) == demo["request_id"].nunique()


def test_published_policy_is_refit_on_every_request(trained, demo):
    """The held-out figures belong to the policy fitted without the held-out requests; the
    published one learned from all of them, and its knob is calibrated on all of them."""
    m, n = trained.metrics, demo["request_id"].nunique()
    assert m["refit"] and m["n_fit"] == n and m["n_train"] + m["n_test"] == n
    assert trained.evaluated is not trained.policy and "refit on all" in m["holdout"]["policy"]
    assert sorted(trained.split["calib"]) == sorted(demo["request_id"].unique())
    prompts, suites = demo["prompt"].unique()[:50].tolist(), ["add"] * 50
    assert not np.allclose(
        trained.policy.predict(prompts, suites)[0], trained.evaluated.predict(prompts, suites)[0]
    )

    kept = train_router(demo, quality_target=0.95, seed=0, refit=False)
    assert (
        kept.evaluated is kept.policy and not kept.metrics["refit"] and kept.metrics["n_fit"] == m["n_train"]
    )
    assert sorted(kept.split["calib"]) == sorted(kept.split["train"])
    assert np.allclose(kept.policy.predict(prompts, suites)[0], trained.evaluated.predict(prompts, suites)[0])


def test_training_on_one_core_publishes_what_several_cores_do(trained, demo, monkeypatch):
    """With several cores the held-out measurement runs beside the refit and the folds beside
    each other (here at any size); the policies and every metric are those of running them one
    after another, which is what a fleet this small does by default."""
    from routeopt.common.io import jsonable
    from routeopt.router_training.policy import batch_features

    monkeypatch.setattr(batch_features, "MIN_THREADED_SIZE", 0)
    monkeypatch.setattr(batch_features, "available_cores", lambda: 3)
    threads: list[str] = []

    def noting(fn, items, size):
        return batch_features.concurrently(
            lambda x: threads.append(threading.current_thread().name) or fn(x), items, size
        )

    monkeypatch.setattr(train_module, "concurrently", noting)
    together = train_router(demo, quality_target=0.95, seed=0)
    assert threads and all(name.startswith("routeopt-fold") for name in threads)  # beside the refit
    assert jsonable(together.metrics) == jsonable(trained.metrics) and together.split == trained.split
    for got, want in ((together.policy, trained.policy), (together.evaluated, trained.evaluated)):
        assert np.array_equal(got.scorer.weights, want.scorer.weights)
        assert [p.cost for p in got.knob.points] == [p.cost for p in want.knob.points]


def test_metrics_report_router_baselines_and_the_promise(trained):
    m = trained.metrics
    held = m["holdout"]
    for key in (
        "best_single",
        "cheapest_single",
        "oracle",
        "per_candidate",
        "table",
        "router_at_target",
        "promise",
    ):
        assert key in held
    assert {"router", "per_suite", "zero_router", "best_single", "oracle"} <= set(held["table"])
    assert held["oracle"]["pass_rate"] >= max(v["pass_rate"] for v in held["per_candidate"].values())
    knob = m["knob"]
    assert knob["confidence"] == 0.95 and knob["certified_up_to"] >= 1.0
    assert knob["reference"]["model"] == trained.policy.reference_model
    promise = held["promise"]
    assert promise["n"] == held["n_test_requests"] and promise["promised"] >= 1


def test_router_reads_difficulty_and_saves_cost(trained):
    """On the demo fleet the prompt states the difficulty: the router must use it."""
    policy = trained.policy
    easy = policy.decide("Task: add the input. difficulty: 1. Input: stone river", "add", 0.9)
    hard = policy.decide(
        "Task: add the input. difficulty: 5. Input: stone river tiger lemon piano rocket", "add", 0.9
    )
    assert easy.pass_probabilities["tiny"] > hard.pass_probabilities["tiny"] + 0.3
    assert easy.expected_cost_usd[easy.model] < hard.expected_cost_usd[hard.model]
    table = trained.metrics["holdout"]["table"]
    assert table["router"]["aiq"] > table["per_suite"]["aiq"]
    assert table["router"]["savings_at_95"] > table["zero_router"]["savings_at_95"]


@pytest.mark.parametrize("case", ["always_pass", "never_pass", "single_suite", "tiny"])
def test_robust_to_degenerate_fleets(case):
    kwargs = {"n_items": 40}
    if case == "always_pass":
        kwargs["candidates"] = {"a": (99.0, 0.001), "b": (2.0, 0.0001)}
    elif case == "never_pass":
        kwargs["candidates"] = {"a": (-99.0, 0.0001), "b": (3.0, 0.001)}
    elif case == "single_suite":
        kwargs["suites"] = ("add",)
    else:
        kwargs["n_items"] = 3
    frame = demo_frame(**kwargs)
    result = train_router(frame, holdout_fraction=0.3 if case != "tiny" else 0.0)
    d = result.policy.decide("Task: add. difficulty: 2.", "add")
    assert d.model in result.policy.candidates
    assert all(np.isfinite(list(d.pass_probabilities.values())))


def test_repeated_runs_are_averaged_and_missing_pairs_tolerated(demo):
    twice = demo.assign(run_id="r1")
    again = demo.assign(run_id="r2", score=1.0 - demo["score"])
    data = routing_data(pd.concat([twice, again]))
    assert np.allclose(data.Y[~np.isnan(data.Y)], 0.5)
    holes = demo.drop(index=demo.index[::7])
    result = train_router(holes, holdout_fraction=0.2)
    assert result.metrics["holdout"]["n_test_requests"] > 0


def test_bad_frames_are_clear_errors(demo):
    with pytest.raises(ValueError, match="lacks column"):
        train_router(demo.drop(columns=["prompt"]))
    with pytest.raises(ValueError, match="at least 4 requests"):
        train_router(demo.head(8))
    with pytest.raises(ValueError, match="holdout_fraction"):
        train_router(demo, holdout_fraction=1.5)


@pytest.fixture(scope="module")
def design(demo):
    data = routing_data(demo)
    spec = fit_feature_spec(data.prompts, data.suites)
    return design_matrix(data.prompts, data.suites, spec), data.Y, len(spec.suites)


@pytest.mark.parametrize(
    "make",
    [
        lambda s: LinearPassEstimator(n_suites=s),
        lambda s: PerSuitePassEstimator(n_suites=s),
    ],
)
def test_estimators_follow_sklearn_conventions(design, make):
    X, Y, s = design
    est = make(s)
    params = est.get_params()
    assert clone(est).get_params() == params  # __init__ only stores parameters
    with pytest.raises(NotFittedError):
        est.predict_proba(X)
    assert est.fit(X, Y) is est
    assert est.get_params() == params  # fit does not touch parameters
    P = est.predict_proba(X)
    assert P.shape == Y.shape and np.all((P >= 0) & (P <= 1))


def test_platt_handles_one_class_and_fits_scale():
    a, b = fit_platt(np.array([0.0, 1.0, 2.0]), np.array([1.0, 1.0, 1.0]))
    assert np.isfinite(a) and np.isfinite(b)
    rng = np.random.default_rng(0)
    z = rng.normal(size=4000)
    y = (rng.random(4000) < 1 / (1 + np.exp(-(2 * z - 0.5)))).astype(float)
    a, b = fit_platt(z, y)
    assert abs(a - 2) < 0.25 and abs(b + 0.5) < 0.2


def test_prices_replace_recorded_costs(demo):
    frame = demo.assign(input_tokens=pd.array([10] * len(demo), dtype="Int64"), output_tokens=None)
    prices = {"large": {"input_price_per_mtok": 1000.0, "output_price_per_mtok": 0.0}}
    data = routing_data(frame, prices)
    j = data.candidates.index("large")
    assert np.allclose(data.C[:, j], 10 * 1000.0 / 1e6)
    k = data.candidates.index("tiny")
    assert np.allclose(np.sort(np.unique(data.C[:, k]))[:1], 0.0001 * 1.1)


def test_metrics_say_how_many_outcomes_were_carried_forward_and_how_old(demo):
    night = pd.Timestamp("2026-12-05T02:00:00Z")
    carried = np.arange(len(demo)) % 3 == 0
    frame = demo.assign(
        call_mode=np.where(carried, "carried", "sync"),
        measured_at=np.where(carried, night - pd.Timedelta(days=4), night),
    )
    result = train_router(frame, holdout_fraction=0.3)
    reuse = result.metrics["reuse"]
    held_out = frame["request_id"].astype(str).isin(result.split["test"]).to_numpy()
    assert reuse["rows"] == carried.sum() and reuse["of"] == len(frame)
    assert reuse["held_out_rows"] == (carried & held_out).sum() and reuse["held_out_of"] == held_out.sum()
    assert reuse["age_days"] == {"median": 4.0, "max": 4.0}
    assert result.metrics["holdout"]["reused_rows"] == {"rows": reuse["held_out_rows"], "of": held_out.sum()}
    assert "reuse" not in train_router(demo, holdout_fraction=0.3).metrics  # nothing carried: nothing said
