"""Spend caps through the nightly flow: a capped candidate stops before its cap, the items it
skipped are recorded with error_kind 'budget', and nothing else is lost."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import FakeLLM, write_arithmetic_suite

CAP = 0.004
pytestmark = pytest.mark.slow  # needs the session Prefect server


def test_a_capped_candidate_stops_before_its_cap(tmp_path: Path, prefect_harness, monkeypatch):
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("OPS_BUDGET_KEY", "sk-budget")
    write_arithmetic_suite(tmp_path / "suites", 40, name="arith")
    with FakeLLM() as dear, FakeLLM() as cheap:
        cfg = {
            "candidates": [
                {
                    "name": "dear",
                    "provider": "openai",
                    "model": "big",
                    "base_url": dear.openai_base_url,
                    "input_price_per_mtok": 10.0,
                    "output_price_per_mtok": 30.0,
                    "api_key_env": "OPS_BUDGET_KEY",
                    "max_concurrency": 4,
                },
                {
                    "name": "cheap",
                    "provider": "openai",
                    "model": "small",
                    "base_url": cheap.openai_base_url,
                    "input_price_per_mtok": 0.1,
                    "output_price_per_mtok": 0.2,
                    "api_key_env": "OPS_BUDGET_KEY",
                },
            ],
            "suites_dir": "suites",
            "db_path": "db.duckdb",
            "registry_dir": "reg",
            "cache_dir": "cache",
            "budget": {"per_candidate_usd": {"dear": CAP}, "run_usd": 1.0},
        }
        (tmp_path / "routeopt.yaml").write_text(json.dumps(cfg))
        nightly(config_path=str(tmp_path / "routeopt.yaml"), run_id="b1", train=False, publish=False)
        close_store(tmp_path / "db.duckdb")
        calls_dear, calls_cheap = len(dear.requests), len(cheap.requests)
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    rows = con.execute(
        "SELECT candidate, count(*), count(*) FILTER (WHERE error_kind = 'budget'), "
        "count(*) FILTER (WHERE error_kind IS NULL), coalesce(sum(cost_usd), 0) "
        "FROM outcomes WHERE run_id = 'b1' GROUP BY candidate ORDER BY candidate"
    ).fetchall()
    reason = con.execute("SELECT error FROM outcomes WHERE error_kind = 'budget' LIMIT 1").fetchall()
    con.close()
    (cheap_row, dear_row) = rows
    assert cheap_row[:4] == ("cheap", 40, 0, 40) and calls_cheap == 40 + 1  # and its preflight probe
    name, total, skipped, graded, spent = dear_row
    assert total == 40 and 0 < skipped < 40 and graded + skipped == 40  # every item has its row
    assert calls_dear == graded + 1  # no call was sent for a skipped item (+ the probe)
    assert 0 < spent <= CAP
    assert "candidate 'dear' is capped at $0.004" in reason[0][0]
