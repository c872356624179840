"""The secret scanner the key-leak tests rely on finds a key wherever a format hides it."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import duckdb
import pandas as pd

from tests.leaks import hits_under

SECRET = "sk-planted-secret-0123456789"


def test_a_key_in_a_compressed_duckdb_column_is_found_where_a_byte_grep_misses_it(tmp_path: Path) -> None:
    db = tmp_path / "store.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE outcomes (id INT, error VARCHAR, meta JSON)")
    con.execute(
        "INSERT INTO outcomes SELECT i, 'Incorrect API key provided: ' || ? || ' request ' || i, "
        "NULL FROM range(20000) t(i)",
        [SECRET],
    )
    con.execute("CHECKPOINT")
    con.close()
    assert SECRET.encode() not in db.read_bytes()  # what the old test grepped: compressed away
    assert hits_under([tmp_path], SECRET) == [f"{db}:outcomes.error"]


def test_parquet_sqlite_and_plain_files(tmp_path: Path) -> None:
    pd.DataFrame({"response": [f"answer {i} {SECRET}" for i in range(5000)]}).to_parquet(
        tmp_path / "export.parquet", compression="zstd"
    )
    con = sqlite3.connect(tmp_path / "cache.sqlite")
    con.execute("CREATE TABLE responses (key TEXT, completion TEXT)")
    con.execute("INSERT INTO responses VALUES ('k', ?)", (f'{{"text": "{SECRET}"}}',))
    con.commit()
    con.close()
    (tmp_path / "report.html").write_text(f"<p>{SECRET}</p>")
    (tmp_path / "clean.json").write_text("{}")
    hits = hits_under([tmp_path], SECRET)
    assert f"{tmp_path / 'export.parquet'}:response" in hits
    assert f"{tmp_path / 'cache.sqlite'}:responses.completion" in hits
    assert str(tmp_path / "report.html") in hits and not [h for h in hits if "clean.json" in h]
