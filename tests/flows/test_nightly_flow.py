"""The nightly flow end to end on API candidates served by the local wire-protocol server."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config
from tests.leaks import every_log_record, hits_under

SECRETS = ("sk-strong-planted-secret", "sk-weak-planted-secret")


@pytest.fixture
def two_servers():
    """A 'strong' model that answers everything and a 'weak' one that fails odd answers."""
    with FakeLLM() as strong, FakeLLM() as weak:
        from tests.fake_llm import default_answer

        weak.answer_fn = lambda p: "0" if int(default_answer(p)) % 2 else default_answer(p)
        yield strong, weak


def _config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM) -> Path:
    suites = tmp_path / "suites"
    write_arithmetic_suite(suites, 40, name="arith")
    write_arithmetic_suite(suites, 30, name="arith2", system=None)
    return write_two_model_config(tmp_path / "routeopt.yaml", strong, weak,
                                  key_envs=("STRONG_KEY", "WEAK_KEY"),
                                  router={"quality_target": 1.0, "holdout_fraction": 0.3})


def _prefect_records(flow_run_id) -> tuple[list[str], list[str]]:
    """What the Prefect API holds for a flow run: its log messages and its artifacts."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId, LogFilter, LogFilterFlowRunId
    from prefect.logging.handlers import APILogHandler

    APILogHandler().flush()  # logs go to the API in batches: send what is queued first
    with get_client(sync_client=True) as client:
        logs = client.read_logs(log_filter=LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        arts = client.read_artifacts(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run_id])))
    return [log.message for log in logs], [json.dumps(a.data, default=str) for a in arts]


def _assert_keys_reached_the_servers_and_nothing_else(tmp_path, strong, weak, log: str,
                                                      flow_run_id) -> None:
    """The planted keys were sent (in the auth header of every call) and are in none of the
    outputs: DuckDB (SQL over every column), the response cache, the HTML report, the policy
    files and manifests, the signing key folder, a Parquet export, the logs, Prefect's logs and
    artifacts, and every record logged at DEBUG. Each search is shown to see its content (it
    finds a known string)."""
    from flows.export import export_parquet
    from flows.nightly import shared_store, close_store

    sent = {r.headers.get("x-api-key") or r.headers["authorization"].removeprefix("Bearer ")
            for r in strong.requests + weak.requests}
    assert sent == set(SECRETS)
    db = tmp_path / "out" / "routeopt.duckdb"
    export_parquet(shared_store(db), tmp_path / "out" / "export")
    close_store(db)
    logs, artifacts = _prefect_records(flow_run_id)
    outputs = [tmp_path / "out", tmp_path / ".routeopt"]
    assert {"registry", "cache", "reports", "export", "routeopt.duckdb"} <= {p.name for p in outputs[0].iterdir()}
    for secret in SECRETS:
        assert hits_under(outputs, secret) == []
        assert secret not in log and not [m for m in logs + artifacts if secret in m]
    found = hits_under(outputs, "q00001")  # an item id: in the store and in the export
    assert any(".duckdb:" in h for h in found) and any(".parquet:" in h for h in found), found
    assert hits_under([tmp_path / "out" / "cache"], '"finish_reason"')  # answers, in the cache
    assert hits_under([tmp_path / "out" / "registry"], "strong") and hits_under([tmp_path / "out" / "reports"], "strong")
    assert any("created the policy signing key" in m for m in logs), logs[-20:]
    assert artifacts
    assert "champion moved" in log and "chat/completions" in log  # the flow's and the SDKs' records


def test_nightly_evaluates_trains_publishes_and_resumes(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from artifacts.runtime import load
    from flows.nightly import close_store, nightly

    monkeypatch.setenv("STRONG_KEY", SECRETS[0])
    monkeypatch.setenv("WEAK_KEY", SECRETS[1])
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    strong, weak = two_servers
    config = _config(tmp_path, strong, weak)
    with every_log_record() as records:
        state = nightly(config_path=str(config), run_id="night-1", return_state=True)
    result = state.result()
    db = tmp_path / "out" / "routeopt.duckdb"
    close_store(db)

    assert result["suite_errors"] == {}
    assert set(result["suites"]) == {"arith", "arith2"}
    assert len(strong.requests) == 70 and len(weak.requests) == 70
    con = duckdb.connect(str(db), read_only=True)
    n, distinct, passed_weak = con.execute(
        "SELECT count(*), count(DISTINCT (suite, item_id, candidate)), "
        "sum(CASE WHEN candidate = 'weak' AND passed THEN 1 ELSE 0 END) FROM outcomes"
    ).fetchone()
    assert n == distinct == 140
    assert 0 < passed_weak < 70  # the weak model really fails some items
    con.close()
    _assert_keys_reached_the_servers_and_nothing_else(tmp_path, strong, weak, "\n".join(records),
                                                      state.state_details.flow_run_id)

    # Signed with a key made on first use, beside the config; a verifying gateway loads it.
    keys = tmp_path / ".routeopt" / "keys"
    assert stat.S_IMODE((keys / "signing_key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "public_key.pem").stat().st_mode) == 0o644
    assert result["published"]["signed"] and result["published"]["public_key"] == str(keys / "public_key.pem")
    published = Path(result["published"]["uri"])
    assert (published / "manifest.sig").exists()
    gateway = load(tmp_path / "out" / "registry", keys / "public_key.pem")
    assert gateway.status().signed and gateway.status().channel == "champion" and gateway.version == 1
    manifest = json.loads((published / "manifest.json").read_text())
    assert manifest["lineage"]["runs"] == ["night-1"]
    assert set(manifest["lineage"]["suites"]) == {"arith", "arith2"}
    assert result["promotion"]["promoted"] and result["promotion"]["reason"] == "no champion yet"
    assert Path(result["report_path"]).exists()

    # A second night on the same outcomes: answers come from the response cache (nothing is
    # paid twice), and the new policy is compared with the champion on the same held-out items.
    second = nightly(config_path=str(config), run_id="night-2")
    close_store(db)
    assert len(strong.requests) == 70 and len(weak.requests) == 70
    assert second["published"]["version"] == 2
    assert second["promotion"]["champion"], second["promotion"]

    # Resuming a run calls nothing again and duplicates nothing, even without the cache.
    nightly(config_path=str(config), run_id="night-1", train=False, publish=False, use_cache=False)
    close_store(db)
    assert len(strong.requests) == 70 and len(weak.requests) == 70
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM outcomes WHERE run_id = 'night-1'").fetchone()[0] == 140
    con.close()
