"""The incremental night in the flow: carried forward, sampled, and re-measured on drift."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config


def test_second_night_carries_forward_and_a_drifted_candidate_is_remeasured(
    tmp_path: Path, prefect_harness, monkeypatch
) -> None:
    from routeopt.flows.nightly import close_store, nightly, shared_store

    monkeypatch.setenv("K1", "k1")
    monkeypatch.setenv("K2", "k2")
    with FakeLLM() as strong, FakeLLM() as weak:
        write_arithmetic_suite(tmp_path / "suites", 60)
        config = write_two_model_config(tmp_path / "routeopt.yaml", strong, weak, key_envs=("K1", "K2"))
        cfg = json.loads(config.read_text())
        cfg["reuse"] = {"max_age_days": 7, "drift_sample": 20}
        cfg["preflight"] = {"enabled": False}
        config.write_text(json.dumps(cfg))

        def night(run_id: str) -> tuple[Counter, int, int]:
            before = len(strong.requests), len(weak.requests)
            result = nightly(config_path=str(config), run_id=run_id, train=False, publish=False)
            db = Path(result.db_path)
            rows = shared_store(db).query(
                "SELECT candidate, call_mode FROM outcomes WHERE run_id = ?", [run_id]
            )
            close_store(db)
            return (
                Counter(zip(rows.candidate, rows.call_mode)),
                len(strong.requests) - before[0],
                len(weak.requests) - before[1],
            )

        modes, s_calls, w_calls = night("n1")
        assert modes == {("strong", "sync"): 60, ("weak", "sync"): 60} and (s_calls, w_calls) == (60, 60)
        modes, s_calls, w_calls = night("n2")  # nothing changed: 20 re-measured per candidate
        assert modes == {
            ("strong", "carried"): 40,
            ("strong", "sync"): 20,
            ("weak", "carried"): 40,
            ("weak", "sync"): 20,
        }, modes
        assert (s_calls, w_calls) == (20, 20)
        weak.answer_fn = lambda prompt: "0"  # the provider changed the model behind its name
        modes, s_calls, w_calls = night("n3")
        assert modes == {("strong", "carried"): 40, ("strong", "sync"): 20, ("weak", "sync"): 60}, modes
        assert (s_calls, w_calls) == (20, 60)
