from __future__ import annotations

from pathlib import Path

import pytest

from routeopt.evals.storage.store import Outcome, Store


def _outcome(item: str, cand: str = "m", passed: bool = True, run: str = "r1") -> Outcome:
    return Outcome(
        run_id=run,
        suite="s",
        suite_version="v1",
        item_id=item,
        candidate=cand,
        passed=passed,
        score=1.0 if passed else 0.0,
        cost_usd=0.001,
        latency_s=0.2,
    )


@pytest.fixture
def store(tmp_path: Path) -> Store:
    s = Store(tmp_path / "db" / "x.duckdb")
    s.begin_run("r1", candidates=[{"name": "m", "provider": "openai", "model": "gpt"}])
    s.register_suite("s", "v1", {"name": "s"}, [("1", "p1", {"a": 1}), ("2", "p2", {"a": 2})])
    yield s
    s.close()


def test_writes_are_idempotent(store: Store) -> None:
    store.write_outcomes([_outcome("1"), _outcome("2", passed=False)])
    store.write_outcomes([_outcome("1", passed=False), _outcome("2")])  # a repeat keeps the first
    df = store.query("SELECT item_id, passed FROM outcomes ORDER BY item_id")
    assert df.to_dict("records") == [{"item_id": "1", "passed": True}, {"item_id": "2", "passed": False}]


def test_done_items_and_training_frame(store: Store) -> None:
    store.write_outcomes([_outcome("1"), Outcome("r1", "s", "v1", "2", "m", error_kind="budget", error="x")])
    assert store.done_items("r1", "s", "m") == {"1"}  # a budget skip is retried on resume
    frame = store.training_frame()
    assert list(frame["request_id"]) == ["s/1"]  # a budget skip says nothing about the model
    assert list(frame["prompt"]) == ["p1"]


CANDIDATE_FAILURES = (
    "timeout",
    "truncated_stream",
    "client_error",
    "server_error",
    "bad_response",
    "rate_limited",
    "connection",
    "empty_content",
)


OUR_ERRORS = ("budget", "circuit_open", "auth", "config", "internal", "grader_error", "cancelled")


def test_the_candidates_errors_are_failures_and_ours_are_excluded(tmp_path: Path) -> None:
    """A model that times out on the hard items must not look better than it is."""
    kinds = [None, *CANDIDATE_FAILURES, *OUR_ERRORS]
    with Store(tmp_path / "x.duckdb") as store:
        store.begin_run("r1")
        store.register_suite("s", "v1", {}, [(str(i), f"p{i}", {}) for i in range(len(kinds))])
        store.write_outcomes(
            [
                Outcome(
                    "r1",
                    "s",
                    "v1",
                    str(i),
                    "m",
                    error_kind=k,
                    error=k,
                    passed=True if k is None else None,
                    score=1.0 if k is None else None,
                    cost_usd=0.004 if k is None else (0.002 if k == "timeout" else None),
                )
                for i, k in enumerate(kinds)
            ]
        )
        frame = store.training_frame().set_index("item_id")
    labelled = {str(i) for i, k in enumerate(kinds) if k is None or k in CANDIDATE_FAILURES}
    assert set(frame.index) == labelled
    failed = frame[frame.error_kind.notna()]
    assert set(failed.error_kind) == set(CANDIDATE_FAILURES)
    assert (~failed.passed.astype(bool)).all() and (failed.score == 0).all()
    assert bool(frame.loc["0", "passed"]) and frame.loc["0", "score"] == 1.0
    # a failed call's recorded cost is kept; one without gets the mean of the others
    assert frame.loc["1", "cost_usd"] == 0.002
    assert frame.loc["2", "cost_usd"] == pytest.approx((0.004 + 0.002) / 2)


def _night(
    store: Store,
    run_id: str,
    day: int,
    results: dict[str, list[bool]],
    *,
    version: str = "v1",
    status: str = "completed",
) -> None:
    from datetime import datetime, timedelta, timezone

    store.begin_run(run_id)
    when = datetime(2026, 3, 1, tzinfo=timezone.utc) + timedelta(days=day)
    store._write("UPDATE runs SET started_at = ? WHERE run_id = ?", [(when, run_id)])
    store.register_suite("s", version, {}, [(str(i), f"p{i}", {}) for i in range(3)])
    store.write_outcomes(
        [
            Outcome(run_id, "s", version, str(i), cand, passed=ok, score=float(ok), cost_usd=0.001)
            for cand, oks in results.items()
            for i, ok in enumerate(oks)
        ]
    )
    store.finish_run(run_id, status)


