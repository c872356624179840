"""Parquet export: Hive-partitioned by run date and suite, lossless, idempotent, atomic."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pyarrow.dataset as ds
import pytest

from routeopt.evals.storage.export import export_parquet
from routeopt.evals.storage.store import Outcome, Store
from tests.ops_history import make_history


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("export") / "db.duckdb"
    make_history(path, runs=3, items=8)
    return path


def _read(out: Path):
    return ds.dataset(out, format="parquet", partitioning="hive").to_table().to_pandas()


def test_export_is_hive_partitioned_and_lossless(db: Path, tmp_path: Path):
    with Store(db, read_only=True) as store:
        result = export_parquet(store, tmp_path / "out")
        stored = store.query("SELECT * FROM outcomes ORDER BY run_id, suite, item_id, candidate")
    rel = sorted(str(p.relative_to(tmp_path / "out")) for p in result.files)
    assert rel[0] == "run_date=2026-11-01/suite=arith/run-00.parquet" and len(rel) == 6
    assert result.runs == ["run-00", "run-01", "run-02"] and result.rows == len(stored) == 3 * 2 * 3 * 8
    back = _read(tmp_path / "out").sort_values(["run_id", "suite", "item_id", "candidate"])
    assert set(back.run_date.astype(str)) == {"2026-11-01", "2026-11-02", "2026-11-03"}
    for col in ("passed", "cost_usd", "latency_s", "error_kind", "response", "input_tokens"):
        left = stored[col].reset_index(drop=True)
        right = back[col].reset_index(drop=True)
        assert left.isna().equals(right.isna()), col
        assert left[left.notna()].tolist() == right[right.notna()].tolist(), col
    # DuckDB reads the same layout with its partition columns typed from the path
    n = duckdb.sql(
        f"SELECT count(*) FROM read_parquet('{tmp_path}/out/**/*.parquet', hive_partitioning=true) "
        "WHERE suite = 'facts' AND run_date = DATE '2026-11-02'"
    ).fetchall()[0][0]
    assert n == 3 * 8


def test_reexport_rewrites_in_place_and_filters_apply(db: Path, tmp_path: Path):
    out = tmp_path / "out"
    with Store(db, read_only=True) as store:
        first = export_parquet(store, out, ["run-01"])
        again = export_parquet(store, out, ["run-01"])
        later = export_parquet(store, out, since="2026-11-03", include_text=False)
        with pytest.raises(KeyError, match=r"no outcomes for run\(s\) \['nope'\]"):
            export_parquet(store, out, ["nope"])
    assert first.files == again.files and first.rows == again.rows == 2 * 3 * 8
    assert later.runs == ["run-02"]
    files = sorted(p.name for p in out.rglob("*") if p.is_file())
    assert files == ["run-01.parquet"] * 2 + ["run-02.parquet"] * 2  # no duplicates, no temp files
    plain = ds.dataset(later.files[0], format="parquet").schema.names
    assert "response" not in plain and "cost_usd" in plain and "suite" not in plain


def test_unsafe_run_ids_cannot_escape_the_export_folder(tmp_path: Path):
    db = tmp_path / "db.duckdb"
    with Store(db) as store:
        store.begin_run("../../etc/x")
        store.write_outcomes([Outcome("../../etc/x", "s", "v", "1", "c", passed=True)])
        result = export_parquet(store, tmp_path / "out")
    (path,) = result.files
    assert path.resolve().is_relative_to((tmp_path / "out").resolve())
    assert path.name.startswith("etc_x-") and path.suffix == ".parquet"
    assert _read(tmp_path / "out").run_id.tolist() == ["../../etc/x"]


def test_cli_export_and_drift(db: Path, tmp_path: Path):
    from click.testing import CliRunner

    from routeopt.flows.cli import cli

    runner = CliRunner()
    res = runner.invoke(
        cli, ["export", "parquet", "--db", str(db), "--out", str(tmp_path / "o"), "--run", "run-02"]
    )
    assert res.exit_code == 0, res.output
    assert "wrote 48 outcomes of 1 runs in 2 files" in res.output
    res = runner.invoke(
        cli, ["export", "parquet", "--db", str(db), "--out", str(tmp_path / "o"), "--run", "zz"]
    )
    assert res.exit_code == 1 and "no outcomes for run(s) ['zz']" in res.output
    res = runner.invoke(cli, ["drift", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    assert '"run_id": "run-02"' in res.output and '"baseline_runs"' in res.output
    res = runner.invoke(cli, ["drift", "--db", str(tmp_path / "missing.duckdb")])
    assert res.exit_code == 1 and "no outcome database" in res.output
