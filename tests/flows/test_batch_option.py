"""`routeopt eval --batch NAME`: batch mode for this run, through the real CLI and the fake
Batch APIs on the wire; recorded with the run, so a resume after kill -9 keeps it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from routeopt.evals.config import load_config
from routeopt.evals.storage.store import Store
from routeopt.flows.commands.run_checks import resume_hint
from tests import REPO
from tests.batch_driver import fleet
from tests.evals.execution.test_batch_kill import Server
from tests.fake_llm import write_arithmetic_suite
from tests.flows.test_cli_lifecycle import MARK, mark  # noqa: F401 - the fixture
from tests.flows.test_pipeline_cli import errors, run_cli

N = 12
SETTINGS = {"enabled": False, "poll_interval_s": 0.05, "latency_sample": 2}


def project(folder: Path, urls: dict[str, str]) -> Path:
    """The fake fleet, synchronous in its config: `gpt` keeps batch settings, turned off; a
    `local` candidate and one priced by GPU time sit beside them (never called here)."""
    write_arithmetic_suite(folder / "suites", N)
    path = fleet(folder, urls, batch=False)
    cfg = json.loads(path.read_text())
    cfg["candidates"][0]["batch"] = SETTINGS
    cfg["candidates"] += [
        {"name": "zoo", "provider": "local", "model": "zoo-s", "gpu_hour_usd": 1.0},
        {
            "name": "vllm",
            "provider": "openai",
            "model": "m",
            "base_url": urls["openai"],
            "gpu_hour_usd": 2.0,
            "gpu_tokens_per_s": 500.0,
        },
    ]
    path.write_text(json.dumps(cfg))
    return path


def test_bad_batch_names_are_one_sentence_before_prefect(tmp_path: Path) -> None:
    config = project(tmp_path, {"openai": "http://127.0.0.1:9/v1", "anthropic": "http://127.0.0.1:9"})
    names = "['gpt', 'claude', 'zoo', 'vllm']"
    for args, said in [
        (("--batch", "nope"), f"Error: --batch: no candidate 'nope'; the config has {names}"),
        (
            ("--batch", "zoo"),
            "Error: --batch: candidate 'zoo': a `local` candidate runs in this process and has no "
            "batch API (only openai and anthropic candidates batch); leave it out of --batch",
        ),
        (
            ("--batch", "vllm"),
            "Error: --batch: candidate 'vllm': a candidate priced by GPU time has no batch price "
            "(give token prices to batch it); leave it out of --batch",
        ),
        (
            ("--candidate", "claude", "--batch", "gpt"),
            "Error: --batch: candidate 'gpt' is not in this run (--candidate ['claude'])",
        ),
        (
            ("--candidate", "zoo", "--batch", "all"),
            "Error: --batch all: none of this run's candidates ['zoo'] has a batch API (only openai "
            "and anthropic candidates priced by tokens batch)",
        ),
    ]:
        proc, imported = run_cli("eval", "--config", str(config), *args)
        assert proc.returncode == 1, proc.stderr[-2000:]
        assert errors(proc) == said
        assert "prefect" not in imported


def test_the_option_batches_like_the_config_and_a_resume_keeps_it(
    tmp_path: Path,
    mark: str,
    prefect_api: str,  # noqa: F811
) -> None:
    server = Server("--phase-s", "2.0")
    try:
        config = project(tmp_path, {"openai": server.url + "/v1", "anthropic": server.url})
        db = tmp_path / "out" / "routeopt.duckdb"
        args = ("--candidate", "gpt", "--candidate", "claude", "--no-progress", "--no-preflight")
        proc = _start(config, mark, prefect_api, "--run-id", "night", "--batch", "gpt", *args)
        deadline = time.monotonic() + 240
        while not server.get("/_fake/batches"):  # submitted and recorded: kill it mid-batch
            assert proc.poll() is None, proc.communicate()[0][-3000:]
            assert time.monotonic() < deadline, "no batch was submitted"
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)

        with Store(db, read_only=True) as store:
            assert store.batch_option("night") == ["gpt"]
            spec = json.loads(
                store.query(
                    "SELECT spec_json FROM candidates WHERE run_id = 'night' AND name = 'gpt'"
                ).spec_json[0]
            )
        assert spec["batch"] == {**spec["batch"], **SETTINGS, "enabled": True}  # its own settings, on

        # another choice on the resume is refused, before anything starts
        again, imported = run_cli("eval", "--config", str(config), "--resume", "night", "--batch", "claude")
        assert again.returncode == 1 and "prefect" not in imported
        assert errors(again) == (
            "Error: cannot resume run 'night' with --batch claude: it was started with --batch "
            "gpt, and a resume keeps the run's batch mode. Leave --batch out to resume it as it "
            "started, or start a new run"
        )

        # the plain resume is no config change: it polls the same batch, pays nothing twice
        proc = _start(config, mark, prefect_api, "--resume", "night", *args)
        out = proc.communicate(timeout=300)[0]
        assert proc.returncode == 0, out[-3000:]
        batches, billed = server.get("/_fake/batches"), server.get("/_fake/billed")
        sync = Counter({tuple(k): n for k, n in server.get("/_fake/billed_sync")})
    finally:
        server.stop()
    assert len(batches) == 1 and batches[0]["kind"] == "openai" and batches[0]["n"] == N - 2
    # Every item is paid for; the batch pays each of its lines once and nothing it answered is
    # also called. A synchronous call the SIGKILL cut off in flight (sent: billed; its answer not
    # yet recorded) is called again on the resume: paid twice at most.
    batched = Counter({tuple(k): n - sync[tuple(k)] for k, n in billed})
    assert len(billed) == 2 * N
    assert sorted(batched.values()) == [0] * (N + 2) + [1] * (N - 2)
    assert all(sync[k] == 0 for k, n in batched.items() if n) and max(sync.values()) <= 2
    with Store(db, read_only=True) as store:
        rows = store.query("SELECT candidate, call_mode FROM outcomes WHERE run_id = 'night'")
        status = store.query("SELECT status FROM runs WHERE run_id = 'night'").status[0]
    assert Counter(zip(rows.candidate, rows.call_mode)) == {
        ("gpt", "batch"): N - 2,
        ("gpt", "sync"): 2,
        ("claude", "sync"): N,
    }
    assert status == "completed"
    assert "batch" in out and "full sync night" in out  # the summary's modes table


def test_the_resume_hint_carries_the_batch_option(tmp_path: Path) -> None:
    from routeopt.evals.config import with_batch

    config = project(tmp_path, {"openai": "http://127.0.0.1:9/v1", "anthropic": "http://127.0.0.1:9"})
    cfg = with_batch(load_config(config), ["gpt"])
    hint = resume_hint("eval", cfg, "night", {"candidates": ("gpt",)})
    assert hint.endswith("--candidate gpt --batch gpt")


def test_a_resume_that_switches_a_candidates_mode_is_refused(tmp_path: Path) -> None:
    """Batch mode turned off in the config (or on) since the run started: refused by name."""
    from routeopt.evals.config import with_batch
    from routeopt.evals.storage.store import ResumeConflict

    config = project(tmp_path, {"openai": "http://127.0.0.1:9/v1", "anthropic": "http://127.0.0.1:9"})
    cfg = load_config(config)
    batched = with_batch(cfg, ["gpt"]).candidate("gpt")
    with Store(tmp_path / "o.duckdb") as store:
        store.begin_run("r", candidates=[batched.public_dict(), cfg.candidate("claude").public_dict()])
        store.write_outcomes([_row("gpt"), _row("claude")])
        store.check_resume("r", {"gpt": batched.measured_dict()}, {})
        with pytest.raises(ResumeConflict, match=r"candidate 'gpt': batch mode on -> off since"):
            store.check_resume("r", {"gpt": cfg.candidate("gpt").measured_dict()}, {})
        claude = with_batch(cfg, ["claude"]).candidate("claude")
        with pytest.raises(ResumeConflict, match=r"candidate 'claude': batch mode off -> on since"):
            store.check_resume("r", {"claude": claude.measured_dict()}, {})


def _row(candidate: str):
    from routeopt.evals.storage.store import Outcome

    return Outcome("r", "arith", "v1", "1", candidate, passed=True, response="2")


def _start(config: Path, mark: str, api: str, *args: str) -> subprocess.Popen:  # noqa: F811
    env = {**os.environ, "PREFECT_API_URL": api}
    env.update(PYTHONPATH=str(REPO), PREFECT_LOGGING_LEVEL="WARNING", **{MARK: mark})
    return subprocess.Popen(
        [sys.executable, "-m", "routeopt.flows.cli", "eval", "--config", str(config), *args],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
