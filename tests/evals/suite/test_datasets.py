"""Dataset sources: JSONL, CSV, Parquet and Hugging Face `datasets` (a local dataset folder)."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from routeopt.evals.grading.base import lookup
from routeopt.evals.suite.datasets import DatasetError, DatasetSpec, HFSource, load_rows
from routeopt.evals.suite.spec import check_suite, load_suite

ROWS = [{"id": f"r{i}", "q": f"{i} + 1", "a": i + 1, "meta": {"tags": ["t", f"n{i}"]}} for i in range(6)]


def test_lookup_dotted_paths() -> None:
    row = {"a": {"b": [10, {"c": "x"}]}}
    assert lookup(row, "a.b.0") == 10 and lookup(row, "a.b.1.c") == "x" and lookup(row, "a.b.-1.c") == "x"
    with pytest.raises(KeyError):
        lookup(row, "a.z")
    with pytest.raises(KeyError):
        lookup(row, "a.b.5")


def test_csv_with_field_mapping(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    with path.open("w", newline="") as fh:
        w = csv.writer(fh)
        w.writerow(["key", "question", "gold"])
        w.writerows([["k1", "2+2, really?", "4"], ["k2", "3+3", "6"]])
    rows = load_rows(DatasetSpec(path=path, id_field="key", fields={"answer": "gold"}), tmp_path)
    assert rows.items == [
        ("k1", {"key": "k1", "question": "2+2, really?", "gold": "4", "answer": "4"}),
        ("k2", {"key": "k2", "question": "3+3", "gold": "6", "answer": "6"}),
    ]


def test_byte_order_mark_is_not_part_of_the_first_column(tmp_path: Path) -> None:
    (tmp_path / "d.csv").write_bytes("\ufeffid,q\n1,a\n".encode())
    (tmp_path / "d.jsonl").write_bytes('\ufeff{"id": "1", "q": "a"}\n'.encode())
    for name in ("d.csv", "d.jsonl"):
        assert load_rows(DatasetSpec(path=tmp_path / name, id_field="id"), tmp_path).items == [
            ("1", {"id": "1", "q": "a"})
        ]


def test_file_that_is_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_bytes(b'{"q": "caf\xe9"}\n')
    with pytest.raises(DatasetError, match=r"d.jsonl: not UTF-8 text \(a byte 0xe9\)"):
        load_rows(DatasetSpec(path=tmp_path / "d.jsonl"), tmp_path)


def test_csv_row_with_wrong_width_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "d.csv"
    path.write_text("id,q\n1,a\n2,b,extra\n3\n")
    with pytest.raises(DatasetError) as err:
        load_rows(DatasetSpec(path=path), tmp_path)
    assert f"{path}:3: expected 2 columns" in str(err.value) and f"{path}:4:" in str(err.value)


def test_parquet_nested_fields(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "d.parquet"
    pq.write_table(pa.Table.from_pylist(ROWS), path)
    rows = load_rows(DatasetSpec(path=path, id_field="id", fields={"tag": "meta.tags.1"}), tmp_path)
    assert [i for i, _ in rows.items] == [r["id"] for r in ROWS]
    assert rows.items[2][1]["tag"] == "n2" and rows.items[2][1]["a"] == 3


def test_parquet_that_is_not_parquet(tmp_path: Path) -> None:
    path = tmp_path / "d.parquet"
    path.write_text("nope")
    with pytest.raises(DatasetError, match="not a readable Parquet file"):
        load_rows(DatasetSpec(path=path), tmp_path)


def test_mapping_to_a_missing_column_names_the_row(tmp_path: Path) -> None:
    path = tmp_path / "d.jsonl"
    path.write_text(json.dumps({"q": 1}) + "\n" + json.dumps({"x": 1}) + "\n")
    with pytest.raises(DatasetError, match=r"d.jsonl:2: fields.question: column 'q' not in row"):
        load_rows(DatasetSpec(path=path, fields={"question": "q"}), tmp_path)


def test_spec_needs_one_source_and_a_known_format() -> None:
    with pytest.raises(ValueError, match="exactly one of `path`"):
        DatasetSpec()
    with pytest.raises(ValueError, match="exactly one of `path`"):
        DatasetSpec(path=Path("a.jsonl"), hf=HFSource(name="x"))
    with pytest.raises(ValueError, match="cannot tell the format"):
        DatasetSpec(path=Path("a.txt"))
    assert DatasetSpec(path=Path("a.txt"), format="jsonl").format == "jsonl"
    assert DatasetSpec(path=Path("a.CSV")).format == "csv"


def _hf_folder(root: Path) -> Path:
    folder = root / "my_dataset"
    (folder / "data").mkdir(parents=True)
    for split, offset in (("train", 100), ("test", 0)):
        rows = [{**r, "id": f"{split}-{r['id']}", "a": r["a"] + offset} for r in ROWS]
        (folder / "data" / f"{split}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return folder


@pytest.fixture
def hf_calls(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[tuple]:
    """Record each `datasets.load_dataset` call, then let the real one run (offline, tmp cache)."""
    datasets = pytest.importorskip("datasets")
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    real = datasets.load_dataset
    calls: list[tuple] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, kwargs))
        return real(*args, **kwargs)

    monkeypatch.setattr(datasets, "load_dataset", recording)
    return calls


def test_hf_source_through_datasets(tmp_path: Path, hf_calls: list[tuple]) -> None:
    folder = _hf_folder(tmp_path)
    suite_path = tmp_path / "s.yaml"
    suite_path.write_text(f"""
