"""Search everything a run wrote for a secret, reading each format the way its readers do.

A byte grep is blind to compressed storage: DuckDB compresses string columns (FSST, dictionaries)
and Parquet pages are compressed, so a key stored there is not in the file's bytes. Databases and
Parquet files are therefore searched through SQL over every column cast to text; SQLite files
(the response cache) through SQL and their raw pages (freed pages keep old rows); everything else
(HTML, JSON, policy files, logs) as bytes.
"""

from __future__ import annotations

import contextlib
import logging
import sqlite3
from pathlib import Path
from typing import Iterable, Iterator

import duckdb


def _quote(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def duckdb_hits(path: Path, needle: str) -> list[str]:
    """`file:table.column` for every column of every table holding `needle` in any row."""
    hits = []
    con = duckdb.connect(str(path), read_only=True)
    try:
        columns = con.execute(
            "SELECT table_schema, table_name, column_name FROM information_schema.columns "
            "WHERE table_catalog = current_database()"
        ).fetchall()
        for schema, table, column in columns:
            found = con.execute(
                f"SELECT count(*) FROM {_quote(schema)}.{_quote(table)} "
                f"WHERE contains(CAST({_quote(column)} AS VARCHAR), ?)",
                [needle],
            ).fetchone()[0]
            if found:
                hits.append(f"{path}:{table}.{column}")
    finally:
        con.close()
    return hits


def parquet_hits(path: Path, needle: str) -> list[str]:
    con = duckdb.connect()
    try:
        names = [r[0] for r in con.execute("DESCRIBE SELECT * FROM read_parquet(?)", [str(path)]).fetchall()]
        return [
            f"{path}:{n}"
            for n in names
            if con.execute(
                f"SELECT count(*) FROM read_parquet(?) WHERE contains(CAST({_quote(n)} AS VARCHAR), ?)",
                [str(path), needle],
            ).fetchone()[0]
        ]
    finally:
        con.close()


def sqlite_hits(path: Path, needle: str) -> list[str]:
    hits = [f"{path}:bytes"] if needle.encode() in path.read_bytes() else []
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    try:
        for (table,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'").fetchall():
            for column in [r[1] for r in con.execute(f"PRAGMA table_info({_quote(table)})")]:
                n = con.execute(
                    f"SELECT count(*) FROM {_quote(table)} WHERE "
                    f"instr(CAST({_quote(column)} AS TEXT), ?) > 0",
                    (needle,),
                ).fetchone()[0]
                if n:
                    hits.append(f"{path}:{table}.{column}")
    finally:
        con.close()
    return hits


def file_hits(path: Path, needle: str) -> list[str]:
    """Where `needle` is in one file, read according to its format."""
    head = path.read_bytes()[:16]
    if head[8:12] == b"DUCK":
        return duckdb_hits(path, needle)
    if head.startswith(b"PAR1"):
        return parquet_hits(path, needle)
    if head.startswith(b"SQLite format 3\x00"):
        return sqlite_hits(path, needle)
    return [str(path)] if needle.encode() in path.read_bytes() else []


def hits_under(roots: Iterable[Path], needle: str) -> list[str]:
    """Every place under `roots` (files or folders, recursively) that holds `needle`."""
    hits: list[str] = []
    for root in roots:
        for path in sorted([root] if root.is_file() else root.rglob("*")):
            if path.is_file() and path.stat().st_size:
                hits.extend(file_hits(path, needle))
    return hits


class _Keep(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.setFormatter(logging.Formatter("%(name)s %(levelname)s %(message)s"))
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(self.format(record))  # with the traceback, where there is one


@contextlib.contextmanager
def every_log_record() -> Iterator[list[str]]:
    """Every record logged meanwhile, at DEBUG, formatted with its traceback. Call it after
    Prefect is imported: Prefect's logging setup replaces the root logger's handlers (which is
    why pytest's caplog sees nothing of a flow run)."""
    handler, root, prefect = _Keep(), logging.getLogger(), logging.getLogger("prefect")
    levels = root.level, prefect.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    prefect.setLevel(logging.DEBUG)
    try:
        yield handler.lines
    finally:
        root.removeHandler(handler)
        root.setLevel(levels[0])
        prefect.setLevel(levels[1])
