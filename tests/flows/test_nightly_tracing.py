"""The nightly traced end to end (an in-memory exporter): the run, each (suite, candidate), every
call in GenAI conventions with its grade, judge calls under the graded call, ids on the rows,
and no key anywhere in the spans."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from tests.fake_llm import FakeLLM, default_answer, write_arithmetic_suite, write_two_model_config

pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
SECRETS = ("sk-strong-trace-secret-123", "sk-weak-trace-secret-456")


def judged_suite(folder: Path, n: int) -> None:
    """A suite graded by the `strong` candidate as judge."""
    rows = [{"id": f"j{i}", "q": f"Say something about {i}"} for i in range(n)]
    (folder / "judged.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (folder / "judged.yaml").write_text(
        json.dumps(
            {
                "name": "judged",
                "dataset": {"path": "judged.jsonl", "id_field": "id"},
                "prompt": {"template": "{{ q }}"},
                "generation": {"max_tokens": 16},
                "grader": {"type": "judge", "candidate": "strong", "rubric": "Is this fine? {{ response }}"},
            }
        )
    )


def config(tmp_path: Path, strong: FakeLLM, weak: FakeLLM) -> Path:
    suites = tmp_path / "suites"
    # every 4th item fails its first attempt: the call retries
    write_arithmetic_suite(
        suites, 12, name="arith", tags=lambda i: "[[fault:server_error*1]]" if i % 4 == 0 else ""
    )
    judged_suite(suites, 4)
    path = write_two_model_config(
        tmp_path / "routeopt.yaml",
        strong,
        weak,
        key_envs=("STRONG_KEY", "WEAK_KEY"),
        weak_protocol="anthropic",
    )
    cfg = json.loads(path.read_text())
    cfg["alerts"] = {"latency_p95_increase_pct": 10_000, "ttft_p95_increase_pct": 10_000}
    path.write_text(json.dumps(cfg))
    return path


def test_the_nightly_is_one_trace_with_genai_spans(
    tmp_path: Path, prefect_harness, memory, monkeypatch: pytest.MonkeyPatch
) -> None:
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.setenv("STRONG_KEY", SECRETS[0])
    monkeypatch.setenv("WEAK_KEY", SECRETS[1])
    with FakeLLM() as strong, FakeLLM() as weak:
        strong.answer_fn = lambda p: "Fine. SCORE: 9" if "SCORE" in p else default_answer(p)
        result = nightly(config_path=str(config(tmp_path, strong, weak)), run_id="traced-1", publish=False)
    db = tmp_path / "out" / "routeopt.duckdb"
    close_store(db)
    assert result.suite_errors == {}
    spans = memory.get_finished_spans()
    by_id = {s.context.span_id: s for s in spans}
    (run,) = [s for s in spans if s.name == "routeopt nightly"]
    assert run.parent is None and run.attributes["routeopt.run_id"] == "traced-1"
    assert {s.context.trace_id for s in spans} == {run.context.trace_id}  # one trace
    pairs = [s for s in spans if s.name.startswith("evaluate ")]
    assert sorted(s.name for s in pairs) == [
        "evaluate arith x strong",
        "evaluate arith x weak",
        "evaluate judged x strong",
        "evaluate judged x weak",
    ]
    assert all(s.parent.span_id == run.context.span_id for s in pairs)

    calls = [s for s in spans if s.name.startswith("chat ") and s.attributes["routeopt.role"] == "answer"]
    judges = [s for s in spans if s.name.startswith("chat ") and s.attributes["routeopt.role"] == "judge"]
    assert len(calls) == 2 * (12 + 4) and len(judges) == 2 * 4
    for s in calls:
        a = s.attributes
        pair = by_id[s.parent.span_id]
        assert pair.name == f"evaluate {a['routeopt.suite']} x {a['routeopt.candidate']}"
        assert s.name == f"chat {a['gen_ai.request.model']}" and a["gen_ai.operation.name"] == "chat"
        assert a["gen_ai.provider.name"] == ("openai" if a["routeopt.candidate"] == "strong" else "anthropic")
        assert a["gen_ai.usage.input_tokens"] > 0 and a["gen_ai.usage.output_tokens"] > 0
        assert a["gen_ai.response.finish_reasons"] and a["gen_ai.response.time_to_first_chunk"] > 0
        assert a["routeopt.cost_usd"] > 0 and a["gen_ai.request.max_tokens"] == 16
        assert "routeopt.grade.passed" in a and "gen_ai.evaluation.score.value" in a
        assert a["server.address"] == "127.0.0.1"
    retried = [s for s in calls if s.attributes["routeopt.attempts"] == 2]
    assert len(retried) == 2 * 3  # items 0, 4 and 8 of arith, on both candidates
    assert all([e.name for e in s.events][0] == "routeopt.attempt_failed" for s in retried)
    assert all(
        e.attributes["error.type"] == "server_error"
        for s in retried
        for e in s.events
        if e.name == "routeopt.attempt_failed"
    )
    for j in judges:  # a judge call is a child of the call it grades, which carries its cost
        graded = by_id[j.parent.span_id]
        assert (
            graded.attributes["routeopt.suite"] == "judged" and graded.attributes["routeopt.role"] == "answer"
        )
        assert graded.attributes["routeopt.judge.cost_usd"] > 0
        assert (
            j.attributes["gen_ai.request.model"] == "big" and j.attributes["gen_ai.usage.output_tokens"] > 0
        )
        assert graded.start_time <= j.start_time and j.end_time <= graded.end_time

    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute("SELECT suite, item_id, candidate, trace_id, span_id, passed FROM outcomes").fetchall()
    con.close()
    by_span = {f"{s.context.span_id:016x}": s for s in calls}
    assert len(rows) == len(calls)
    for suite, item, cand, trace_id, span_id, passed in rows:
        s = by_span[span_id]
        assert trace_id == f"{run.context.trace_id:032x}"
        assert (
            s.attributes["routeopt.suite"],
            s.attributes["routeopt.item_id"],
            s.attributes["routeopt.candidate"],
            s.attributes["routeopt.grade.passed"],
        ) == (suite, item, cand, passed)

    dumped = "\n".join(s.to_json() for s in spans)
    for secret in SECRETS:
        assert secret not in dumped
    assert "What is 1 + 3" not in dumped  # nor the prompts
