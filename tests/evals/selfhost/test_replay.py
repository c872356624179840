"""`routeopt bench replay` against the wire-protocol fake server: open loop, never early, every
figure per model and overall, bad input named by file and line, a server that stops answering."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pytest
from click.testing import CliRunner

from routeopt.evals.config import Candidate
from routeopt.evals.selfhost.arrivals import ReplayInputError, load_arrivals, synthesize
from routeopt.evals.selfhost.replay import Slo, make_sender, replay_once, summaries, summarize, sweep
from tests.fake_llm import FakeLLM


def trace(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cands(server: FakeLLM) -> dict[str, Candidate]:
    return {
        "oa": Candidate(
            name="oa",
            provider="openai",
            model="m-oa",
            base_url=server.openai_base_url,
            input_price_per_mtok=1,
            output_price_per_mtok=2,
        ),
        "an": Candidate(
            name="an",
            provider="anthropic",
            model="m-an",
            base_url=server.anthropic_base_url,
            api_key_env="REPLAY_TEST_KEY",
            input_price_per_mtok=1,
            output_price_per_mtok=2,
        ),
    }


def test_synthesised_prompts_have_the_recorded_length_and_differ() -> None:
    a, b = synthesize(200, 1), synthesize(200, 2)
    assert a != b and abs(len(a) / 4 - 200) <= 3


def test_arrivals_are_sent_open_loop_never_early_and_summarised(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("REPLAY_TEST_KEY", "sk-replay-secret")
    rows = [
        {
            "timestamp": 1000 + i * 0.02,
            "model": "oa" if i % 3 else "an",
            "input_tokens": 30,
            "output_tokens": 5 + i % 4,
        }
        for i in range(60)
    ]
    rows[10]["text"] = "What is 2 + 3?"  # a logged text is sent as it is
    with FakeLLM(first_token_delay_s=0.05) as server:  # slower than the arrivals: they overlap
        arrivals = load_arrivals([trace(tmp_path / "t.jsonl", rows)], ["oa", "an"])
        senders = {m: make_sender(c) for m, c in cands(server).items()}
        run = asyncio.run(replay_once(arrivals.items, 2.0, senders))
        sent = server.requests
    assert run.status == "complete" and all(r.ok for r in run.records)
    for r in run.records:  # the schedule: offset / speed, never before
        assert r.due_s == pytest.approx(arrivals.items[r.index].offset_s / 2.0)
        assert r.sent_s >= r.due_s
    assert max(r.in_flight for r in run.records) >= 2  # open loop: it did not wait for answers
    bodies = {json.dumps(q.body["messages"]) for q in sent}
    assert len(sent) == 60 and any("What is 2 + 3?" in b for b in bodies)
    assert {q.body["max_tokens"] for q in sent} == {5, 6, 7, 8}
    synth = [q for q in sent if "What is" not in json.dumps(q.body)]
    assert all(25 <= len(json.dumps(q.body["messages"][0]["content"])) / 4 <= 40 for q in synth)
    assert any(q.headers.get("x-api-key") == "sk-replay-secret" for q in sent)
    figures = summaries(run, Slo(ttft_s=10.0), 0.5, 1.0)
    assert set(figures) == {"*", "oa", "an"}
    f = figures["*"]
    assert f["arrivals"] == f["sent"] == f["completed"] == 60 and f["errors"] == 0
    assert f["offered_rps"] == pytest.approx(59 / (59 * 0.02 / 2), rel=1e-6)
    assert f["ttft_s"]["p50"] >= 0.05 and f["e2e_s"]["p99"] >= f["ttft_s"]["p99"]
    assert f["itl_s"] is not None and f["tpot_s"] is not None and f["good_share"] == 1.0
    assert figures["oa"]["arrivals"] + figures["an"]["arrivals"] == 60
    # usage as the server reported it (the fake answers "5" to the one logged question)
    assert {r.output_tokens for r in run.records if r.index != 10} == {5, 6, 7, 8}
    assert run.records[10].output_tokens == 1


def test_bad_input_is_named_by_file_and_line(tmp_path: Path) -> None:
    base = {"model": "oa", "input_tokens": 10, "output_tokens": 4}
    rows = [
        {**base, "timestamp": "2026-01-01T00:00:10Z", "request_id": "a"},
        {**base, "timestamp": "2026-01-01T00:00:05Z", "request_id": "b"},  # out of order
        {**base, "timestamp": "2026-01-01T00:00:05Z", "request_id": "c"},  # simultaneous
        {**base, "timestamp": "2026-01-01T02:00:00Z", "request_id": "d"},  # a 2 h gap
        {**base, "timestamp": "2026-01-01T02:00:01Z", "request_id": "d"},  # a repeated id
        {"timestamp": "2026-01-01T02:00:02Z", "model": "oa", "input_tokens": 12},
    ]  # no output count
    f = trace(tmp_path / "t.jsonl", rows)
    a = load_arrivals([f], ["oa"], max_gap_s=30)
    assert [x.offset_s for x in a.items] == [0.0, 0.0, 5.0, 35.0, 37.0]
    assert a.items[-1].output_tokens == 4 and a.items[-1].estimated
    notes = " | ".join(a.notes)
    assert f"1 arrivals were out of time order (first at {f}:2)" in notes
    assert "1 arrivals share their timestamp" in notes
    assert f"repeat a request id already seen (first at {f}:5)" in notes
    assert "1 gaps longer than 30 s were shortened to it (7,160 s of idle time cut" in notes
    with pytest.raises(ReplayInputError, match=rf"'gpt-9' \(1 arrivals, first at {f}:2\).*--skip-unknown"):
        load_arrivals([trace(f, [rows[0], {**rows[1], "model": "gpt-9"}])], ["oa"])
    assert len(load_arrivals([f], ["oa"], skip_unknown=True).items) == 1
    with pytest.raises(ReplayInputError, match=rf"{f}:1: no output_tokens for 'oa'.*--output-tokens"):
        load_arrivals([trace(f, [{"timestamp": 1, "model": "oa", "input_tokens": 3}])], ["oa"])
    with pytest.raises(ReplayInputError, match=rf"{f}:1: timestamp 'soon'"):
        load_arrivals([trace(f, [{**base, "timestamp": "soon"}])], ["oa"])
    (tmp_path / "bad.jsonl").write_text('{"timestamp": 1, "model": "oa"}\n{"timestamp": 2, "mod\n')
    with pytest.raises(ReplayInputError, match=r"bad.jsonl:2: not valid JSON"):
        load_arrivals([tmp_path / "bad.jsonl"], ["oa"])


def test_a_gateway_decision_log_is_replayed_with_its_usage(tmp_path: Path) -> None:
    from routeopt.artifacts.serving.gateway import DecisionLog, Gateway, verbatim
    from tests.artifacts.serving.test_gateway import FakeRouter

    gw = Gateway(FakeRouter("cheap"), log=DecisionLog(tmp_path / "log", redact=verbatim))
    for i in range(5):
        d = gw.route(f"What is {i} + 1?", request_id=f"r{i}")
        gw.record_usage(d.request_id, d.model, input_tokens=7, output_tokens=3 + i)
    gw.close()
    a = load_arrivals([tmp_path / "log"], ["oa"], mapping={"cheap": "oa"})
    assert [x.output_tokens for x in a.items] == [3, 4, 5, 6, 7]
    assert a.items[0].text == "What is 0 + 1?" and a.items[0].where.endswith(":1")


def test_a_server_that_stops_answering_is_named_and_the_measured_part_kept(tmp_path: Path) -> None:
    rows = [{"timestamp": i * 0.01, "model": "oa", "input_tokens": 5, "output_tokens": 3} for i in range(200)]
    arrivals = load_arrivals([trace(tmp_path / "t.jsonl", rows)], ["oa"])
    server = FakeLLM().start()
    cand = cands(server)["oa"]

    def stop_after_30() -> None:  # the server stops answering once it has taken 30 requests
        while len(server.requests) < 30:
            time.sleep(0.005)
        server.stop()

    stopper = threading.Thread(target=stop_after_30, daemon=True)
    stopper.start()
    run = asyncio.run(
        replay_once(arrivals.items, 1.0, {"oa": make_sender(cand)}, timeout_s=2.0, down_after=5)
    )
    stopper.join()
    assert run.status == "partial" and "stopped answering" in run.down["oa"]
    assert cand.base_url in run.down["oa"]
    answered = [r for r in run.records if r.ok]
    kinds = {r.error_kind for r in run.records if not r.ok}
    assert 1 <= len(answered) <= 30 and "not_sent" in kinds and kinds <= {"connection", "timeout", "not_sent"}
    figures = summaries(run, Slo(), 1.0, 1.0)
    assert figures["*"]["meets_slo"] is False and figures["*"]["completed"] == len(answered)


def test_a_late_generator_is_flagged_not_reported_as_the_servers_latency() -> None:
    from routeopt.evals.selfhost.replay import Sent

    recs = [
        Sent(
            i,
            "m",
            "x",
            i * 0.01,
            5,
            5,
            sent_s=i * 0.01 + 0.05,
            first_s=i * 0.01 + 0.06,
            end_s=i * 0.01 + 0.07,
            ok=True,
            output_tokens=5,
        )
        for i in range(100)
    ]
    f = summarize(recs, 1.0, Slo(ttft_s=1.0), max_lateness_s=0.01)
    assert f["generator_limited"] and not f["meets_slo"] and f["lateness_s"]["p99"] == pytest.approx(0.05)


def test_the_sweep_doubles_then_bisects_to_the_highest_speed_that_holds() -> None:
    from routeopt.evals.selfhost.replay import ReplayRun, disagreement, highest_meeting, lowest_breaking

    async def run_at(speed: float):
        return ReplayRun(speed, [], 0.0, "complete"), {"*": {"meets_slo": speed <= 5.0}}

    results = asyncio.run(sweep(run_at, None, steps=3))
    # two probes that agree decide a speed (the majority of three)
    assert [r.speed for r, _ in results] == [1, 1, 2, 2, 4, 4, 8, 8, 6, 6, 5, 5, 5.5, 5.5]
    assert highest_meeting(results) == 5.0 and lowest_breaking(results) == 5.5
    assert disagreement(results) is None  # every probe agreed with its speed's verdict


@pytest.mark.parametrize(
    "limit, tried, highest",
    [
        (5.0, [16, 8, 4, 6, 5, 5.5], 5.0),  # the start breaks it: halve until one holds, then bisect
        (0.1, [16, 8, 4, 2, 1, 0.5, 0.25], None),  # nothing holds within the halvings: no speed is claimed
    ],
)
def test_the_sweep_halves_when_its_start_already_breaks_the_slo(limit: float, tried: list, highest) -> None:
    from routeopt.evals.selfhost.replay import ReplayRun, highest_meeting

    async def run_at(speed: float):
        return ReplayRun(speed, [], 0.0, "complete"), {"*": {"meets_slo": speed <= limit}}

    results = asyncio.run(sweep(run_at, None, start=16, steps=3, probes=1))
    assert [r.speed for r, _ in results] == tried
    assert highest_meeting(results) == highest


@pytest.mark.parametrize(
    "probes, tried, highest, broke",
    [
        # the slow probe at 16x is outvoted by the next two; one at 31x, the last bisection step, too
        (3, [8, 8, 16, 16, 16, 32, 32, 24, 24, 28, 28, 30, 30, 31, 31, 31], 31, 32),
        (1, [8, 16, 12, 14, 15, 15.5], 15.5, 16),  # one probe per speed: one slow probe caps the sweep
    ],
)
def test_one_slow_probe_does_not_cap_the_sweep(
    probes: int, tried: list, highest: float, broke: float
) -> None:
    """The server holds 31x; the machine slowed down during the first probes at 16x and 31x."""
    from routeopt.evals.selfhost.replay import ReplayRun, highest_meeting, lowest_breaking

    seen: list[float] = []

    async def run_at(speed: float):
        seen.append(speed)
        slow = speed in (16, 31) and seen.count(speed) == 1
        return ReplayRun(speed, [], 0.0, "complete"), {"*": {"meets_slo": speed <= 31 and not slow}}

    results = asyncio.run(sweep(run_at, None, start=8, steps=4, probes=probes))
    assert [r.speed for r, _ in results] == tried
    assert highest_meeting(results) == highest and lowest_breaking(results) == broke


def test_a_speed_that_met_in_one_probe_of_three_is_where_the_slo_broke() -> None:
    """A lucky probe does not make a speed: the majority of its probes decides it."""
    from routeopt.evals.selfhost.replay import (
        ReplayRun,
        disagreement,
        highest_meeting,
        lowest_breaking,
        verdicts,
    )

    outcomes = {8: [True, True], 16: [False, True, False], 12: [True, False, True], 14: [False, False]}
    seen: list[float] = []

    async def run_at(speed: float):
        seen.append(speed)
        return ReplayRun(speed, [], 0.0, "complete"), {
            "*": {"meets_slo": outcomes[speed][seen.count(speed) - 1]}
        }

    results = asyncio.run(sweep(run_at, None, start=8, max_speed=16, steps=2))
    assert seen == [8, 8, 16, 16, 16, 12, 12, 12, 14, 14]
    assert verdicts(results) == {8: True, 16: False, 12: True, 14: False}
    assert highest_meeting(results) == 12 and lowest_breaking(results) == 14
    assert disagreement(results) == (12, 16)  # a probe broke it at 12x, and one met it at 16x
    even = [(ReplayRun(4, [], 0.0, "complete"), {"*": {"meets_slo": ok}}) for ok in (True, False)]
    assert verdicts(even) == {4: False}  # a tie is not a pass


def test_the_command_says_between_which_speeds_its_probes_disagreed(tmp_path: Path, capsys) -> None:
    from routeopt.evals.selfhost.replay import ReplayRun
    from routeopt.flows.commands.replay import _finish

    probes = [
        (8, True),
        (8, True),
        (16, False),
        (16, True),
        (16, False),
        (12, True),
        (12, False),
        (12, True),
        (14, False),
        (14, False),
    ]
    results = [(ReplayRun(speed, [], 0.0, "complete"), {"*": {"meets_slo": ok}}) for speed, ok in probes]
    _finish(results, "replay-x", Slo(ttft_s=1.0), True, tmp_path / "out.json")
    said = capsys.readouterr().out
    assert "highest speed meeting the SLO: 12x" in said and "the SLO broke at 14x" in said
    assert "probes from 12x to 16x disagreed" in said
    out = json.loads((tmp_path / "out.json").read_text())
    assert out["probes_disagree_between"] == [12, 16] and out["slo_broken_at_speed"] == 14
    assert [s["probe"] for s in out["speeds"]] == [0, 1, 0, 1, 2, 0, 1, 2, 0, 1]


def test_the_command_replays_stores_every_speed_and_says_where_the_slo_broke(tmp_path: Path) -> None:
    from routeopt.flows.cli import cli

    rows = [{"timestamp": i * 0.05, "model": "oa", "input_tokens": 8, "output_tokens": 4} for i in range(40)]
    with FakeLLM(first_token_delay_s=0.03) as server:
        cfg = tmp_path / "routeopt.yaml"
        cfg.write_text(
            json.dumps(
                {
                    "candidates": [
                        {
                            "name": "oa",
                            "provider": "openai",
                            "model": "m",
                            "base_url": server.openai_base_url,
                            "input_price_per_mtok": 1,
                            "output_price_per_mtok": 2,
                        }
                    ],
                    "db_path": "db.duckdb",
                }
            )
        )
        res = CliRunner().invoke(
            cli,
            [
                "bench",
                "replay",
                str(trace(tmp_path / "t.jsonl", rows)),
                "--config",
                str(cfg),
                "--speed",
                "1,4",
                "--ttft-target-s",
                "0.02",
                "--json-out",
                str(tmp_path / "replay.json"),
            ],
            catch_exceptions=False,
        )
    assert res.exit_code == 0, res.output
    assert "speed 1x: complete" in res.output and "speed 4x: complete" in res.output
    assert "no speed met the SLO" in res.output and "the SLO broke at 1x" in res.output  # 30 ms > 20 ms
    out = json.loads((tmp_path / "replay.json").read_text())
    verdict = (out["highest_speed_meeting_slo"], out["slo_broken_at_speed"], out["probes_disagree_between"])
    assert verdict == (None, 1.0, None)  # both speeds broke it: nothing to disagree on
    probes = [(s["speed"], s["probe"], s["figures"]["*"]["meets_slo"]) for s in out["speeds"]]
    assert probes == [(1.0, 0, False), (4.0, 0, False)]
    assert "disagreed" not in res.output
    con = duckdb.connect(str(tmp_path / "db.duckdb"), read_only=True)
    runs = con.execute(
        "SELECT speed, model, arrivals, completed, ttft_p50 FROM replay_runs ORDER BY speed, model"
    ).fetchall()
    n = con.execute("SELECT count(*) FROM replay_requests").fetchone()[0]
    con.close()
    assert [(s, m, a, c) for s, m, a, c, _ in runs] == [
        (1.0, "*", 40, 40),
        (1.0, "oa", 40, 40),
        (4.0, "*", 40, 40),
        (4.0, "oa", 40, 40),
    ]
    assert all(t >= 0.03 for *_, t in runs) and n == 80


def test_stored_speeds_give_the_cost_plan_its_capacity_and_the_dashboard_its_curve(tmp_path: Path) -> None:
    from routeopt.evals.selfhost.replay import ReplayRun, Sent, summaries
    from routeopt.evals.selfhost.replay_store import load_runs, replay_capacity, request_frame, run_rows, save
    from routeopt.evals.storage.store import Store
    from routeopt.reports.replay_chart import replay_section

    slo = Slo(ttft_s=0.5)

    def run(speed: float, ttft: float) -> ReplayRun:
        recs = [
            Sent(
                i,
                "zoo",
                "t:1",
                i / (10 * speed),
                5,
                10,
                sent_s=i / (10 * speed),
                first_s=i / (10 * speed) + ttft,
                end_s=i / (10 * speed) + ttft + 0.1,
                ok=True,
                output_tokens=10,
            )
            for i in range(600)
        ]
        return ReplayRun(speed, recs, 60 / speed, "complete")

    with Store(tmp_path / "db.duckdb") as store:
        for speed, ttft in ((1, 0.1), (2, 0.2), (4, 0.9)):  # the SLO (0.5 s) breaks at 4x
            r = run(speed, ttft)
            save(
                store,
                run_rows("replay-t", r, summaries(r, slo, 0.01, 10.0), slo, "t.jsonl", ["a note"]),
                request_frame("replay-t", r),
            )
        tok_s, replay_id, speed = replay_capacity(store, "zoo")
        assert (replay_id, speed) == ("replay-t", 2.0) and tok_s == pytest.approx(200.0, rel=0.05)
        assert replay_capacity(store, "other") is None
        rows = load_runs(store)
        assert sorted(set(rows.speed)) == [1.0, 2.0, 4.0] and set(rows.model) == {"*", "zoo"}
        section = replay_section(store)
    assert [r["meets_slo"] for r in section["rows"]] == [True, True, False]
    assert "Latency vs replay speed" in section["chart"] and "TTFT p99" in section["chart"]


def test_the_cost_plan_takes_capacity_only_from_a_speed_whose_majority_met_the_slo(tmp_path: Path) -> None:
    from routeopt.evals.selfhost.replay import ReplayRun, Sent, summaries
    from routeopt.evals.selfhost.replay_store import replay_capacity, request_frame, run_rows, save
    from routeopt.evals.storage.store import Store

    slo = Slo(ttft_s=0.5)

    def run(speed: float, ttft: float, tokens: int) -> ReplayRun:
        recs = [
            Sent(
                i,
                "zoo",
                "t:1",
                i / (10 * speed),
                5,
                tokens,
                sent_s=i / (10 * speed),
                first_s=i / (10 * speed) + ttft,
                end_s=i / (10 * speed) + ttft + 0.1,
                ok=True,
                output_tokens=tokens,
            )
            for i in range(600)
        ]
        return ReplayRun(speed, recs, 60 / speed, "complete")

    with Store(tmp_path / "db.duckdb") as store:
        # 3x met in two probes of three (a median of their peaks); 4x in one of three (a lucky probe)
        probes = (
            (2, 0.2, 10),
            (3, 0.3, 10),
            (3, 0.9, 10),
            (3, 0.3, 12),
            (4, 0.9, 10),
            (4, 0.3, 10),
            (4, 0.9, 10),
        )
        for i, (speed, ttft, tokens) in enumerate(probes):
            r, probe = run(speed, ttft, tokens), [p[0] for p in probes[:i]].count(speed)
            save(
                store,
                run_rows("replay-v", r, summaries(r, slo, 0.01, 10.0), slo, "t.jsonl", [], probe),
                request_frame("replay-v", r, probe),
            )
        tok_s, replay_id, speed = replay_capacity(store, "zoo")
        stored = store.query("SELECT count(*) AS n FROM replay_runs WHERE model = 'zoo'").n.iloc[0]
    assert stored == len(probes)  # every probe kept, not one per speed
    assert (replay_id, speed) == ("replay-v", 3.0) and tok_s == pytest.approx(330.0, rel=0.05)


def test_a_store_written_before_probes_were_numbered_keeps_its_rows_and_takes_every_probe(
    tmp_path: Path,
) -> None:
    from routeopt.evals.selfhost.replay import ReplayRun, Sent, summaries
    from routeopt.evals.selfhost.replay_store import SCHEMA, load_runs, request_frame, run_rows, save
    from routeopt.evals.storage.store import Store

    slo = Slo(ttft_s=0.5)
    recs = [
        Sent(
            i,
            "zoo",
            "t:1",
            i * 0.1,
            5,
            4,
            sent_s=i * 0.1,
            first_s=i * 0.1 + 0.2,
            end_s=i * 0.1 + 0.3,
            ok=True,
            output_tokens=4,
        )
        for i in range(20)
    ]
    r = ReplayRun(2.0, recs, 2.0, "complete")
    old = SCHEMA.replace("probe INTEGER NOT NULL DEFAULT 0,", "").replace("speed, probe,", "speed,")
    with Store(tmp_path / "db.duckdb") as store:
        store._con.execute(old)
        rows, frame = (
            run_rows("replay-old", r, summaries(r, slo, 0.01, 1.0), slo, "t", []),
            request_frame("replay-old", r),
        )
        for table, data in (
            ("replay_runs", pd.DataFrame(rows).drop(columns="probe")),
            ("replay_requests", frame.drop(columns="probe")),
        ):
            store._con.register("_old", data)
            store._con.execute(f"INSERT INTO {table} BY NAME SELECT * FROM _old")
            store._con.unregister("_old")
        for probe in (0, 1):
            save(
                store,
                run_rows("replay-new", r, summaries(r, slo, 0.01, 1.0), slo, "t", [], probe),
                request_frame("replay-new", r, probe),
            )
        old_rows = load_runs(store, "replay-old")
        new_rows = load_runs(store, "replay-new")
        n_requests = store.query("SELECT count(*) AS n FROM replay_requests").n.iloc[0]
    assert list(old_rows.probe) == [0, 0] and len(old_rows) == 2  # "*" and zoo, kept as probe 0
    assert sorted(new_rows.probe) == [0, 0, 1, 1] and n_requests == 3 * len(recs)


@pytest.mark.parametrize(
    "allowed, engines, split",
    [
        ({0, 1}, 1, ({0}, {1})),
        ({2, 5, 7}, 2, ({2}, {5, 7})),  # the engines share every CPU but the generator's
        ({3}, 1, None),  # one CPU: nothing to split
        ({0, 1}, 0, None),  # no local engine: the generator keeps the machine
    ],
)
def test_the_generator_and_the_local_engines_get_cpus_of_their_own(
    monkeypatch, allowed, engines, split
) -> None:
    from routeopt.evals.selfhost import replay

    monkeypatch.setattr(replay.os, "sched_getaffinity", lambda pid: set(allowed))
    assert replay.cpu_split(engines) == split


def test_pinning_holds_within_its_block_and_is_undone_after() -> None:
    from routeopt.evals.selfhost.replay import pinned

    before = os.sched_getaffinity(0)
    one = {min(before)}
    with pinned(one):
        assert os.sched_getaffinity(0) == one
    assert os.sched_getaffinity(0) == before
    with pytest.raises(RuntimeError), pinned(one):
        raise RuntimeError("a replay that fails")
    assert os.sched_getaffinity(0) == before


def test_a_local_candidate_is_replayed_through_its_engine_process(tmp_path: Path, repo_root: Path) -> None:
    """The demo's zoo-s through the provider's batcher in a process of its own, on the CPU it
    was given: answers come back with the engine's own TTFT and gaps, on the replay's clock."""
    pytest.importorskip("torch")
    from routeopt.evals.config import load_config

    cand = load_config(repo_root / "evals" / "demo" / "routeopt.yaml").candidate("zoo-s")
    rows = [
        {"timestamp": i * 0.1, "model": "zoo-s", "input_tokens": 6, "output_tokens": 4, "text": f"{i} + 1 ="}
        for i in range(8)
    ]
    arrivals = load_arrivals([trace(tmp_path / "t.jsonl", rows)], ["zoo-s"])
    engine_cpus = {max(os.sched_getaffinity(0))}
    seen: list[set[int]] = []

    async def go():
        sender = make_sender(cand, engine_cpus)
        try:
            from routeopt.evals.selfhost.replay import warm_up

            await warm_up({"zoo-s": sender}, arrivals.items, 1)
            seen.append(os.sched_getaffinity(sender.proc.pid))
            return await replay_once(arrivals.items, 1.0, {"zoo-s": sender}, timeout_s=60)
        finally:
            sender.close()

    run = asyncio.run(go())
    assert seen == [engine_cpus]
    assert run.status == "complete" and all(r.ok for r in run.records), [r.error_kind for r in run.records]
    for r in run.records:
        assert (
            r.sent_s >= r.due_s and r.sent_s < r.first_s <= r.end_s and r.output_tokens <= 4
        )  # may stop early


def test_the_command_names_bad_input_and_sends_nothing(tmp_path: Path) -> None:
    from routeopt.flows.cli import cli

    cfg = tmp_path / "routeopt.yaml"
    cfg.write_text(
        json.dumps(
            {
                "candidates": [
                    {
                        "name": "oa",
                        "provider": "openai",
                        "model": "m",
                        "base_url": "http://127.0.0.1:9/v1",
                        "input_price_per_mtok": 1,
                        "output_price_per_mtok": 2,
                    }
                ]
            }
        )
    )
    log = trace(
        tmp_path / "t.jsonl",
        [
            {"timestamp": 1, "model": "oa", "input_tokens": 3, "output_tokens": 2},
            {"timestamp": 2, "model": "gpt-x", "input_tokens": 3, "output_tokens": 2},
        ],
    )
    res = CliRunner().invoke(cli, ["bench", "replay", str(log), "--config", str(cfg), "--speed", "1"])
    assert res.exit_code == 1 and f"'gpt-x' (1 arrivals, first at {log}:2)" in " ".join(res.output.split())
    bad = CliRunner().invoke(cli, ["bench", "replay", str(log), "--config", str(cfg), "--speed", "0,2"])
    assert bad.exit_code == 2 and "give positive speeds" in bad.output


def test_a_full_pipe_to_the_engine_never_stops_the_loop_that_reads_its_answers() -> None:
    """The engine reads nothing here, as one busy sending its own answers would: every send must
    return at once, and the requests reach the engine, in order, once it reads again."""
    import multiprocessing

    from routeopt.evals.selfhost.replay import Sent, _LocalSender

    sender = _LocalSender(Candidate(name="zoo-s", provider="local", model="m", gpu_hour_usd=1.0))
    sender.conn, engine = multiprocessing.Pipe()
    sender._writer(sender.conn)
    text = "x" * 65_536  # a few of these fill the pipe

    async def send_all() -> None:
        for i in range(64):
            sender.start(Sent(i, "m", "local:zoo-s", 0.0, 5, 5), text, time.perf_counter())

    done = threading.Thread(target=lambda: asyncio.run(send_all()), daemon=True)
    done.start()
    done.join(60)
    assert not done.is_alive(), "a send blocked on the full pipe"
    got = [engine.recv()[0] for _ in range(64)]
    assert got == list(range(64))
    sender.outbox.put(None)
    assert engine.recv() is None
    sender.writing.join(10)
    assert not sender.writing.is_alive()


def test_the_heap_made_before_the_clock_is_left_out_of_collections_during_a_probe(tmp_path: Path) -> None:
    """Earlier probes' records stay alive through a sweep; a full collection walking them paused
    the generator. They, and this probe's records, are frozen while it sends, and thawed after.
    In a process of its own (tests/evals/selfhost/heap_probe.py), whose heap is a replay's."""
    done = subprocess.run(
        [sys.executable, str(Path(__file__).with_name("heap_probe.py")), str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout)
    assert seen["status"] == "complete" and len(seen["frozen"]) == 20
    assert min(seen["frozen"]) >= seen["tracked_before"]  # everything made before the clock
    assert seen["thawed"] == 0  # and thawed after
    assert seen["kept"] > 0  # a caller that froze its own heap keeps it frozen
