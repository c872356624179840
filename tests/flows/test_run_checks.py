"""What `routeopt run` and `eval` refuse before anything starts (before Prefect is imported),
the resume hint they print, and how they stay loud without tracebacks."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from routeopt.evals.config import load_config
from routeopt.evals.storage.store import Store
from routeopt.flows.commands.run_checks import Heartbeat, QuietTracebacks, resume_hint
from tests import REPO
from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config
from tests.flows.test_pipeline_cli import errors, run_cli


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A config whose database has run 'night-1' (interrupted)."""
    write_arithmetic_suite(tmp_path / "suites", 3)
    config = tmp_path / "routeopt.yaml"
    config.write_text(
        json.dumps(
            {
                "candidates": [
                    {
                        "name": "m",
                        "provider": "openai",
                        "model": "m",
                        "base_url": "http://127.0.0.1:9/v1",
                        "input_price_per_mtok": 1,
                        "output_price_per_mtok": 1,
                    }
                ],
                "suites_dir": "suites",
                "db_path": "out/db.duckdb",
            }
        )
    )
    with Store(tmp_path / "out" / "db.duckdb") as store:
        store.begin_run("night-1")
        store.finish_run("night-1", "interrupted")
    return config


def test_a_resume_of_a_run_this_database_does_not_have_is_refused(project: Path, tmp_path: Path) -> None:
    """The resume hint typed in another folder used to start a new run with that id there."""
    elsewhere = tmp_path / "elsewhere.duckdb"
    proc, imported = run_cli("eval", "--config", str(project), "--resume", "night-1", "--db", str(elsewhere))
    assert proc.returncode == 1 and "prefect" not in imported
    assert errors(proc) == (
        f"Error: no run 'night-1' in {elsewhere}: nothing to resume. Resume in the "
        "database the run used (its resume hint gives --config and --db), or start "
        "a new run without --resume"
    )
    assert not elsewhere.exists()


def test_a_new_run_under_a_taken_id_is_refused(project: Path) -> None:
    proc, imported = run_cli("eval", "--config", str(project), "--run-id", "night-1")
    assert proc.returncode == 1 and "prefect" not in imported
    db = project.parent / "out" / "db.duckdb"
    assert errors(proc) == (
        f"Error: run 'night-1' already exists in {db} (interrupted): resume it with "
        "--resume night-1, or give a new --run-id"
    )
    both, _ = run_cli("eval", "--config", str(project), "--run-id", "a", "--resume", "night-1")
    assert both.returncode == 2 and "give --run-id (a new run) or --resume" in errors(both)


def test_an_unset_key_variable_is_named_before_prefect(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = json.loads(project.read_text())
    cfg["candidates"][0]["api_key_env"] = "I26_NEVER_SET_KEY"
    project.write_text(json.dumps(cfg))
    monkeypatch.delenv("I26_NEVER_SET_KEY", raising=False)
    proc, imported = run_cli("run", "--config", str(project))
    assert proc.returncode == 1 and "prefect" not in imported
    assert errors(proc) == (
        "Error: candidate m: $I26_NEVER_SET_KEY is not set\n"
        "Set it, or go on without this candidate with --skip-broken"
    )


def test_the_resume_hint_carries_every_option_that_decides_the_run(
    project: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cfg = load_config(project)
    kw = {
        "db_path": "rel/other db.duckdb",
        "suites": ("arith",),
        "candidates": ("m",),
        "cache_max_age": "12h",
        "cache": False,
        "no_publish": True,
        "skip_broken": True,
        "no_preflight": False,
    }
    monkeypatch.chdir(tmp_path)
    assert resume_hint("run", cfg, "night-2", kw) == (
        f"routeopt run --resume night-2 --config {project.resolve()} --db "
        f"'{tmp_path / 'rel' / 'other db.duckdb'}' --suite arith --candidate m --cache-max-age 12h "
        "--no-publish --skip-broken"
    )
    bare = {"db_path": None, "suites": (), "candidates": (), "cache_max_age": None, "cache": True}
    assert (
        resume_hint("eval", cfg, "r", bare)
        == f"routeopt eval --resume r --config {project.resolve()} --cache"
    )


def test_the_heartbeat_speaks_only_when_nothing_else_shows_the_run_is_alive() -> None:
    now = [0.0]
    beat = Heartbeat(bars=True, interval_s=60, clock=lambda: now[0])
    now[0] = 30.0
    beat.count("add", "zoo-s", 40, 150)
    now[0] = 80.0
    assert beat.line() is None  # a bar moved 50 s ago
    now[0] = 200.0  # training: the bars are full and still
    assert beat.line() == "routeopt: still running after 200s (40 items evaluated; the last 170s ago)"
    quiet = Heartbeat(bars=False, interval_s=60, clock=lambda: now[0])
    assert quiet.line() == "routeopt: still running after 0s (0 items evaluated)"  # no bars: always


def test_log_records_lose_their_traceback_and_keep_the_error_type() -> None:
    try:
        raise KeyError("boom")
    except KeyError:
        record = logging.LogRecord(
            "prefect.flow_runs",
            logging.ERROR,
            __file__,
            1,
            "Encountered exception during execution: %r",
            (KeyError("boom"),),
            sys.exc_info(),
        )
    assert QuietTracebacks().filter(record) and record.exc_info is None
    assert logging.Formatter().format(record) == (
        "Encountered exception during execution: KeyError('boom') (KeyError; --debug shows the traceback)"
    )


@pytest.mark.slow
def test_a_tampered_champion_is_one_sentence_after_the_summary(tmp_path: Path, prefect_api: str) -> None:
    """The run's results stand and are shown; why the champion was not moved is the last line,
    with no traceback, and the run exits non-zero."""
    write_arithmetic_suite(tmp_path / "suites", 20)
    env = {
        **{k: v for k, v in os.environ.items() if k != "ROUTEOPT_SIGNING_KEY"},
        "PREFECT_API_URL": prefect_api,
        "PYTHONPATH": str(REPO),
        "I26_S": "sk-s",
        "I26_W": "sk-w",
        "PREFECT_LOGGING_LEVEL": "WARNING",
    }
    with FakeLLM() as strong, FakeLLM() as weak:
        config = write_two_model_config(tmp_path / "routeopt.yaml", strong, weak, key_envs=("I26_S", "I26_W"))
        run = [sys.executable, "-m", "routeopt.flows.cli", "run", "--config", str(config), "--no-progress"]
        first = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
        assert first.returncode == 0, first.stdout + first.stderr
        (champion,) = (tmp_path / "out" / "registry" / "versions").glob("000001-*")
        policy = json.loads((champion / "policy.json").read_text())
        (champion / "policy.json").write_text(json.dumps({**policy, "tampered": True}))
        second = subprocess.run(run, env=env, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert second.returncode == 1
    assert "Traceback" not in second.stdout + second.stderr
    assert "run run-" in second.stdout and "strong" in second.stdout  # the summary of what ran
    assert "published policy v2" in second.stdout
    last = second.stderr.strip().splitlines()[-1]
    assert last.startswith("Error: the champion was not moved: ") and "cannot be verified" in last, (
        second.stderr
    )
    assert "policy.json: size or sha256 does not match manifest.json" in last