def test_latest_frame_takes_each_candidates_latest_run(tmp_path: Path) -> None:
    """Deployments over different candidate subsets: each run trains on the whole fleet."""
    with Store(tmp_path / "x.duckdb") as store:
        _night(store, "a1", 0, {"a": [True, True, True]})
        _night(store, "b1", 1, {"b": [False, False, False], "gone": [True] * 3})
        _night(store, "a2", 2, {"a": [False, True, True]})
        _night(store, "crashed", 3, {"b": [True] * 3}, status="running")
        _night(store, "a3", 4, {"a": [True, False, True]})

        def latest(run_id: str, days: float = 7.0) -> dict[tuple[str, str], str]:
            frame = store.latest_frame(run_id, candidates=["a", "b"], max_age_days=days)
            return {(r.model, r.item_id): r.run_id for r in frame.itertuples()}

        got = latest("a3")
        assert set(got.values()) == {"a3", "b1"}  # not a2 (older), not the crashed run
        assert len(got) == 6  # 'gone' is no longer in the fleet
        assert set(latest("a3", days=2.5).values()) == {"a3"}  # b1 is 3 days older
        assert set(latest("a2").values()) == {"a2", "b1"}  # as of a2: a3 had not happened


def test_latest_frame_keeps_one_suite_version(tmp_path: Path) -> None:
    with Store(tmp_path / "x.duckdb") as store:
        _night(store, "a1", 0, {"a": [True] * 3, "b": [True] * 3})
        _night(store, "a2", 1, {"a": [False] * 3}, version="v2")
        frame = store.latest_frame("a2", candidates=["a", "b"], max_age_days=7)
    # b was only measured on v1: comparing it with a on v2's items would compare other prompts
    assert set(frame.suite_version) == {"v2"} and set(frame.model) == {"a"}


def test_resuming_refuses_a_changed_candidate_or_suite(store: Store) -> None:
    from routeopt.evals.storage.store import ResumeConflict

    store.write_outcomes([_outcome("1")])
    same = {"m": {"provider": "openai", "model": "gpt"}}
    store.check_resume("r1", same, {"s": "v1"})  # unchanged: resumes
    store.check_resume("r1", {**same, "new": {"model": "x"}}, {"s": "v1", "t": "v9"})  # new ones
    with pytest.raises(ResumeConflict) as err:
        store.check_resume("r1", {"m": {"provider": "openai", "model": "gpt-2"}}, {"s": "v2"})
    msg = str(err.value)
    assert "cannot resume run 'r1'" in msg
    assert "candidate 'm': model 'gpt' -> 'gpt-2'" in msg and "suite 's': version v1 -> v2" in msg
    assert "Start a new run" in msg and "without --run-id" in msg


def test_a_candidate_the_run_never_measured_may_be_fixed_before_resuming(store: Store) -> None:
    """Every row of 'm' is a placeholder (a wrong URL on every call): the run measured nothing
    of it, so its fixed configuration resumes the run, and the run records the fix."""
    from routeopt.evals.storage.store import ResumeConflict

    store.write_outcomes(
        [
            Outcome("r1", "s", "v1", i, "m", error_kind="misconfigured", error="config: HTTP 404: Not Found")
            for i in ("1", "2")
        ]
    )
    fixed = {"m": {"provider": "openai", "model": "gpt", "base_url": "http://right/v1"}}
    store.check_resume("r1", fixed, {"s": "v1"})
    store.begin_run("r1", candidates=[{"name": "m", **fixed["m"]}])
    recorded = store.query("SELECT base_url FROM candidates WHERE run_id = 'r1'").base_url.tolist()
    assert recorded == ["http://right/v1"]
    store.write_outcomes([_outcome("1")])  # measured now: a change is refused again
    with pytest.raises(ResumeConflict, match="base_url 'http://right/v1' -> 'http://other/v1'"):
        store.check_resume("r1", {"m": {**fixed["m"], "base_url": "http://other/v1"}}, {"s": "v1"})


def test_begin_run_twice_resumes(store: Store) -> None:
    assert store.begin_run("r1") is False
    assert store.begin_run("r2") is True
    assert store.query("SELECT count(*) AS n FROM runs")["n"][0] == 2


def test_failed_batch_rolls_back(store: Store) -> None:
    bad = _outcome("3")
    bad.run_id = None  # violates NOT NULL: the whole batch must be rejected
    with pytest.raises(Exception):
        store.write_outcomes([_outcome("1"), bad])
    assert store.query("SELECT count(*) AS n FROM outcomes")["n"][0] == 0
    store.write_outcomes([_outcome("1")])  # the connection is still usable
    assert store.query("SELECT count(*) AS n FROM outcomes")["n"][0] == 1


