import json

import pandas as pd
import pytest

from routeopt.evals.storage.importer import OutcomeImportError, import_outcomes
from routeopt.evals.storage.store import Store

ROWS = [
    {
        "request_id": "q1",
        "suite": "math",
        "prompt": "2+2?",
        "model": "small",
        "score": 1.0,
        "cost_usd": 0.001,
    },
    {"request_id": "q1", "suite": "math", "prompt": "2+2?", "model": "big", "score": 1.0, "cost_usd": 0.01},
    {
        "request_id": "q2",
        "suite": "math",
        "prompt": "17*23?",
        "model": "small",
        "score": 0.0,
        "cost_usd": 0.001,
        "input_tokens": 5,
        "output_tokens": 3,
        "latency_s": 0.2,
        "response": "381",
    },
    {
        "request_id": "q2",
        "suite": "math",
        "prompt": "17*23?",
        "model": "big",
        "score": 1.0,
        "cost_usd": 0.012,
    },
    {"request_id": "w1", "prompt": "Say hi", "model": "small", "score": 1.0},
]


def _write(frame: pd.DataFrame, path):
    if path.suffix == ".parquet":
        frame.to_parquet(path)
    elif path.suffix == ".csv":
        frame.to_csv(path, index=False)
    else:
        path.write_text(
            "".join(
                json.dumps({k: v for k, v in r.items() if v == v}) + "\n"
                for r in frame.to_dict(orient="records")
            )
        )
    return path


@pytest.fixture
def store(tmp_path):
    with Store(tmp_path / "db.duckdb") as s:
        yield s


@pytest.mark.parametrize("ext", [".parquet", ".csv", ".jsonl"])
def test_import_lands_in_training_frame(tmp_path, store, ext):
    path = _write(pd.DataFrame(ROWS), tmp_path / f"outcomes{ext}")
    summary = import_outcomes(path, store)
    assert summary.rows == 5 and summary.requests == 3 and summary.candidates == ["big", "small"]
    assert set(summary.suites) == {"math", "imported"}
    frame = store.training_frame()
    assert len(frame) == 5
    row = frame[(frame.item_id == "q2") & (frame.model == "small")].iloc[0]
    assert row.prompt == "17*23?" and row.score == 0.0 and not row.passed and row.cost_usd == 0.001
    assert row.input_tokens == 5 and row.latency_s == 0.2
    runs = store.query("SELECT source, status FROM runs")
    assert runs.to_dict(orient="records") == [{"source": "import", "status": "completed"}]
    assert len(store.query("SELECT * FROM candidates")) == 2


def test_import_twice_is_idempotent(tmp_path, store):
    path = _write(pd.DataFrame(ROWS), tmp_path / "o.parquet")
    first = import_outcomes(path, store)
    second = import_outcomes(path, store)
    assert first.new_run and not second.new_run and first.run_id == second.run_id
    assert len(store.training_frame()) == 5
    assert store.query("SELECT count(*) AS n FROM items").n[0] == 3


def test_passed_only_and_explicit_run_id(tmp_path, store):
    frame = pd.DataFrame(ROWS).drop(columns=["score"]).assign(passed=[True, True, False, "yes", "0"])
    summary = import_outcomes(_write(frame, tmp_path / "o.csv"), store, run_id="mine")
    f = store.training_frame()
    assert summary.run_id == "mine" and set(f.run_id) == {"mine"}
    assert sorted(f.score.tolist()) == [0.0, 0.0, 1.0, 1.0, 1.0]


def test_missing_columns_are_named(tmp_path, store):
    path = _write(pd.DataFrame(ROWS).drop(columns=["prompt", "score"]), tmp_path / "o.parquet")
    with pytest.raises(OutcomeImportError, match=r"prompt, score \(or passed\)"):
        import_outcomes(path, store)


@pytest.mark.parametrize(
    "column, value, message",
    [
        ("score", "high", r"row 3 \(line 4\), column 'score'"),
        ("score", 2.0, r"row 3 \(line 4\), column 'score'.*\[0, 1\]"),
        ("cost_usd", -1.0, r"row 3 \(line 4\), column 'cost_usd'"),
        ("input_tokens", 1.5, r"row 3 \(line 4\), column 'input_tokens'"),
        ("model", None, r"row 3 \(line 4\), column 'model'"),
    ],
)
def test_bad_rows_name_row_and_column(tmp_path, store, column, value, message):
    frame = pd.DataFrame(ROWS).astype(object)
    frame.loc[2, column] = value
    with pytest.raises(OutcomeImportError, match=message):
        import_outcomes(_write(frame, tmp_path / "o.csv"), store)
    assert len(store.query("SELECT * FROM outcomes")) == 0  # nothing half-written


def test_duplicates_and_conflicting_prompts(tmp_path, store):
    dup = pd.DataFrame(ROWS + [ROWS[0]])
    with pytest.raises(OutcomeImportError, match="row 6: duplicate of .*row 1"):
        import_outcomes(_write(dup, tmp_path / "d.parquet"), store)
    clash = pd.DataFrame(ROWS + [{**ROWS[0], "model": "other", "prompt": "2+3?"}])
    with pytest.raises(OutcomeImportError, match="column 'prompt'"):
        import_outcomes(_write(clash, tmp_path / "c.parquet"), store)


def test_bad_json_line_and_unknown_format(tmp_path, store):
    path = tmp_path / "o.jsonl"
    path.write_text(json.dumps(ROWS[0]) + "\n{not json\n")
    with pytest.raises(OutcomeImportError, match=r"\.jsonl:2: not valid JSON"):
        import_outcomes(path, store)
    other = tmp_path / "o.xlsx"
    other.write_text("x")
    with pytest.raises(OutcomeImportError, match="unknown format"):
        import_outcomes(other, store)
