"""The nightly flow on a Dask cluster of two worker processes gives the same outcomes as the
default (thread) task runner, then trains and publishes. Workers return rows and get the
training frame from the flow: the flow process is the only one that opens DuckDB."""

from __future__ import annotations

from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import (
    FakeLLM,
    default_answer,
    write_arithmetic_suite,
    write_two_model_config,
)

pytest.importorskip("prefect_dask", reason="install the 'dask' extra: pip install -e '.[dask]'")
pytestmark = pytest.mark.slow

COLUMNS = "suite, suite_version, item_id, candidate, passed, score, response, input_tokens, output_tokens, cost_usd, error_kind"


def _config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM, db: str) -> Path:
    suites = tmp_path / "suites"
    if not suites.exists():
        write_arithmetic_suite(suites, 12, name="arith")
        write_arithmetic_suite(suites, 10, name="arith2", system=None)
    return write_two_model_config(tmp_path / f"{Path(db).stem}.yaml", strong, weak,
                                  key_envs=("OPS_DASK_KEY", "OPS_DASK_KEY"), db=db, out=".")


def _outcomes(db: Path) -> list[tuple]:
    con = duckdb.connect(str(db), read_only=True)
    try:
        return con.execute(f"SELECT {COLUMNS} FROM outcomes ORDER BY suite, item_id, candidate").fetchall()
    finally:
        con.close()


def test_dask_fan_out_matches_the_default_runner(tmp_path: Path, prefect_harness, monkeypatch):
    from distributed import Client, LocalCluster, get_task_stream
    from prefect_dask import DaskTaskRunner

    from flows.nightly import close_store, nightly

    monkeypatch.setenv("OPS_DASK_KEY", "sk-dask-test")
    with FakeLLM() as strong, FakeLLM() as weak:
        weak.answer_fn = lambda p: "0" if int(default_answer(p)) % 2 else default_answer(p)
        plain_cfg = _config(tmp_path, strong, weak, "plain.duckdb")
        dask_cfg = _config(tmp_path, strong, weak, "dask.duckdb")
        nightly(config_path=str(plain_cfg), run_id="r1", train=False, publish=False)
        close_store(tmp_path / "plain.duckdb")

        with LocalCluster(n_workers=2, threads_per_worker=2, processes=True, dashboard_address=None) as cluster, \
                Client(cluster) as client:
            worker_pids = set(client.run(lambda: __import__("os").getpid()).values())
            on_dask = nightly.with_options(task_runner=DaskTaskRunner(address=cluster.scheduler_address))
            with get_task_stream(client) as stream:
                result = on_dask(config_path=str(dask_cfg), run_id="r1", persist_in_tasks=False)
            close_store(tmp_path / "dask.duckdb")
        sent = len(strong.requests) + len(weak.requests)

    assert len(worker_pids) == 2 and __import__("os").getpid() not in worker_pids
    ran_on = {t["worker"] for t in stream.data if "evaluate" in str(t.get("key", ""))}
    assert len(stream.data) >= 4 and ran_on, stream.data[:3]  # the four pairs ran on the workers
    assert sum(p["total"] for p in result["pairs"]) == 2 * (12 + 10)
    # training ran on a worker too, from the frame the flow read (workers cannot open the DB)
    assert result["router_metrics"]["n_requests"] == 22 and result["published"]["version"] == 1
    assert sent == 2 * 2 * (12 + 10)  # each run called every item once
    plain, dask = _outcomes(tmp_path / "plain.duckdb"), _outcomes(tmp_path / "dask.duckdb")
    assert len(plain) == 44 and plain == dask
    assert 0 < sum(1 for r in dask if r[3] == "weak" and r[4]) < 22  # the weak model fails some
