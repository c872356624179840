"""The nightly flow end to end on API candidates served by the local wire-protocol server."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config


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


def test_nightly_evaluates_trains_publishes_and_resumes(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.nightly import close_store, nightly

    monkeypatch.setenv("STRONG_KEY", "sk-strong-planted-secret")
    monkeypatch.setenv("WEAK_KEY", "sk-weak-planted-secret")
    strong, weak = two_servers
    config = _config(tmp_path, strong, weak)
    result = nightly(config_path=str(config), run_id="night-1")
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
    assert "sk-strong-planted-secret" not in db.read_bytes().decode("latin-1")

    (tmp_path / "metrics.json").write_text(json.dumps(result["router_metrics"], indent=1))
    published = Path(result["published"]["uri"])
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


def test_a_write_that_fails_fails_the_run_and_the_resume_completes_it(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The store refuses the weak candidate's first batch and its retry (a full disk): the run
    fails naming the pair and is not marked completed, although later writes would go through;
    with the store working, the same run id finishes every item."""
    from evals.execution.runner import _Flusher
    from evals.storage.store import Store
    from flows.nightly import RunIncomplete, close_store, nightly, shared_store

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
    counts = dict(store.query("SELECT candidate, count(*) AS n FROM outcomes GROUP BY candidate")
                  .itertuples(index=False, name=None))
    assert status == ["failed"] and counts["strong"] == 70 and counts.get("weak", 0) < 70

    monkeypatch.setattr(Store, "write_outcomes", write)
    nightly(config_path=str(config), run_id="night-w", train=False, publish=False)
    store = shared_store(db)
    status = store.query("SELECT status FROM runs WHERE run_id = 'night-w'").status.tolist()
    n, distinct = store.query("SELECT count(*) AS n, count(DISTINCT (suite, item_id, candidate)) AS d "
                              "FROM outcomes").iloc[0]
    close_store(db)
    assert status == ["completed"] and n == distinct == 140


def test_a_refused_key_is_named_in_the_summary_and_only_its_candidate_stops(
    tmp_path: Path, two_servers, prefect_harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from click.testing import CliRunner

    from flows.cli import cli
    from flows.nightly import close_store

    strong, weak = two_servers
    monkeypatch.setenv("STRONG_KEY", "sk-strong")
    monkeypatch.setenv("WEAK_KEY", "sk-weak-revoked-0123456789")
    weak.expect_api_key = "sk-weak-current"
    config = _config(tmp_path, strong, weak)
    res = CliRunner().invoke(cli, ["eval", "--config", str(config), "--no-progress", "--run-id", "night-k"])
    close_store(tmp_path / "out" / "routeopt.duckdb")
    out = " ".join(res.output.split())
    assert "candidate weak stopped calling" in out and "fix $WEAK_KEY and resume the run" in out, out
    assert "0123456789" not in res.output
    assert len(strong.requests) == 70 and len(weak.requests) <= 2 * 8  # one wave per suite
