"""benchmarks/latency_data.py on a synthetic long frame: determinism, seeds, bounds, missing figures."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from tests.benchmarks import load

load("router_data")  # the sibling module it imports, as running the script would find it
ld = load("latency_data")

FIGURES = {
    "fast": ld.Figure(0.2, 100.0, "test"),
    "mid": ld.Figure(0.5, 50.0, "test"),
    "slow": ld.Figure(1.0, 20.0, "test"),
}


def frame(models: tuple[str, ...] = ("fast", "mid", "slow"), requests: int = 10) -> pd.DataFrame:
    rows = [
        {
            "request_id": f"r{i}",
            "suite": "s",
            "prompt": "p" * (40 * i + 1),
            "model": m,
            "score": float((i + j) % 2),
            "cost_usd": 0.001 * (j + 1),
            "input_tokens": None,
            "output_tokens": None,
            "response": "é" * (30 * j + i),  # two UTF-8 bytes each; i = j = 0 is empty
        }
        for i in range(requests)
        for j, m in enumerate(models)
    ]
    return pd.DataFrame(rows)


def test_same_seed_gives_identical_rows_and_another_seed_or_split_differs():
    src = frame()
    a = ld.annotate(src, "train", seed=0, figures=FIGURES)
    pd.testing.assert_frame_equal(a, ld.annotate(src, "train", seed=0, figures=FIGURES))
    for other in (ld.annotate(src, "train", seed=1, figures=FIGURES), ld.annotate(src, "test", 0, FIGURES)):
        assert not np.allclose(a["ttft_s"], other["ttft_s"])
        assert not np.allclose(a["latency_s"], other["latency_s"])


def test_latency_covers_ttft_and_tokens_are_filled_from_the_texts():
    out = ld.annotate(frame(), "train", seed=3, figures=FIGURES)
    assert (out["ttft_s"] > 0).all()
    assert (out["latency_s"] >= out["ttft_s"]).all()
    assert out["input_tokens"].tolist() == [-(-(40 * i + 1) // 4) for i in range(10) for _ in range(3)]
    assert out["output_tokens"].tolist() == [
        max(1, -(-2 * (30 * j + i) // 4)) for i in range(10) for j in range(3)
    ]
    slow, fast = out[out.model == "slow"], out[out.model == "fast"]
    assert slow["ttft_s"].median() > fast["ttft_s"].median()


def test_a_model_without_a_figure_is_named():
    src = frame(models=("fast", "unlisted-9b", "mid"))
    with pytest.raises(ValueError, match="unlisted-9b") as err:
        ld.annotate(src, "train", figures=FIGURES)
    assert "fast" not in str(err.value)


def test_the_budget_is_missed_by_the_cheapest_passing_model_on_a_fifth_of_requests():
    out = ld.annotate(frame(requests=50), "train", seed=0, figures=FIGURES)
    cheapest = ld.cheapest_passing(out)
    budget = ld.budget_missed_by_cheapest(out)
    assert (cheapest["ttft_s"] >= budget).mean() >= ld.MISS_SHARE
    assert (cheapest["ttft_s"] > budget).mean() < ld.MISS_SHARE
