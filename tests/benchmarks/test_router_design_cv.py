"""benchmarks/router_design_cv.py: its variant keys and its embedding cache."""

from __future__ import annotations

import numpy as np
import pytest

from router_training import embeddings
from tests.benchmarks import load

load("router_data")  # the sibling module it imports, as running the script would find it
cv = load("router_design_cv")


def test_variants_take_design_fields_and_train_options():
    name, design, options = cv.parse_variant("emb:embeddings=1,n_folds=5,confidence=0.9,refit=no")
    assert name == "emb" and design == {"n_folds": 5}
    assert options == {"confidence": 0.9, "embeddings": True, "refit": False}
    with pytest.raises(SystemExit, match="unknown design key 'nope'"):
        cv.parse_variant("x:nope=1")


def test_each_prompt_is_embedded_once_across_calls(monkeypatch):
    seen: list[str] = []

    def fake(texts, batch_size=32):
        seen.extend(texts)
        return np.array([[float(len(t))] * embeddings.DIM for t in texts])

    monkeypatch.setattr(embeddings, "embed", fake)
    cv.cache_embeddings()
    first = embeddings.embed(["ab", "abc", "ab"])
    again = embeddings.embed(["abc", "abcd"])
    assert seen == ["ab", "abc", "abcd"]
    assert first[:, 0].tolist() == [2, 3, 2] and again[:, 0].tolist() == [3, 4]
    assert embeddings.embed([]).shape == (0, embeddings.DIM)
