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


def test_a_file_from_before_the_streamed_column_gains_it_and_keeps_its_rows(tmp_path: Path) -> None:
    import dataclasses

    import duckdb

    from evals.storage import store as store_module

    path = tmp_path / "old.duckdb"
    old_schema = store_module.SCHEMA.replace("    streamed BOOLEAN,\n", "").split("-- Files")[0]
    old_columns = [f.name for f in dataclasses.fields(Outcome) if f.name != "streamed"]
    with duckdb.connect(str(path)) as con:
        con.execute(old_schema)
        con.execute(f"INSERT INTO outcomes ({', '.join(old_columns)}) VALUES "
                    f"({', '.join('?' * len(old_columns))})",
                    [{**dataclasses.asdict(_outcome("1")), "created_at": "2026-01-01"}[c]
                     for c in old_columns])
    with Store(path) as s:
        s.write_outcomes([dataclasses.replace(_outcome("2"), streamed=False)])
        rows = s.query("SELECT item_id, passed, streamed FROM outcomes ORDER BY item_id")
    assert rows.to_dict("records") == [{"item_id": "1", "passed": True, "streamed": None},
                                       {"item_id": "2", "passed": True, "streamed": False}]
