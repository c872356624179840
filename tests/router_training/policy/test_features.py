import os
import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from routeopt.router_training.policy.features import (
    STAT_NAMES,
    FeatureSpec,
    feature_layers,
    request_features,
)

SPEC = FeatureSpec(suites=("add", "sort"), n_buckets=2**10)


def buckets(prompt: str) -> set[int]:
    return set(feature_layers(prompt, None, SPEC).buckets.tolist())


def test_suite_one_hot_and_unknown_suite_is_all_zeros():
    ids, vals = request_features("difficulty: 3", "sort", SPEC)
    assert ids[0] == 1 and vals[0] == 1.0
    for suite in (None, "never-seen"):
        ids, _ = request_features("difficulty: 3", suite, SPEC)
        assert not np.isin([0, 1], ids).any()


def test_layout_is_suites_then_text_then_stats():
    ids, vals = request_features("Reverse the word stone", "add", SPEC)
    n = len(SPEC.suites)
    text = ids[(ids >= n) & (ids < n + SPEC.n_buckets)]
    assert len(text) > 3
    assert list(ids[-len(STAT_NAMES) :]) == list(range(n + SPEC.n_buckets, SPEC.n_features))
    assert np.isclose(np.linalg.norm(vals[1 : 1 + len(text)]), 1.0)


def test_word_order_and_case():
    a = buckets("Hello World")
    assert a == buckets("hello world")
    assert a != buckets("world hello")  # bigrams and char n-grams see order


@pytest.mark.parametrize("prompt", ["", " ", "é", "日本語のテキスト", "x" * 20000, "a\nb\tc"])
def test_odd_prompts_featurise(prompt):
    ids, vals = request_features(prompt, None, SPEC)
    assert np.all(np.isfinite(vals)) and np.all(ids < SPEC.n_features)
    assert len(feature_layers(prompt, None, SPEC).stats) == len(STAT_NAMES)


def test_idf_and_stat_scaling_apply():
    spec = replace(
        SPEC, idf=tuple([2.0] * SPEC.n_buckets), stat_mean=tuple([1.0] * 9), stat_std=tuple([2.0] * 9)
    )
    _, raw = request_features("some text here", None, SPEC)
    _, scaled = request_features("some text here", None, spec)
    assert np.allclose(scaled[-9:], (raw[-9:] - 1.0) / 2.0)


def test_hashing_is_stable_across_processes():
    code = (
        "from routeopt.router_training.policy.features import FeatureSpec, feature_layers;"
        "print(feature_layers('Reverse the word stone, difficulty 3', None, FeatureSpec()).buckets.tolist())"
    )
    env = {"PATH": "", "PYTHONPATH": os.environ.get("PYTHONPATH", "")}
    outs = {
        subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            env={**env, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2")
    }
    assert len(outs) == 1


def test_spec_round_trips_through_dict():
    spec = replace(
        SPEC, idf=tuple(np.linspace(1, 2, SPEC.n_buckets)), stat_mean=(0.0,) * 9, stat_std=(1.0,) * 9
    )
    again = FeatureSpec.from_dict(spec.to_dict())
    a = request_features("hello there", "add", spec)
    b = request_features("hello there", "add", again)
    assert np.array_equal(a[0], b[0]) and np.allclose(a[1], b[1], atol=1e-5)


def test_gateway_modules_import_without_heavy_packages():
    code = (
        "import sys; import routeopt.router_training.policy.routing, routeopt.router_training.policy.features;"
        "bad = {'sklearn','pandas','duckdb','prefect','torch','scipy'} & set(sys.modules);"
        "print(sorted(bad))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
