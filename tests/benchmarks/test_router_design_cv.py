"""benchmarks/router_design_cv.py: its variant keys."""

from __future__ import annotations

import pytest

from tests.benchmarks import load

load("router_data")  # the sibling module it imports, as running the script would find it
cv = load("router_design_cv")


def test_variants_take_design_fields_and_train_options():
    name, design, options = cv.parse_variant("emb:embeddings=1,n_folds=5,confidence=0.9,refit=no")
    assert name == "emb" and design == {"n_folds": 5}
    assert options == {"confidence": 0.9, "embeddings": True, "refit": False}
    with pytest.raises(SystemExit, match="unknown design key 'nope'"):
        cv.parse_variant("x:nope=1")