def test_budget_skips_are_retried_and_replaced(store: Store) -> None:
    skipped = Outcome("r1", "s", "v1", "1", "m", error_kind="budget", error="cap reached")
    store.write_outcomes([skipped, _outcome("2")])
    assert store.done_items("r1", "s", "m") == {"2"}  # a resumed run retries the skipped item
    store.write_outcomes([_outcome("1"), _outcome("2", passed=False)])
    df = store.query("SELECT item_id, passed, error_kind FROM outcomes ORDER BY item_id")
    assert df.to_dict("records") == [
        {"item_id": "1", "passed": True, "error_kind": None},  # the placeholder was replaced
        {"item_id": "2", "passed": True, "error_kind": None},  # a final row was kept
    ]


def test_a_file_from_before_the_streamed_column_gains_it_and_keeps_its_rows(tmp_path: Path) -> None:
    import dataclasses

    import duckdb

    from routeopt.evals.storage import store as store_module

    path = tmp_path / "old.duckdb"
    old_schema = store_module.SCHEMA.replace("    streamed BOOLEAN,\n", "").split("-- Files")[0]
    old_columns = [f.name for f in dataclasses.fields(Outcome) if f.name != "streamed"]
    with duckdb.connect(str(path)) as con:
        con.execute(old_schema)
        con.execute(
            f"INSERT INTO outcomes ({', '.join(old_columns)}) VALUES ({', '.join('?' * len(old_columns))})",
            [{**dataclasses.asdict(_outcome("1")), "created_at": "2026-01-01"}[c] for c in old_columns],
        )
    with Store(path) as s:
        s.write_outcomes([dataclasses.replace(_outcome("2"), streamed=False)])
        rows = s.query("SELECT item_id, passed, streamed FROM outcomes ORDER BY item_id")
    assert rows.to_dict("records") == [
        {"item_id": "1", "passed": True, "streamed": None},
        {"item_id": "2", "passed": True, "streamed": False},
    ]


def test_the_same_error_on_every_call_is_a_configuration_error_and_is_excluded(tmp_path: Path) -> None:
    """A proxy that answers a wrong key with HTTP 400 on every call looks, row by row, like a
    model that fails every item; taken together the rows say the configuration is wrong."""
    from routeopt.evals.storage.labels import label_frame

    bad_key = "HTTP 400: No connected db. [no_db_connection] (POST http://proxy/v1/chat/completions)"
    refused = "Connection error. (POST http://127.0.0.1:9/v1/chat/completions)"
    rows = {  # candidate -> [(error_kind, error)] over items 0..4; None is an answer
        "wrong-key": [("client_error", bad_key)] * 5,
        "one-answer": [("client_error", bad_key)] * 4 + [None],  # it answered once: measured
        "two-calls": [("client_error", bad_key)] * 2,  # too few calls to tell
        "dead-port": [("connection", refused)] * 3 + [("circuit_open", "gave up after 600s")] * 2,
        "two-ways": [("timeout", "no complete answer within 60s")] * 4 + [("client_error", bad_key)],
        "wrong-path": [("config", "HTTP 404: Not Found (POST http://proxy/v2/chat/completions)")] * 3,
    }
    with Store(tmp_path / "x.duckdb") as store:
        store.begin_run("r1")
        store.register_suite("s", "v1", {}, [(str(i), f"p{i}", {}) for i in range(5)])
        store.write_outcomes(
            [
                Outcome(
                    "r1",
                    "s",
                    "v1",
                    str(i),
                    cand,
                    error_kind=e and e[0],
                    error=e and e[1],
                    passed=None if e else True,
                    score=None if e else 1.0,
                )
                for cand, errs in rows.items()
                for i, e in enumerate(errs)
            ]
        )
        found = store.mark_same_errors("r1")
        after = store.query("SELECT candidate, error_kind, error, passed FROM outcomes")
        frame = label_frame(after.assign(cached=False))
        resumable = store.done_items("r1", "s", "wrong-key")
    assert found == [
        {"candidate": "dead-port", "n": 3, "error_kind": "connection", "error": refused},
        {"candidate": "wrong-key", "n": 5, "error_kind": "client_error", "error": bad_key},
        {
            "candidate": "wrong-path",
            "n": 3,
            "error_kind": "config",
            "error": "HTTP 404: Not Found (POST http://proxy/v2/chat/completions)",
        },
    ]
    marked = after[after.error_kind == "misconfigured"]
    assert sorted(marked.candidate.unique()) == ["dead-port", "wrong-key", "wrong-path"] and len(marked) == 11
    assert set(marked[marked.candidate == "wrong-key"].error) == {f"client_error: {bad_key}"}
    assert set(after[after.candidate == "dead-port"].error_kind) == {"misconfigured", "circuit_open"}
    excluded = frame.groupby("candidate").excluded.sum().to_dict()
    assert excluded == {
        "wrong-key": 5,
        "dead-port": 5,
        "one-answer": 0,
        "two-calls": 0,
        "two-ways": 0,
        "wrong-path": 3,
    }
    assert resumable == set()  # a resumed run calls them again, once the configuration is fixed
