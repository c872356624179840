"""Outcomes to Parquet, partitioned the Hive way: `run_date=YYYY-MM-DD/suite=NAME/<run_id>.parquet`.

The layout lets Spark, DuckDB, pandas or a warehouse read a date range or one suite without
scanning the rest. One file per (run date, suite, run) makes re-exporting a run idempotent: its
files are rewritten in place (each atomically), never duplicated.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from routeopt.common.io import atomic_writer
from routeopt.evals.storage.store import Store

_UNSAFE = re.compile(r"[^A-Za-z0-9._=-]")

EXPORT_SQL = """
SELECT CAST(timezone('UTC', r.started_at) AS DATE) AS run_date, o.*,
       r.started_at AS run_started_at, r.source AS run_source, r.config_fingerprint
FROM outcomes o JOIN runs r USING (run_id)
WHERE {where}
ORDER BY o.run_id, o.suite, o.item_id, o.candidate
"""


@dataclass
class ExportResult:
    out_dir: Path
    runs: list[str] = field(default_factory=list)
    files: list[Path] = field(default_factory=list)
    rows: int = 0


def _safe(value: str) -> str:
    """A path component that cannot escape its folder (run ids may be user-chosen) and that
    readers do not skip (they ignore names starting with '.' or '_'); altered names get a hash
    suffix so two ids never share a file."""
    cleaned = _UNSAFE.sub("_", value).lstrip("._")
    if cleaned == value:
        return value
    return f"{cleaned or 'x'}-{hashlib.sha256(value.encode()).hexdigest()[:8]}"


def write_parquet_atomic(table: pa.Table, path: Path) -> None:
    """Readers of the lake see a partition file whole or not at all."""
    with atomic_writer(path) as fh:
        pq.write_table(table, fh, compression="zstd")


_ARROW_TYPES: dict[str, pa.DataType] = {
    "VARCHAR": pa.string(),
    "DOUBLE": pa.float64(),
    "BIGINT": pa.int64(),
    "INTEGER": pa.int32(),
    "BOOLEAN": pa.bool_(),
    "DATE": pa.date32(),
    "TIMESTAMP WITH TIME ZONE": pa.timestamp("us", tz="UTC"),
}


def _schema(store: Store, sql: str, params: list, text: bool) -> pa.Schema:
    """The columns' DuckDB types as Arrow types, so a column that happens to be all null in
    one export still has the same type in every file."""
    described = store.query(f"DESCRIBE {sql}", params)
    dropped = set() if text else {"response", "error"}
    return pa.schema(
        (name, _ARROW_TYPES[kind])
        for name, kind in zip(described.column_name, described.column_type)
        if name not in dropped
    )


def _select(store: Store, run_ids: Sequence[str] | None, since: str | None, text: bool) -> pa.Table:
    where, params = ["TRUE"], []
    if run_ids:
        where.append(f"o.run_id IN ({', '.join('?' for _ in run_ids)})")
        params.extend(run_ids)
    if since:
        where.append("CAST(timezone('UTC', r.started_at) AS DATE) >= CAST(? AS DATE)")
        params.append(since)
    sql = EXPORT_SQL.format(where=" AND ".join(where))
    frame = store.query(sql, params)
    if not text:
        frame = frame.drop(columns=["response", "error"])
    missing = sorted(set(run_ids or ()) - set(frame.run_id.unique()))
    if missing:
        raise KeyError(f"no outcomes for run(s) {missing} in {store.path}")
    table = pa.Table.from_pandas(frame, schema=_schema(store, sql, params, text), preserve_index=False)
    return table.replace_schema_metadata(None)


def export_parquet(
    store: Store,
    out_dir: str | Path,
    run_ids: Sequence[str] | None = None,
    *,
    since: str | None = None,
    include_text: bool = True,
) -> ExportResult:
    """Export outcomes (all runs, the named ones, or those since a date) under `out_dir`.

    Partition columns (run_date, suite) live in the path, as Hive readers expect; every file
    also carries run_id and the run's start time, source and config fingerprint.
    """
    out = Path(out_dir)
    table = _select(store, run_ids, since, include_text)
    result = ExportResult(out)
    keys = table.group_by(["run_date", "suite", "run_id"]).aggregate([]).to_pylist()
    body_cols = [n for n in table.column_names if n not in ("run_date", "suite")]
    for key in sorted(keys, key=lambda k: (k["run_date"], k["suite"], k["run_id"])):
        mask = pc.and_(
            pc.and_(pc.equal(table["run_date"], key["run_date"]), pc.equal(table["suite"], key["suite"])),
            pc.equal(table["run_id"], key["run_id"]),
        )
        body = table.filter(mask).select(body_cols)
        path = (
            out
            / f"run_date={key['run_date'].isoformat()}"
            / f"suite={_safe(key['suite'])}"
            / f"{_safe(key['run_id'])}.parquet"
        )
        write_parquet_atomic(body, path)
        result.files.append(path)
        result.rows += body.num_rows
        if key["run_id"] not in result.runs:
            result.runs.append(key["run_id"])
    return result
