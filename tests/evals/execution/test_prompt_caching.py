"""Prompt caching through the runner: the shared prefix is marked, cache reads and writes are
recorded in DuckDB and priced at the provider's rates, and the run summary and `routeopt cost
compare` say what caching saved (cache writes priced at the write rate, not as plain input)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
from click.testing import CliRunner
from rich.console import Console

from routeopt.evals.execution.runner import evaluate_pair
from routeopt.evals.selfhost.costmodel import load_caching
from routeopt.evals.storage.store import SCHEMA, Store
from routeopt.evals.suite.spec import load_suite
from tests.evals.execution.test_runner import FAST, fresh_limits
from tests.fake_llm import fake_candidate, fake_llm  # noqa: F401

SYSTEM = "You add numbers. Reply with the sum and nothing else, as the examples show."


def few_shot_suite(folder: Path, n: int) -> Path:
    """n additions behind a system prompt and two few-shot turns shared by every item."""
    folder.mkdir(parents=True, exist_ok=True)
    items = [{"id": f"q{i:03d}", "a": i, "b": 7, "answer": i + 7} for i in range(n)]
    shots = [{"id": "s1", "a": 1, "b": 1, "answer": 2}, {"id": "s2", "a": 2, "b": 3, "answer": 5}]
    for name, rows in (("items", items), ("shots", shots)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": "fewshot",
        "dataset": {"path": "items.jsonl", "id_field": "id"},
        "prompt": {
            "system": SYSTEM,
            "template": "What is {{ a }} + {{ b }}?",
            "few_shot": {
                "dataset": {"path": "shots.jsonl", "id_field": "id"},
                "n": 2,
                "answer": "{{ answer }}",
            },
        },
        "generation": {"max_tokens": 8},
        "grader": {"type": "numeric", "target": "{{ answer }}"},
    }
    path = folder / "fewshot.yaml"
    path.write_text(json.dumps(spec))
    return path


async def test_cache_tokens_are_recorded_and_priced(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(few_shot_suite(tmp_path / "s", 6))
    cand = fake_candidate(
        "anthropic", input_price_per_mtok=3.0, output_price_per_mtok=15.0, max_concurrency=1
    )
    with Store(tmp_path / "o.duckdb") as store:
        store.begin_run("r1", candidates=[cand.public_dict()])
        await evaluate_pair(suite, cand, "r1", store.write_outcomes, limits=fresh_limits(cand), retry=FAST)
        rows = store.query(
            "SELECT item_id, passed, input_tokens, cached_input_tokens, "
            "cache_write_input_tokens, output_tokens, cost_usd FROM outcomes "
            "ORDER BY item_id"
        ).to_dict("records")
        savings = load_caching(store, "r1")
    sent = fake_llm.requests
    assert len(sent) == 6
    for r in sent:  # the system prompt and the last few-shot turn carry the breakpoints
        assert r.body["system"][0]["cache_control"] == {"type": "ephemeral"}
        assert [("cache_control" in json.dumps(m)) for m in r.body["messages"]] == [
            False,
            False,
            False,
            True,
            False,
        ]
    shared = len((SYSTEM + " What is 1 + 1? 2 What is 2 + 3? 5").split())
    assert [(r["cached_input_tokens"], r["cache_write_input_tokens"]) for r in rows] == (
        [(0, shared)] + [(shared, 0)] * 5
    )
    for r in rows:
        plain = r["input_tokens"] - r["cached_input_tokens"] - r["cache_write_input_tokens"]
        want = (
            plain * 3.0
            + r["cached_input_tokens"] * 0.3
            + r["cache_write_input_tokens"] * 3.75
            + r["output_tokens"] * 15.0
        ) / 1e6
        assert r["passed"] and r["cost_usd"] == pytest.approx(want)
    (s,) = savings
    total_in = sum(r["input_tokens"] for r in rows)
    assert (s.calls, s.input_tokens, s.cache_read_tokens, s.cache_write_tokens) == (
        6,
        total_in,
        5 * shared,
        shared,
    )
    assert s.uncached_input_usd == pytest.approx(total_in * 3.0 / 1e6)
    assert s.saved_usd == pytest.approx((5 * shared * (3.0 - 0.3) - shared * (3.75 - 3.0)) / 1e6)


def test_configured_cache_prices_win_over_the_defaults():
    from routeopt.evals.config import Candidate

    base = dict(name="c", provider="anthropic", model="m", input_price_per_mtok=2.0)
    assert Candidate(**base).cache_prices() == pytest.approx((0.2, 2.5))
    assert Candidate(
        **base, cached_input_price_per_mtok=0.5, cache_write_input_price_per_mtok=3.0
    ).cache_prices() == (0.5, 3.0)
    openai = Candidate(**{**base, "provider": "openai"})
    assert openai.cache_prices() == (2.0, 2.0)  # none listed: the input price, as before
    assert Candidate(**base).input_cost_usd(1000, 600, 300) == pytest.approx(
        (100 * 2.0 + 600 * 0.2 + 300 * 2.5) / 1e6
    )


def test_an_old_database_gains_the_cache_write_column(tmp_path):
    db = tmp_path / "old.duckdb"
    old = SCHEMA.replace("    cache_write_input_tokens BIGINT,\n", "")
    assert old != SCHEMA
    con = duckdb.connect(str(db))
    con.execute(old)
    con.execute(
        "INSERT INTO outcomes (run_id, suite, suite_version, item_id, candidate, passed, "
        "input_tokens, created_at) VALUES ('r0', 's', 'v', 'i', 'c', true, 12, now())"
    )
    con.close()
    with Store(db, read_only=True) as ro:  # read-only: nothing migrates, reading still works
        assert load_caching(ro, "r0")[0].cache_write_tokens == 0
    from routeopt.evals.storage.store import Outcome

    with Store(db) as store:
        store.write_outcomes(
            [Outcome("r1", "s", "v", "i", "c", passed=True, input_tokens=9, cache_write_input_tokens=4)]
        )
        with store._lock:
            got = store._con.execute(
                "SELECT run_id, input_tokens, cache_write_input_tokens FROM outcomes ORDER BY run_id"
            ).fetchall()
    assert got == [("r0", 12, None), ("r1", 9, 4)]  # the old row is kept


def test_summary_and_cost_compare_show_what_caching_saved(tmp_path, fake_llm):
    import asyncio

    from routeopt.evals.config import load_config
    from routeopt.flows.cli import cli
    from routeopt.reports.summary import RunResult, print_summary

    suite_path = few_shot_suite(tmp_path / "suites", 5)
    cfg_path = tmp_path / "routeopt.yaml"
    cfg_path.write_text(
        json.dumps(
            {
                "candidates": [
                    {
                        "name": "claude",
                        "provider": "anthropic",
                        "model": "m",
                        "max_concurrency": 1,
                        "base_url": fake_llm.anthropic_base_url,
                        "input_price_per_mtok": 3.0,
                        "output_price_per_mtok": 15.0,
                    }
                ],
                "db_path": "o.duckdb",
            }
        )
    )
    cfg = load_config(cfg_path)
    cand = cfg.candidates[0]
    with Store(cfg.db_path) as store:
        store.begin_run("r1", candidates=[cand.public_dict()])
        asyncio.run(
            evaluate_pair(
                load_suite(suite_path),
                cand,
                "r1",
                store.write_outcomes,
                limits=fresh_limits(cand),
                retry=FAST,
            )
        )
        savings = load_caching(store, "r1")
    console = Console(record=True, width=200)
    print_summary(console, [], RunResult(run_id="r1"), savings)
    text = console.export_text()
    saved = f"{savings[0].saved_usd:.6f}"
    assert "prompt caching" in text and saved in text and float(saved) > 0
    res = CliRunner().invoke(cli, ["cost", "compare", "--config", str(cfg_path)])
    assert res.exit_code == 0, res.output
    assert "run r1: prompt caching" in res.output and saved in res.output
    assert "cache reads" in res.output and "cache writes" in res.output


async def test_openai_caches_by_itself_and_reports_reads(tmp_path, fake_llm, fake_candidate):
    suite = load_suite(few_shot_suite(tmp_path / "s", 4))
    cand = fake_candidate(
        "openai",
        input_price_per_mtok=2.0,
        cached_input_price_per_mtok=0.5,
        output_price_per_mtok=8.0,
        max_concurrency=1,
    )
    with Store(tmp_path / "o.duckdb") as store:
        await evaluate_pair(suite, cand, "r1", store.write_outcomes, limits=fresh_limits(cand), retry=FAST)
        rows = store.query(
            "SELECT input_tokens, cached_input_tokens, cache_write_input_tokens, "
            "output_tokens, cost_usd FROM outcomes ORDER BY item_id"
        ).to_dict("records")
        (s,) = load_caching(store, "r1", [cand])
    assert "cache_control" not in json.dumps([r.body for r in fake_llm.requests])
    system = len(SYSTEM.split())
    assert [r["cached_input_tokens"] for r in rows] == [0, system, system, system]
    for r in rows:
        want = (
            (r["input_tokens"] - r["cached_input_tokens"]) * 2.0
            + r["cached_input_tokens"] * 0.5
            + r["output_tokens"] * 8.0
        ) / 1e6
        assert r["cost_usd"] == pytest.approx(want) and pd_na(r["cache_write_input_tokens"])
    assert s.saved_usd == pytest.approx(3 * system * (2.0 - 0.5) / 1e6)


def pd_na(x: object) -> bool:
    import pandas as pd

    return x is None or bool(pd.isna(x))
