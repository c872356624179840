from __future__ import annotations

from pathlib import Path

import pytest

from evals.storage.store import Outcome, Store


def _outcome(item: str, cand: str = "m", passed: bool = True, run: str = "r1") -> Outcome:
    return Outcome(
        run_id=run, suite="s", suite_version="v1", item_id=item, candidate=cand,
        passed=passed, score=1.0 if passed else 0.0, cost_usd=0.001, latency_s=0.2,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "db" / "x.duckdb")
    s.begin_run("r1", candidates=[{"name": "m", "provider": "openai", "model": "gpt"}])
    s.register_suite("s", "v1", {"name": "s"}, [("1", "p1", {"a": 1}), ("2", "p2", {"a": 2})])
    yield s
    s.close()


def test_writes_are_idempotent(store: Store) -> None:
    store.write_outcomes([_outcome("1"), _outcome("2", passed=False)])
    store.write_outcomes([_outcome("1", passed=False), _outcome("2")])  # a repeat keeps the first
    df = store.query("SELECT item_id, passed FROM outcomes ORDER BY item_id")
    assert df.to_dict("records") == [{"item_id": "1", "passed": True}, {"item_id": "2", "passed": False}]


def test_done_items_and_training_frame(store: Store) -> None:
    store.write_outcomes([_outcome("1"), Outcome("r1", "s", "v1", "2", "m", error_kind="timeout", error="x")])
    assert store.done_items("r1", "s", "m") == {"1", "2"}
    frame = store.training_frame()
    assert list(frame["request_id"]) == ["s/1"]  # error rows carry no quality evidence
    assert list(frame["prompt"]) == ["p1"]


def test_begin_run_twice_resumes(store: Store) -> None:
    assert store.begin_run("r1") is False
    assert store.begin_run("r2") is True
    assert store.query("SELECT count(*) AS n FROM runs")["n"][0] == 2


def test_failed_batch_rolls_back(store: Store) -> None:
    bad = _outcome("3")
    bad.run_id = None  # violates NOT NULL: the whole batch must be rejected
    with pytest.raises(Exception):
        store.write_outcomes([_outcome("1"), bad])
    assert store.query("SELECT count(*) AS n FROM outcomes")["n"][0] == 0
    store.write_outcomes([_outcome("1")])  # the connection is still usable
    assert store.query("SELECT count(*) AS n FROM outcomes")["n"][0] == 1


def test_budget_skips_are_retried_and_replaced(store: Store) -> None:
    skipped = Outcome("r1", "s", "v1", "1", "m", error_kind="budget", error="cap reached")
    store.write_outcomes([skipped, _outcome("2")])
    assert store.done_items("r1", "s", "m") == {"2"}  # a resumed run retries the skipped item
    store.write_outcomes([_outcome("1"), _outcome("2", passed=False)])
    df = store.query("SELECT item_id, passed, error_kind FROM outcomes ORDER BY item_id")
    assert df.to_dict("records") == [
        {"item_id": "1", "passed": True, "error_kind": None},  # the placeholder was replaced
        {"item_id": "2", "passed": True, "error_kind": None},  # a final row was kept
    ]