name: hf-suite
dataset:
  hf: {{name: {folder}, split: test}}
  id_field: id
  fields: {{tag: meta.tags.1}}
prompt:
  template: "{{{{ q }}}} [{{{{ tag }}}}]"
  few_shot: {{split: train, n: 2, answer: "{{{{ a }}}}"}}
grader: {{type: numeric, target: "{{{{ a }}}}"}}
""")
    suite = load_suite(suite_path)
    assert [i.id for i in suite.items] == [f"test-r{i}" for i in range(6)]
    assert hf_calls[0] == ((str(folder), None), {"split": "test", "revision": None})
    assert hf_calls[1] == ((str(folder), None), {"split": "train", "revision": None})
    msgs = suite.request(suite.items[1]).messages
    assert msgs[-1].content == "1 + 1 [n1]"
    assert all(int(m.content) > 100 for m in msgs if m.role == "assistant")  # shots from train


def test_hf_hub_name_subset_revision_are_passed(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")
    seen: list[tuple] = []

    def fake_hub(*args: Any, **kwargs: Any) -> list[dict]:
        seen.append((args, kwargs))
        return [{"question": "q1", "answer": "a1"}]

    monkeypatch.setattr(datasets, "load_dataset", fake_hub)
    spec = DatasetSpec(hf=HFSource(name="org/data", subset="main", split="validation", revision="abc123"))
    rows = load_rows(spec, tmp_path)
    assert seen == [(("org/data", "main"), {"split": "validation", "revision": "abc123"})]
    assert rows.items == [("0", {"question": "q1", "answer": "a1"})]


def test_hf_load_failure_is_one_clear_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    datasets = pytest.importorskip("datasets")

    def offline(*args: Any, **kwargs: Any) -> None:
        raise ConnectionError("Couldn't reach the Hugging Face Hub")

    monkeypatch.setattr(datasets, "load_dataset", offline)
    (tmp_path / "s.yaml").write_text(
        "name: s\ndataset:\n  hf: {name: org/data, split: test}\nprompt: {template: x}\n"
        "grader: {type: contains, target: x}\n"
    )
    [p] = check_suite(tmp_path / "s.yaml")
    assert (p.line, p.field) == (2, "dataset")
    assert "hf dataset 'org/data'" in p.message and "ConnectionError" in p.message


def test_few_shot_split_needs_an_hf_dataset(tmp_path: Path) -> None:
    (tmp_path / "d.jsonl").write_text('{"q": 1}\n')
    (tmp_path / "s.yaml").write_text(
        "name: s\ndataset: {path: d.jsonl}\nprompt:\n  template: x\n"
        "  few_shot: {split: train, answer: y}\ngrader: {type: contains, target: x}\n"
    )
    [p] = check_suite(tmp_path / "s.yaml")
    assert p.field == "prompt.few_shot.split" and "needs an hf dataset" in p.message
