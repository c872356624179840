"""Decision logs and feedback in the store: validation naming file and line, idempotent imports."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pandas as pd
import pytest

from routeopt.evals.storage.store import Store
from routeopt.evals.storage.traffic import TrafficImportError, import_decisions, import_feedback


def decision(rid: str, model: str = "a", propensity: float = 0.9, **kw) -> dict:
    rec = {
        "v": 1,
        "kind": "decision",
        "time": "2025-03-01T10:00:00.000001Z",
        "request_id": rid,
        "suite": "s",
        "quality_target": None,
        "prompt_hash": "h" + rid,
        "prompt_chars": 10,
        "channel": "champion",
        "policy_version": 3,
        "model": model,
        "propensity": propensity,
        "policy_model": model,
        "policy_probability": 1.0,
        "explored": False,
        "pass_probabilities": {"a": 0.7, "b": 0.9},
        "expected_cost_usd": {"a": 0.001, "b": 0.01},
        "exploration": {"rate": 0.1, "eligible": ["a", "b"]},
    }
    rec.update(kw)
    return rec


def write_log(path: Path, records: list[dict], tail: str = "") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in records) + tail)
    return path


@pytest.fixture()
def store(tmp_path):
    with Store(tmp_path / "db.duckdb") as s:
        yield s


def test_decisions_import_once_with_their_usage(store, tmp_path) -> None:
    log = tmp_path / "log"
    write_log(
        log / "a.jsonl",
        [
            decision("r1"),
            decision(
                "r2",
                "b",
                0.05,
                explored=True,
                shadow={
                    "channel": "candidate",
                    "policy_version": 4,
                    "model": "a",
                    "pass_probabilities": {"a": 0.6},
                },
            ),
        ],
    )
    write_log(
        log / "sub" / "b.jsonl",
        [
            {
                "kind": "usage",
                "time": "2025-03-01T10:00:01Z",
                "request_id": "r1",
                "model": "a",
                "input_tokens": 100,
                "output_tokens": 20,
                "cost_usd": 0.001,
            },
            {
                "kind": "usage",
                "time": "2025-03-01T10:00:02Z",
                "request_id": "r1",
                "model": "b",
                "input_tokens": 100,
                "output_tokens": 30,
                "cost_usd": 0.004,
            },
            decision("r1", "b"),
        ],
    )  # a repeated request id: the first record wins
    s = import_decisions(log, store)
    assert (s.files, s.decisions, s.new, s.duplicates, s.usage, s.usage_matched) == (2, 2, 2, 1, 2, 1)
    rows = store.query("SELECT * FROM decisions ORDER BY request_id")
    assert rows.model.tolist() == ["a", "b"] and rows.propensity.tolist() == [0.9, 0.05]
    assert rows.input_tokens.tolist()[0] == 200 and rows.cost_usd.tolist()[0] == pytest.approx(0.005)
    assert rows.shadow_version.tolist()[1] == 4 and rows.shadow_model.tolist()[1] == "a"
    assert json.loads(rows.eligible_json[0]) == ["a", "b"] and rows.exploration_rate[0] == 0.1
    again = import_decisions(log, store)
    assert again.new == 0 and len(store.query("SELECT * FROM decisions")) == 2
    assert store.query("SELECT input_tokens FROM decisions WHERE request_id = 'r1'").input_tokens[0] == 200


def test_an_unfinished_last_line_is_skipped_other_bad_lines_are_errors(store, tmp_path) -> None:
    log = write_log(
        tmp_path / "a.jsonl", [decision("r1")], tail='{"kind": "decision", "request_id": "r2", "ti'
    )
    s = import_decisions(log, store)
    assert s.new == 1 and s.truncated == [f"{log}:2"]
    bad = write_log(tmp_path / "b.jsonl", [decision("r3"), decision("r4", propensity=0.0), decision("r5")])
    with pytest.raises(TrafficImportError, match=rf"{bad}:2: field 'propensity': 0.0 must lie in \(0, 1\]"):
        import_decisions(bad, store)
    broken = write_log(
        tmp_path / "c.jsonl", [decision("r6")], tail="not json\n" + json.dumps(decision("r7")) + "\n"
    )
    with pytest.raises(TrafficImportError, match=rf"{broken}:2: not valid JSON"):
        import_decisions(broken, store)
    with pytest.raises(TrafficImportError, match="field 'time'"):
        import_decisions(write_log(tmp_path / "d.jsonl", [decision("r8", time="yesterday")]), store)
    assert store.query("SELECT request_id FROM decisions").request_id.tolist() == ["r1"]  # nothing else
    with pytest.raises(TrafficImportError, match="no such decision log"):
        import_decisions(tmp_path / "missing", store)


def test_feedback_joins_decisions_and_reimports_are_idempotent(store, tmp_path) -> None:
    import_decisions(write_log(tmp_path / "log.jsonl", [decision("r1"), decision("r2")]), store)
    fb = tmp_path / "fb.jsonl"
    fb.write_text(
        '{"request_id": "r1", "passed": true, "cost_usd": 0.002}\n\n'
        '{"request_id": "r2", "score": 0.3, "source": "judge"}\n'
        '{"request_id": "r9", "passed": "fail"}\n'
    )
    s = import_feedback(fb, store, source="users")
    assert (s.rows, s.new, s.updated, s.unchanged, s.matched, s.sources) == (
        3,
        3,
        0,
        0,
        2,
        ["judge", "users"],
    )
    rows = store.query("SELECT * FROM feedback ORDER BY request_id")
    assert rows.passed.tolist() == [True, False, False] and rows.score.tolist() == [1.0, 0.3, 0.0]
    assert rows.line.tolist() == ["1", "3", "4"] and rows.source.tolist() == ["users", "judge", "users"]
    assert import_feedback(fb, store, source="users").unchanged == 3
    fb.write_text('{"request_id": "r1", "passed": false, "cost_usd": 0.002}\n')
    assert import_feedback(fb, store, source="users").updated == 1
    assert len(store.query("SELECT * FROM feedback")) == 3


@pytest.mark.parametrize(
    "suffix,content,message",
    [
        (
            ".csv",
            "request_id,passed\nr1,true\nr2,maybe\n",
            r"fb.csv:3: column 'passed': 'maybe' is not true/false",
        ),
        (
            ".csv",
            "request_id,score\nr1,1.5\n",
            r"fb.csv:2: column 'score': '1.5' must be a number in \[0, 1\]",
        ),
        (".jsonl", '{"request_id": "r1"}\n', r"fb.jsonl:1: needs a 'passed' or a 'score' value"),
        (".jsonl", '{"passed": true}\n', r"fb.jsonl:1: column 'request_id'"),
        (
            ".jsonl",
            '{"request_id": "r1", "passed": 1}\n{"request_id": "r1", "passed": 0}\n',
            r"fb.jsonl:2: request_id 'r1' from source 'feedback' repeats .*fb.jsonl:1",
        ),
        (".jsonl", '{"request_id": "r1", "passed": 1, "cost_usd": -2}\n', r"column 'cost_usd'"),
        (".jsonl", "[1, 2]\n", r"fb.jsonl:1: expected a JSON object"),
        (".txt", "x", r"unknown format '.txt'"),
    ],
)
def test_bad_feedback_names_file_and_line_and_writes_nothing(
    store, tmp_path, suffix, content, message
) -> None:
    path = tmp_path / f"fb{suffix}"
    path.write_text(content)
    with pytest.raises(TrafficImportError, match=message):
        import_feedback(path, store)
    assert store.query("SELECT count(*) AS n FROM feedback").n[0] == 0


def test_feedback_from_parquet_with_tokens(store, tmp_path) -> None:
    path = tmp_path / "fb.parquet"
    pd.DataFrame(
        {
            "request_id": ["r1", "r2"],
            "passed": [True, False],
            "input_tokens": [10, None],
            "output_tokens": [3, 4],
        }
    ).to_parquet(path)
    s = import_feedback(path, store)
    assert s.rows == 2 and s.matched == 0
    rows = store.query("SELECT request_id, input_tokens, output_tokens, line FROM feedback ORDER BY 1")
    assert rows.output_tokens.tolist() == [3, 4] and rows.line.tolist() == [f"{path} row 0", f"{path} row 1"]


def test_an_existing_store_gains_the_traffic_tables(tmp_path) -> None:
    path = tmp_path / "old.duckdb"
    with Store(path):
        pass
    con = duckdb.connect(str(path))
    con.execute("DROP TABLE decisions")
    con.execute("DROP TABLE feedback")
    con.close()
    with Store(path, read_only=True) as ro:
        assert not ro.has_table("decisions")
    with Store(path) as rw:
        assert rw.has_table("decisions") and rw.has_table("feedback")
        assert import_decisions(write_log(tmp_path / "l.jsonl", [decision("r1")]), rw).new == 1
