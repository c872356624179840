"""The nightly flow end to end on API candidates served by the local wire-protocol server."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path
from typing import Callable

import duckdb
import pytest
from click.testing import CliRunner, Result

from tests.fake_llm import (
    FakeLLM,
    FaultPlan,
    fails_odd_answers,
    write_arithmetic_suite,
    write_two_model_config,
)
from tests.leaks import every_log_record, hits_under

SECRETS = ("sk-strong-planted-secret", "sk-weak-planted-secret")


@pytest.fixture
def two_servers():
    """A 'strong' model that answers everything and a 'weak' one that fails odd answers."""
    with FakeLLM() as strong, FakeLLM() as weak:
        weak.answer_fn = fails_odd_answers
        yield strong, weak


def _config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM) -> Path:
    suites = tmp_path / "suites"
    write_arithmetic_suite(suites, 40, name="arith")
    write_arithmetic_suite(suites, 30, name="arith2", system=None)
    path = write_two_model_config(
        tmp_path / "routeopt.yaml",
        strong,
        weak,
        key_envs=("STRONG_KEY", "WEAK_KEY"),
        router={"quality_target": 1.0, "holdout_fraction": 0.3},
    )
    # the fake servers answer in milliseconds: their latency moves with the machine's load
    cfg = json.loads(path.read_text())
    cfg["alerts"] = {"latency_p95_increase_pct": 10_000, "ttft_p95_increase_pct": 10_000}
    path.write_text(json.dumps(cfg))
    return path


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


def _assert_keys_reached_the_servers_and_nothing_else(tmp_path, strong, weak, log: str, flow_run_id) -> None:
    """The planted keys were sent (in the auth header of every call) and are in none of the
    outputs: DuckDB (SQL over every column), the response cache, the HTML report, the policy
    files and manifests, the signing key folder, a Parquet export, the logs, Prefect's logs and
    artifacts, and every record logged at DEBUG. Each search is shown to see its content (it
    finds a known string)."""
    from routeopt.evals.storage.export import export_parquet
    from routeopt.flows.nightly import close_store, shared_store

    sent = {
        r.headers.get("x-api-key") or r.headers["authorization"].removeprefix("Bearer ")
        for r in strong.requests + weak.requests
    }
    assert sent == set(SECRETS)
    db = tmp_path / "out" / "routeopt.duckdb"
    export_parquet(shared_store(db), tmp_path / "out" / "export")
    close_store(db)
    logs, artifacts = _prefect_records(flow_run_id)
    outputs = [tmp_path / "out", tmp_path / ".routeopt"]
    assert {"registry", "cache", "reports", "export", "routeopt.duckdb"} <= {
        p.name for p in outputs[0].iterdir()
    }
    for secret in SECRETS:
        assert hits_under(outputs, secret) == []
        assert secret not in log and not [m for m in logs + artifacts if secret in m]
    found = hits_under(outputs, "q00001")  # an item id: in the store and in the export
    assert any(".duckdb:" in h for h in found) and any(".parquet:" in h for h in found), found
    assert hits_under([tmp_path / "out" / "cache"], '"finish_reason"')  # answers, in the cache
    assert hits_under([tmp_path / "out" / "registry"], "strong") and hits_under(
        [tmp_path / "out" / "reports"], "strong"
    )
    assert any("created the policy signing key" in m for m in logs), logs[-20:]
    assert artifacts
    assert "champion moved" in log and "chat/completions" in log  # the flow's and the SDKs' records


def test_nightly_evaluates_trains_publishes_and_resumes(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routeopt.artifacts.serving.loader import load
    from routeopt.flows.nightly import close_store, nightly

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

    assert result.suite_errors == {}
    assert set(result.suites) == {"arith", "arith2"}
    assert len(strong.requests) == 70 + 1 and len(weak.requests) == 70 + 1  # + its preflight probe
    assert result.preflight and {p["verdict"] for p in result.preflight} == {"ok"}
    con = duckdb.connect(str(db), read_only=True)
    n, distinct, passed_weak = con.execute(
        "SELECT count(*), count(DISTINCT (suite, item_id, candidate)), "
        "sum(CASE WHEN candidate = 'weak' AND passed THEN 1 ELSE 0 END) FROM outcomes"
    ).fetchone()
    assert n == distinct == 140
    assert 0 < passed_weak < 70  # the weak model really fails some items
    con.close()
    _assert_keys_reached_the_servers_and_nothing_else(
        tmp_path, strong, weak, "\n".join(records), state.state_details.flow_run_id
    )

    # Signed with a key made on first use, beside the config; a verifying gateway loads it.
    keys = tmp_path / ".routeopt" / "keys"
    assert stat.S_IMODE((keys / "signing_key.pem").stat().st_mode) == 0o600
    assert stat.S_IMODE((keys / "public_key.pem").stat().st_mode) == 0o644
    assert result.published["signed"] and result.published["public_key"] == str(keys / "public_key.pem")
    published = Path(result.published["uri"])
    assert (published / "manifest.sig").exists()
    gateway = load(tmp_path / "out" / "registry", keys / "public_key.pem")
    assert gateway.status().signed and gateway.status().channel == "champion" and gateway.version == 1
    manifest = json.loads((published / "manifest.json").read_text())
    assert manifest["lineage"]["runs"] == ["night-1"]
    assert set(manifest["lineage"]["suites"]) == {"arith", "arith2"}
    assert result.promotion["promoted"] and result.promotion["reason"] == "no champion yet"
    assert stat.S_IMODE(Path(result.report_path).stat().st_mode) == 0o644  # meant to be shared

    # A second night measures the models again (API aliases change behind the same name, and a
    # replayed answer says nothing about tonight), and the new policy is compared with the
    # champion on the same held-out items.
    second = nightly(config_path=str(config), run_id="night-2")
    close_store(db)
    assert len(strong.requests) == 142 and len(weak.requests) == 142
    assert second.published["version"] == 2
    assert second.promotion["champion"], second.promotion
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM outcomes WHERE cached").fetchone()[0] == 0
    con.close()

    # Resuming a run calls nothing again (but the probe) and duplicates nothing.
    nightly(config_path=str(config), run_id="night-1", train=False, publish=False)
    close_store(db)
    assert len(strong.requests) == 143 and len(weak.requests) == 143
    con = duckdb.connect(str(db), read_only=True)
    assert con.execute("SELECT count(*) FROM outcomes WHERE run_id = 'night-1'").fetchone()[0] == 140
    con.close()


class _TruncatesHardItems(FaultPlan):
    """Every attempt at every third item ends in a truncated stream (spread out, so that the
    endpoint's circuit breaker never sees ten failures in a row)."""

    def choose(self, prompt: str, attempt: int) -> str | None:
        m = re.search(r"What is (\d+)", prompt)
        return "truncated" if m and int(m.group(1)) % 3 == 0 else None


def _cli(*args: str) -> Result:
    from routeopt.flows.cli import cli

    return CliRunner().invoke(cli, list(args), catch_exceptions=False)  # piped: no terminal width


def _edit(config: Path, change: Callable[[dict], None]) -> None:
    cfg = json.loads(config.read_text())
    change(cfg)
    config.write_text(json.dumps(cfg))


def test_summary_counts_the_candidates_errors_and_says_what_it_left_out(
    tmp_path: Path, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPS_LABEL_KEY", "sk-label-test")
    write_arithmetic_suite(tmp_path / "suites", 30, name="arith")
    with FakeLLM() as strong, FakeLLM() as weak:
        weak.faults = _TruncatesHardItems()
        config = write_two_model_config(
            tmp_path / "routeopt.yaml",
            strong,
            weak,
            key_envs=("OPS_LABEL_KEY", "OPS_LABEL_KEY"),
            weak_protocol="openai",
        )

        def limits(cfg: dict) -> None:
            cfg["candidates"][1]["max_retries"] = 1
            cfg["budget"] = {"per_candidate_usd": {"strong": 0.002}}

        _edit(config, limits)
        res = _cli("eval", "--config", str(config), "--run-id", "e1")
        assert res.exit_code == 0, res.output
        answered = len(strong.requests) - 1  # its preflight probe aside
    skipped = 30 - answered
    assert 0 < skipped < 30
    # weak: the 10 truncated items are failures (20 of 30 pass); strong: the items the spend
    # cap kept from it are left out, so its pass rate is over the items it answered
    assert re.search(r"weak\W+30\W+10\W+0\W+0\.667\W", res.output), res.output
    assert re.search(rf"strong\W+30\W+0\W+{skipped}\W+1\.000\W", res.output), res.output
    assert (
        f"{skipped} rows excluded from pass rates (errors on our side): budget {skipped} "
        "(a spend cap stopped the call)"
    ) in res.output
    assert "…" not in res.output  # piped into a log, the tables are not cut to 80 columns


def test_cache_is_opt_in_and_a_changed_resume_is_refused(
    tmp_path: Path, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OPS_LABEL_KEY", "sk-label-test")
    suites = tmp_path / "suites"
    write_arithmetic_suite(suites, 20, name="arith")
    with FakeLLM() as strong, FakeLLM() as weak:
        config = write_two_model_config(
            tmp_path / "routeopt.yaml", strong, weak, key_envs=("OPS_LABEL_KEY", "OPS_LABEL_KEY")
        )
        calls = lambda: len(strong.requests) + len(weak.requests)  # noqa: E731
        assert _cli("eval", "--config", str(config), "--run-id", "e1").exit_code == 0
        assert calls() == 40 + 2  # every item, and each candidate's preflight probe
        second = _cli("eval", "--config", str(config), "--run-id", "e2")
        assert second.exit_code == 0 and calls() == 84, second.output  # a new run measures the models again
        assert "response cache" not in second.output
        dev = _cli("eval", "--config", str(config), "--run-id", "e3", "--cache")
        assert dev.exit_code == 0 and calls() == 86  # opted in: replayed (the probes are not)
        # 20 replayed rows: in the pass rate, not in cost or times (no call of this run has any)
        assert re.search(r"strong\W+20\W+0\W+0\W+1\.000\W+20\W+-\W+-\W+-\W+-\W", dev.output), dev.output
        assert (
            "response cache: 40 answers replayed from earlier runs (at most 1d old); they "
            "count in pass rates, not in cost or latency"
        ) in dev.output
        bad_age = _cli("eval", "--config", str(config), "--run-id", "e4", "--cache-max-age", "soon")
        assert bad_age.exit_code == 2 and "give a number and a unit" in bad_age.output

        # resuming e1: pacing may change, what the models answer may not
        _edit(config, lambda cfg: cfg["candidates"][0].update(max_concurrency=2))
        assert _cli("eval", "--config", str(config), "--resume", "e1").exit_code == 0
        assert calls() == 88  # nothing left to call but the probes
        _edit(config, lambda cfg: cfg["candidates"][1].update(model="small-2"))
        (suites / "arith.yaml").write_text(
            (suites / "arith.yaml").read_text().replace("number only", "digits only")
        )
        refused = _cli("eval", "--config", str(config), "--resume", "e1")
        assert calls() == 88  # refused before anything was sent
    assert refused.exit_code == 1
    # what the run did so far, then the one sentence that says why it cannot go on
    assert re.search(r"strong\W+20\W+0\W+0\W+1\.000\W", refused.output), refused.output
    assert "Traceback" not in refused.output
    out = " ".join(refused.output.split())
    assert (
        "Error: cannot resume run 'e1': candidate 'weak': model 'small' -> 'small-2'; suite 'arith': version"
        in out
    )
    assert "Start a new run instead (run again without --run-id, or with a new one)" in out


def test_split_deployments_train_on_the_whole_fleet_and_do_not_fight(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two deployments over disjoint candidate subsets run on alternate nights. Each trains on
    the latest outcomes of every candidate, so the champion routes over the whole fleet and
    does not flip from one subset to the other every night."""
    from routeopt.artifacts.publish.promotion import champion_policy
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("OPS_SPLIT_KEY", "sk-split-test")
    good, bad = two_servers
    write_arithmetic_suite(tmp_path / "suites", 30, name="arith")
    price = {"big": (10.0, 30.0), "small": (0.5, 1.5)}
    candidates = [
        {
            "name": f"{pool}-{size}",
            "provider": "openai",
            "model": f"{size}-{pool}",
            "base_url": (good if size == "big" else bad).openai_base_url,
            "api_key_env": "OPS_SPLIT_KEY",
            "input_price_per_mtok": price[size][0] * k,
            "output_price_per_mtok": price[size][1] * k,
        }
        for pool, k in (("a", 1.0), ("b", 0.8))
        for size in ("big", "small")
    ]
    config = tmp_path / "routeopt.yaml"
    config.write_text(
        json.dumps(
            {
                "candidates": candidates,
                "suites_dir": "suites",
                "db_path": "out/db.duckdb",
                "registry_dir": "out/registry",
                "cache_dir": "out/cache",
                "alerts": {"latency_p95_increase_pct": 10_000, "ttft_p95_increase_pct": 10_000},
            }
        )
    )
    pools = {"a": ["a-big", "a-small"], "b": ["b-big", "b-small"]}
    champions, decisions = [], []
    for night, pool in enumerate("aba", start=1):
        result = nightly(config_path=str(config), run_id=f"n{night}-{pool}", candidates=pools[pool])
        close_store(tmp_path / "out" / "db.duckdb")
        decisions.append(result.promotion)
        champion, _ = champion_policy(tmp_path / "out" / "registry", Path(result.published["public_key"]))
        champions.append(sorted(champion.candidates))
    fleet = sorted(c["name"] for c in candidates)
    assert champions == [pools["a"], fleet, fleet], (champions, decisions)
    for d in decisions[1:]:  # the champion was scored on outcomes of the candidates it picks
        assert d["champion"]["pass_rate"] >= d["new"]["pass_rate"] - 0.05, d
    manifest = json.loads((Path(result.published["uri"]) / "manifest.json").read_text())
    assert manifest["lineage"]["runs"] == ["n3-a"]
    assert manifest["lineage"]["outcome_runs"] == ["n2-b", "n3-a"]


def test_a_write_that_fails_fails_the_run_and_the_resume_completes_it(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the weak candidate's first batch and its retry (a full disk): the run
    fails naming the pair and is not marked completed, although later writes would go through;
    with the store working, the same run id finishes every item."""
    from routeopt.evals.execution.runner import _Flusher
    from routeopt.evals.storage.store import Store
    from routeopt.flows.nightly import RunIncomplete, close_store, nightly, shared_store

    monkeypatch.setenv("STRONG_KEY", "sk-strong")
    monkeypatch.setenv("WEAK_KEY", "sk-weak")
    monkeypatch.setattr(_Flusher, "RETRY_DELAYS_S", (0.0,), raising=False)
    strong, weak = two_servers
    weak.first_token_delay_s = 0.1  # several batches, flushed every half second
    config = _config(tmp_path, strong, weak)
    db = tmp_path / "out" / "routeopt.duckdb"
    write = Store.write_outcomes
    refused: set[tuple[str, str]] = set()  # the first weak batch, refused twice
    tries = [0]

    def full_disk(self, outcomes):
        outcomes = list(outcomes)
        weak_rows = {(o.suite, o.item_id) for o in outcomes if o.candidate == "weak"}
        if weak_rows and tries[0] < 2 and (not refused or weak_rows & refused):
            refused.update(weak_rows)
            tries[0] += 1
            raise duckdb.IOException("IO Error: No space left on device")
        return write(self, outcomes)

    monkeypatch.setattr(Store, "write_outcomes", full_disk)
    with pytest.raises(RunIncomplete, match=r"run night-w is not complete: FlushError: arith.? x weak"):
        nightly(config_path=str(config), run_id="night-w", train=False, publish=False)
    store = shared_store(db)
    status = store.query("SELECT status FROM runs WHERE run_id = 'night-w'").status.tolist()
    counts = dict(
        store.query("SELECT candidate, count(*) AS n FROM outcomes GROUP BY candidate").itertuples(
            index=False, name=None
        )
    )
    assert status == ["failed"] and counts["strong"] == 70 and counts.get("weak", 0) < 70

    monkeypatch.setattr(Store, "write_outcomes", write)
    nightly(config_path=str(config), run_id="night-w", train=False, publish=False)
    store = shared_store(db)
    status = store.query("SELECT status FROM runs WHERE run_id = 'night-w'").status.tolist()
    n, distinct = store.query(
        "SELECT count(*) AS n, count(DISTINCT (suite, item_id, candidate)) AS d FROM outcomes"
    ).iloc[0]
    close_store(db)
    assert status == ["completed"] and n == distinct == 140


def test_a_refused_key_stops_the_run_at_its_preflight_or_its_candidate_mid_run(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from routeopt.flows.cli import cli
    from routeopt.flows.nightly import close_store

    strong, weak = two_servers
    monkeypatch.setenv("STRONG_KEY", "sk-strong")
    monkeypatch.setenv("WEAK_KEY", "sk-weak-revoked-0123456789")
    weak.expect_api_key = "sk-weak-current"
    config = _config(tmp_path, strong, weak)
    db = tmp_path / "out" / "routeopt.duckdb"
    # the preflight names it before any suite runs, and nothing is evaluated
    stopped = CliRunner().invoke(
        cli, ["eval", "--config", str(config), "--no-progress", "--run-id", "night-p"]
    )
    assert stopped.exit_code == 1
    out = " ".join(stopped.output.split())
    assert (
        f"preflight: candidate weak ({weak.anthropic_base_url}): HTTP 401: Incorrect API key "
        f"provided: [redacted] [authentication_error] (POST {weak.anthropic_base_url}/v1/messages)"
    ) in out, out
    assert "preflight failed for weak: nothing was evaluated" in out
    assert len(strong.requests) == len(weak.requests) == 1  # the probes only
    with duckdb.connect(str(db), read_only=True) as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone() == (0,)
        probes = con.execute("SELECT candidate, verdict, status FROM preflight ORDER BY 1").fetchall()
    assert probes == [("strong", "ok", None), ("weak", "broken", 401)]

    # without one, its candidate stops calling at its first refusal, and the run says so
    res = CliRunner().invoke(
        cli, ["eval", "--config", str(config), "--no-progress", "--run-id", "night-k", "--no-preflight"]
    )
    close_store(db)
    out = " ".join(res.output.split())
    assert res.exit_code == 1
    assert "candidate weak stopped calling" in out and "fix $WEAK_KEY and resume the run" in out, out
    assert (
        f"Error: weak stopped calling when the API key was refused; fix the key, then resume with: "
        f"routeopt eval --resume night-k --config {config.resolve()} --no-preflight"
    ) in out
    assert "0123456789" not in res.output + stopped.output
    assert len(strong.requests) == 71 and len(weak.requests) <= 1 + 2 * 8  # one wave per suite


def test_the_flow_stops_on_a_failed_preflight_and_publishes_only_when_told_to_skip(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A deployment runs the flow without the CLI: the flow probes, and a broken candidate stops
    it before any suite; with skip_broken it runs and publishes without that candidate."""
    from routeopt.evals.execution.preflight import PreflightFailed
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("STRONG_KEY", "sk-strong")
    monkeypatch.setenv("WEAK_KEY", "sk-weak")
    strong, weak = two_servers
    config = _config(tmp_path, strong, weak)
    _edit(config, lambda cfg: cfg["candidates"][1].update(base_url=weak.url + "/wrong"))
    db, registry = tmp_path / "out" / "routeopt.duckdb", tmp_path / "out" / "registry"
    with pytest.raises(PreflightFailed, match="preflight failed for weak: nothing was evaluated"):
        nightly(config_path=str(config), run_id="p1")
    # the probes only: weak's went to a path the server does not have (it records no request)
    assert not registry.exists() and len(strong.requests) == 1 and weak.requests == []
    result = nightly(config_path=str(config), run_id="p2", skip_broken=True)
    close_store(db)
    assert result.skipped == ["weak"] and result.published["version"] == 1
    manifest = json.loads((Path(result.published["uri"]) / "policy.json").read_text())
    assert manifest["candidates"] == ["strong"]
    assert weak.requests == []  # none of its items were called
    with duckdb.connect(str(db), read_only=True) as con:
        probes = con.execute(
            "SELECT run_id, candidate, verdict, status FROM preflight ORDER BY ALL"
        ).fetchall()
    assert probes == [
        ("p1", "strong", "ok", None),
        ("p1", "weak", "broken", 404),
        ("p2", "strong", "ok", None),
        ("p2", "weak", "broken", 404),
    ]
