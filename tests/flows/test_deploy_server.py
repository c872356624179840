"""The nightly flow as operations run it: a real `prefect server`, a process worker, a
deployment made by `routeopt deploy`, one run triggered through the API with `run_deployment`.

The candidates are API models served by the local wire-protocol server (tests/fake_llm.py), so
the run is real end to end: SDK calls over HTTP, outcomes in DuckDB, a policy in the registry.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import duckdb
import httpx
import pytest

from tests import REPO
from tests.fake_llm import (
    FakeLLM,
    fails_odd_answers,
    write_arithmetic_suite,
    write_two_model_config,
)

pytestmark = pytest.mark.slow
ITEMS = 24


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _stop(proc: subprocess.Popen) -> None:
    """Stop a process this test started, with its children (its own session)."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.fixture
def server_env(tmp_path: Path) -> Iterator[dict[str, str]]:
    """`prefect server start` on a free port with its own PREFECT_HOME and database."""
    home, port = tmp_path / "prefect-home", _free_port()
    home.mkdir()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_API_URL": f"http://127.0.0.1:{port}/api",
        "PREFECT_API_DATABASE_CONNECTION_URL": f"sqlite+aiosqlite:///{home}/prefect.db",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
        "PREFECT_LOGGING_LEVEL": "WARNING",
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PYTHONPATH": str(REPO),
    }
    log = (tmp_path / "server.log").open("w")
    proc = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/api/health", timeout=2).json() is True:
                    break
            except (httpx.HTTPError, ValueError):
                pass
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"prefect server did not start:\n{(tmp_path / 'server.log').read_text()[-3000:]}")
            time.sleep(0.5)
        yield env
    finally:
        _stop(proc)
        log.close()


def _config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM) -> Path:
    write_arithmetic_suite(tmp_path / "suites", ITEMS, name="arith")
    return write_two_model_config(
        tmp_path / "routeopt.yaml",
        strong,
        weak,
        key_envs=("OPS_STRONG_KEY", "OPS_WEAK_KEY"),
        weak_protocol="openai",
        router={"quality_target": 0.9, "holdout_fraction": 0.3},
    )


def test_deployed_nightly_runs_on_a_process_worker(tmp_path: Path, server_env: dict[str, str]):
    from prefect.client.orchestration import get_client
    from prefect.deployments import run_deployment
    from prefect.settings import PREFECT_API_URL, temporary_settings

    env = {**server_env, "OPS_STRONG_KEY": "sk-ops-strong", "OPS_WEAK_KEY": "sk-ops-weak"}
    with FakeLLM() as strong, FakeLLM() as weak:
        weak.answer_fn = fails_odd_answers
        config = _config(tmp_path, strong, weak)
        deploy = subprocess.run(
            [
                sys.executable,
                "-m",
                "routeopt.flows.cli",
                "deploy",
                "--config",
                str(config),
                "--pool",
                "ops-test",
                "--name",
                "it",
                "--cron",
                "30 3 * * *",
            ],
            env=env,
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert deploy.returncode == 0, deploy.stdout + deploy.stderr
        assert "deployed routeopt-nightly/it" in deploy.stdout
        worker_log = (tmp_path / "worker.log").open("w")
        worker = subprocess.Popen(
            ["prefect", "worker", "start", "--pool", "ops-test", "--type", "process", "--limit", "1"],
            env=env,
            cwd=tmp_path,
            stdout=worker_log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            with temporary_settings(updates={PREFECT_API_URL: server_env["PREFECT_API_URL"]}):
                with get_client(sync_client=True) as client:
                    dep = client.read_deployment_by_name("routeopt-nightly/it")
                flow_run = run_deployment(
                    "routeopt-nightly/it", parameters={"run_id": "deployed-1"}, timeout=150, poll_interval=2
                )
        finally:
            _stop(worker)
            worker_log.close()
        sent_strong, sent_weak = len(strong.requests), len(weak.requests)
    logs = (tmp_path / "worker.log").read_text()[-4000:]
    assert flow_run.state is not None and flow_run.state.is_completed(), f"{flow_run.state}\n{logs}"

    assert dep.work_pool_name == "ops-test"
    assert dep.global_concurrency_limit is not None and dep.global_concurrency_limit.limit == 1
    assert dep.parameters["config_path"] == str(config)
    assert [s.schedule.cron for s in dep.schedules] == ["30 3 * * *"]
    assert dep.schedules[0].schedule.timezone == "UTC"

    assert sent_strong == sent_weak == ITEMS + 1  # each item, and a preflight probe
    con = duckdb.connect(str(tmp_path / "out" / "routeopt.duckdb"), read_only=True)
    try:
        rows = con.execute(
            "SELECT candidate, count(*), sum(CASE WHEN passed THEN 1 ELSE 0 END) FROM outcomes "
            "WHERE run_id = 'deployed-1' GROUP BY candidate ORDER BY candidate"
        ).fetchall()
        status = con.execute("SELECT status FROM runs WHERE run_id = 'deployed-1'").fetchall()
    finally:
        con.close()
    assert rows == [("strong", ITEMS, ITEMS), ("weak", ITEMS, ITEMS // 2)]
    assert status == [("completed",)]
    manifests = list((tmp_path / "out" / "registry").rglob("manifest.json"))
    assert len(manifests) == 1
    manifest = json.loads(manifests[0].read_text())
    assert manifest["lineage"]["runs"] == ["deployed-1"]
    assert set(manifest["policy"].get("candidates", ["strong", "weak"])) == {"strong", "weak"}
