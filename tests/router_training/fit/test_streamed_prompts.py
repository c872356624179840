"""Outcome rows share their item's prompt: the store reads each prompt once, and routing_data
gives the same matrices from that frame as from one that repeats the text on every row."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd

from routeopt.evals.storage.store import Outcome, Store
from routeopt.router_training.fit.data import routing_data


def test_store_frame_holds_each_prompt_once_and_trains_like_repeated_text(tmp_path: Path) -> None:
    prompts = {"1": "the same words", "2": "the same words", "3": "other words?"}
    with Store(tmp_path / "x.duckdb") as store:
        store.begin_run("r1")
        store.register_suite("s", "v1", {}, [(i, p, {}) for i, p in prompts.items()])
        store.write_outcomes(
            [
                Outcome(
                    "r1",
                    "s",
                    "v1",
                    i,
                    m,
                    passed=(int(i) + j) % 2 == 0,
                    score=float((int(i) + j) % 2 == 0),
                    cost_usd=0.001 * (j + 1),
                )
                for i in prompts
                for j, m in enumerate(("a", "b", "c"))
            ]
        )
        frame = store.training_frame()
    assert isinstance(frame["prompt"].dtype, pd.CategoricalDtype)
    assert sorted(frame["prompt"].cat.categories) == ["other words?", "the same words"]  # once each
    assert frame.groupby("item_id")["prompt"].first().astype(str).to_dict() == prompts
    repeated = frame.assign(prompt=frame["prompt"].astype(str).astype(object))
    prices = {"a": {"input_price_per_mtok": 1.0}}
    for p in (None, prices):
        a, b = routing_data(frame, p), routing_data(repeated, p)
        assert (a.request_ids, a.prompts, a.suites) == (b.request_ids, b.prompts, b.suites)
        np.testing.assert_array_equal(a.Y, b.Y)
        np.testing.assert_array_equal(a.C, b.C)
