"""The optional LightGBM router: estimator conventions, text-format persistence, publishing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.exceptions import NotFittedError

from routeopt.router_training.fit.estimators import LightGBMPassEstimator
from routeopt.router_training.policy.routing import LinearScorer, RoutingPolicy, TreeScorer
from routeopt.router_training.train import train_router
from tests import REPO
from tests.router_training.conftest import demo_frame

os.environ.setdefault("OMP_NUM_THREADS", "1")
PROMPTS = [
    ("Task: sort the input. difficulty: 1. Input: stone river", "sort"),
    ("Task: add the input. difficulty: 5. Input: apple cloud tiger lemon piano rocket", "add"),
    ("Task: reverse the input. difficulty: 3. Input: maple violet", "reverse"),
    ("something else entirely?", None),
]


def _toy(n: int = 300, seed: int = 0) -> tuple[sp.csr_matrix, np.ndarray]:
    """Column 0 decides candidate 0; candidate 1 always passes; candidate 2 is half missing."""
    rng = np.random.default_rng(seed)
    X = sp.random(n, 40, density=0.2, random_state=seed, format="csr")
    Y = np.empty((n, 3))
    Y[:, 0] = (X[:, 0].toarray().ravel() > 0).astype(float)
    Y[:, 1] = 1.0
    Y[:, 2] = rng.random(n) < 0.5
    Y[rng.random(n) < 0.5, 2] = np.nan
    return X, Y


@pytest.fixture(scope="module")
def lgbm_result():
    return train_router(demo_frame(n_items=80), quality_target=0.95, seed=0, estimator="lightgbm")


def test_estimator_follows_sklearn_conventions() -> None:
    X, Y = _toy()
    est = LightGBMPassEstimator(n_estimators=60, seed=3)
    assert est.get_params()["n_estimators"] == 60 and not hasattr(est, "models_")
    with pytest.raises(NotFittedError):
        est.predict_proba(X)
    assert est.fit(X, Y) is est
    P = est.predict_proba(X)
    assert P.shape == (300, 3) and np.all((P > 0) & (P < 1))
    assert isinstance(est.models_[1], float) and np.ptp(P[:, 1]) == 0 and P[0, 1] > 0.99
    assert not isinstance(est.models_[0], float)
    y0 = Y[:, 0] == 1
    assert P[y0, 0].min() > P[~y0, 0].max()  # the deciding column is learned
    assert est.out_of_fold_logits().shape == (300, 3)
    again = clone(est).fit(X, Y).predict_proba(X)
    np.testing.assert_array_equal(again, P)  # seeded and deterministic


def test_default_stays_linear_and_bad_estimator_is_refused(lgbm_result) -> None:
    frame = demo_frame(n_items=30)
    assert isinstance(train_router(frame, seed=0).policy.scorer, LinearScorer)
    assert isinstance(lgbm_result.policy.scorer, TreeScorer)
    assert lgbm_result.metrics["estimator"] == "lightgbm"
    with pytest.raises(ValueError, match="estimator must be one of"):
        train_router(frame, estimator="xgboost")


def test_save_load_round_trip_gives_identical_decisions(lgbm_result, tmp_path: Path) -> None:
    """The boosters are published as portable tree arrays, evaluated without lightgbm, to the
    same decisions; a format 2 policy (LightGBM text files) loads to them too."""
    from tests.router_training.legacy import save_format_2

    policy = lgbm_result.policy
    names = policy.save(tmp_path / "v3")
    assert sorted(names) == ["arrays.safetensors", "conformance.safetensors", "policy.json"]
    old = save_format_2(policy, tmp_path / "v2")
    assert [n for n in old if n.startswith("lgbm_")] == [
        f"lgbm_{j}.txt" for j in range(len(policy.candidates))
    ]
    for loaded in (RoutingPolicy.load(tmp_path / "v3"), RoutingPolicy.load(tmp_path / "v2")):
        for prompt, suite in PROMPTS:
            assert loaded.decide(prompt, suite) == policy.decide(prompt, suite)
        batch = loaded.decide_batch([p for p, _ in PROMPTS], [s for _, s in PROMPTS])
        assert batch == [policy.decide(p, s) for p, s in PROMPTS]
    summary = RoutingPolicy.load(tmp_path / "v3").describe()["scorer"]
    assert summary["kind"] == "trees" and summary["n_features"] == policy.spec.n_features
    assert RoutingPolicy.load(tmp_path / "v3").self_check().ok


def test_portable_trees_give_lightgbms_own_raw_scores_to_the_bit(lgbm_result) -> None:
    lgb = pytest.importorskip("lightgbm")
    scorer, spec = lgbm_result.policy.scorer, lgbm_result.policy.spec
    from routeopt.router_training.fit.estimators import design_matrix

    frame = demo_frame(n_items=40, seed=5).drop_duplicates("request_id")
    X = design_matrix(frame.prompt.tolist(), frame.suite.tolist(), spec).toarray()
    X[:3] = 0.0  # every feature at zero: LightGBM's zero-as-missing branch
    for j, text in enumerate(scorer.texts):
        want = (
            np.full(len(X), text)
            if isinstance(text, float)
            else lgb.Booster(model_str=text).predict(X, raw_score=True)
        )
        np.testing.assert_array_equal(scorer.logits_dense(X)[:, j], want)


def test_corrupt_model_file_is_a_clear_error(lgbm_result, tmp_path: Path) -> None:
    from tests.router_training.legacy import save_format_2

    save_format_2(lgbm_result.policy, tmp_path / "v2")
    (tmp_path / "v2" / "lgbm_0.txt").write_text("not a model\n")
    with pytest.raises(ValueError, match="does not parse|not a readable routing policy"):
        RoutingPolicy.load(tmp_path / "v2")
    lgbm_result.policy.save(tmp_path / "v3")
    data = (tmp_path / "v3" / "arrays.safetensors").read_bytes()
    (tmp_path / "v3" / "arrays.safetensors").write_bytes(data[: len(data) // 2])
    with pytest.raises(ValueError, match="arrays.safetensors"):
        RoutingPolicy.load(tmp_path / "v3")


def test_published_lightgbm_policy_routes_and_tampering_is_refused(lgbm_result, tmp_path: Path) -> None:
    from routeopt.artifacts.publish.registry import publish
    from routeopt.artifacts.serving.loader import PolicyLoadError, load
    from routeopt.artifacts.publish.signing_keys import generate_keys

    private, public = generate_keys(tmp_path / "keys")
    policy = lgbm_result.policy
    v = publish(policy, tmp_path / "registry", lineage={"runs": ["r1"]}, metrics={}, signing_key=private)
    folder = tmp_path / "registry" / v.path
    router = load(folder, public_key=public)
    for prompt, suite in PROMPTS:
        got, want = router.route(prompt, suite), policy.decide(prompt, suite)
        assert (got.model, got.fallbacks) == (want.model, want.fallbacks)
        assert got.pass_probabilities == pytest.approx(want.pass_probabilities)
    target = folder / "arrays.safetensors"
    data = bytearray(target.read_bytes())
    data[-9] ^= 0x40  # a leaf value
    target.write_bytes(bytes(data))
    with pytest.raises(PolicyLoadError, match="tampered"):
        load(folder, public_key=public)


def test_policy_module_imports_lightgbm_only_when_needed() -> None:
    code = (
        "import sys, routeopt.router_training.policy.routing; "
        "bad = {'lightgbm', 'scipy', 'sklearn', 'pandas'} & set(sys.modules); assert not bad, bad"
    )
    subprocess.run([sys.executable, "-c", code], cwd=REPO, check=True)


def test_cli_train_and_bench_take_an_estimator(tmp_path: Path, monkeypatch) -> None:
    import json

    monkeypatch.setenv("ROUTEOPT_SIGNING_KEY", str(tmp_path / "keys" / "signing_key.pem"))
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    from click.testing import CliRunner

    from routeopt.flows.cli import cli

    train, test = tmp_path / "train.parquet", tmp_path / "test.parquet"
    demo_frame(n_items=50, seed=1).to_parquet(train)
    demo_frame(n_items=25, seed=2).to_parquet(test)
    runner = CliRunner()
    r = runner.invoke(
        cli,
        [
            "bench",
            "router",
            "--train",
            str(train),
            "--test",
            str(test),
            "--estimator",
            "lightgbm",
            "--json",
            str(tmp_path / "r.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    table = json.loads((tmp_path / "r.json").read_text())[0]["table"]
    assert {"knob", "reference", "zero_router"} <= set(table) and table["knob"]["aiq"] > 0

    db, registry = tmp_path / "db.duckdb", tmp_path / "registry"
    assert runner.invoke(cli, ["import", "outcomes", str(train), "--db", str(db)]).exit_code == 0
    r = runner.invoke(cli, ["train", "--db", str(db), "--registry", str(registry), "--estimator", "lightgbm"])
    assert r.exit_code == 0, r.output
    r = runner.invoke(
        cli, ["route", "--policy", str(registry), "Task: add. difficulty: 2.", "--suite", "add"]
    )
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["model"] in {"tiny", "small", "medium", "large"}
    (folder,) = registry.glob("versions/*")
    assert json.loads((folder / "policy.json").read_text())["scorer"]["kind"] == "trees"


def test_boosters_train_on_a_dask_cluster_through_lightgbms_dask_interface() -> None:
    """With a Dask client each booster is trained across the workers (rows split between them)
    and is an ordinary booster afterwards: the same raw scores from its text form, out-of-fold
    logits for calibration, and a policy train_router publishes."""
    pytest.importorskip("dask.array")
    distributed = pytest.importorskip("distributed")
    X, Y = _toy(400)
    with (
        distributed.LocalCluster(
            n_workers=2, processes=False, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        est = LightGBMPassEstimator(n_estimators=30, seed=0, client=client).fit(X, Y)
        result = train_router(demo_frame(n_items=40), seed=0, estimator="lightgbm", client=client)
    P = est.predict_proba(X)
    assert not isinstance(est.models_[0], float) and isinstance(est.models_[1], float)
    y0 = Y[:, 0] == 1
    assert P[y0, 0].mean() > P[~y0, 0].mean() + 0.3  # the deciding column is learned across workers
    assert est.out_of_fold_logits().shape == (400, 3)
    assert isinstance(result.policy.scorer, TreeScorer) and result.policy.knob.points
    with pytest.raises(ValueError, match="lightgbm estimator only"):
        train_router(demo_frame(n_items=30), client=object())
