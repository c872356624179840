"""`routeopt run` / `eval` fail on a bad command line before anything slow: before Prefect is
even imported (so before its server starts), naming the file, line and field.

Each test runs the CLI in a fresh interpreter with Python's import timing on, which lists every
module the process imported.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO


def run_cli(*args: str) -> tuple[subprocess.CompletedProcess, set[str]]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONPROFILEIMPORTTIME": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "routeopt.flows.cli", *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in proc.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    }
    return proc, imported


def errors(proc: subprocess.CompletedProcess) -> str:
    return "\n".join(line for line in proc.stderr.splitlines() if not line.startswith("import time:"))


@pytest.mark.parametrize("command", ["run", "eval"])
def test_a_bad_config_fails_before_prefect_with_file_line_and_field(tmp_path: Path, command: str):
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "candidates:\n  - {name: a, provider: openai, model: m, input_price_per_mtok: 1,\n"
        "     max_concurrency: 0}\n"
    )
    proc, imported = run_cli(command, "--config", str(bad))
    assert proc.returncode == 1
    assert (
        errors(proc) == f"Error: {bad.resolve()}:3: candidates.0.max_concurrency: "
        "Input should be greater than or equal to 1"
    )
    assert "prefect" not in imported, "Prefect was imported (and its server started) first"


def test_unknown_candidate_or_suite_fails_before_prefect(tmp_path: Path):
    proc, imported = run_cli("eval", "--candidate", "nope")
    assert proc.returncode == 1
    assert "--candidate: no candidate 'nope'; the config has ['zoo-s'" in errors(proc)
    assert "prefect" not in imported
    proc, imported = run_cli("eval", "--suite", "nope")
    assert proc.returncode == 1
    assert "no suite named ['nope']; found ['add', 'reverse', 'sort']" in errors(proc)
    assert "prefect" not in imported


def test_before_exit_the_cli_closes_its_stores_and_freezes_the_heap(tmp_path, unfrozen_heap) -> None:
    """What `main` does last: every shared DuckDB store closed (its rows readable by another
    connection), then the heap frozen so shutdown's collections skip it."""
    import gc

    import duckdb

    from routeopt.flows import cli as cli_module
    from routeopt.flows import nightly

    store = nightly.shared_store(tmp_path / "db.duckdb")
    store.begin_run("run-x")
    cli_module._ready_to_exit()
    assert not nightly._STORES and gc.get_freeze_count() > 0
    with duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True) as con:
        assert con.sql("SELECT run_id FROM runs").fetchall() == [("run-x",)]
