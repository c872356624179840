"""The example suites end to end: real OpenAI SDK -> local wire-protocol server -> every grader.

A scripted model answers each example item right (or wrong); the judge is another candidate on
the same server. Every example suite must pass all items for the right answers and fail all for
the wrong ones, which exercises numeric, regex/not_contains (all), multiple choice, JSON with a
schema, code in the sandbox, the judge and a custom weighted grader through the real runner.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Callable

import pyarrow.parquet as pq
import pytest

from routeopt.evals.config import Candidate, Config
from routeopt.evals.execution.runner import evaluate_pair
from routeopt.evals.grading.sandbox import isolation
from routeopt.evals.storage.store import Outcome
from routeopt.evals.suite.spec import Suite, SuiteError, discover_suites, load_suite
from tests import REPO
from tests.fake_llm import FakeLLM

EXAMPLES = REPO / "evals" / "suites" / "examples"
DATA = REPO / "evals" / "data" / "examples"


def _jsonl(name: str) -> list[dict]:
    return [json.loads(line) for line in (DATA / name).read_text().splitlines() if line.strip()]


def scripted_model(right: bool) -> Callable[[str], str]:
    """Answers keyed by the example prompts: right ones, or plausible wrong ones."""
    table: dict[str, str] = {}
    for r in _jsonl("arith.jsonl"):
        table[r["question"]] = f"Let me work it out.\nAnswer: {r['answer'] if right else r['answer'] + 1}"
    with (DATA / "trivia.csv").open() as fh:
        for r in csv.DictReader(fh):
            wrong = "ABCD"[("ABCD".index(r["answer"]) + 1) % 4]
            table[r["question"]] = f"Answer: {r['answer'] if right else wrong}"
    for r in pq.read_table(DATA / "people.parquet").to_pylist():
        person = dict(r["person"]) if right else {**r["person"], "age": str(r["person"]["age"])}
        table[r["text"]] = f"```json\n{json.dumps(person)}\n```"
    for r in _jsonl("code.jsonl"):
        code = r["reference"] if right else "def unused():\n    pass\n"
        table[r["task"]] = f"```python\n{code}```"
    refs = {r["reference"] for r in _jsonl("summaries.jsonl")}
    for r in _jsonl("summaries.jsonl"):
        table[r["document"]] = r["reference"] if right else "The text is about something."
    for r in _jsonl("reverse.jsonl"):
        table[r["word"]] = r["answer"] if right else r["word"]

    def answer(prompt: str) -> str:
        if "Summary to grade:" in prompt:  # the judge
            graded = prompt.split("Summary to grade:", 1)[1].split("\n\n")[0].strip()
            return "Faithful and brief.\nSCORE: 9" if graded in refs else "Misses the point.\nSCORE: 2"
        for key, reply in table.items():
            if key in prompt:
                return reply
        return "no idea"

    return answer


def fleet(server: FakeLLM) -> Config:
    def cand(name: str) -> dict:
        return dict(
            name=name,
            provider="openai",
            model=name,
            base_url=server.openai_base_url,
            input_price_per_mtok=1.0,
            output_price_per_mtok=2.0,
            timeout_s=10,
            max_retries=2,
        )

    return Config(
        candidates=[
            Candidate(**cand("small-model")),
            Candidate(**cand("big-model")),
            Candidate(**cand("judge")),
        ]
    )


NO_SANDBOX = isolation(False) if isinstance(isolation(False), str) else None


def load_example(path: Path, cfg: Config) -> Suite | None:
    """The example suite; None for the code example where programs cannot be isolated here, after
    checking that loading it fails early with the reason (the rest still load and run)."""
    if NO_SANDBOX and path.name == "code-python.yaml":
        with pytest.raises(SuiteError, match="the code grader cannot isolate programs"):
            load_suite(path, config=cfg)
        return None
    return load_suite(path, config=cfg)


def test_examples_cover_every_grader_kind() -> None:
    cfg = Config(candidates=[Candidate(name="judge", provider="openai", model="j", input_price_per_mtok=1)])
    kinds: set[str] = set()

    def walk(g) -> None:
        kinds.add(g.type)
        for child in getattr(g, "_children", []):
            walk(child)

    for path in discover_suites(EXAMPLES):
        if (suite := load_example(path, cfg)) is not None:
            walk(suite.grader)
    assert {
        "numeric",
        "multiple_choice",
        "json",
        "judge",
        "custom",
        "all",
        "weighted",
        "regex",
        "not_contains",
        "exact_match",
        *([] if NO_SANDBOX else ["code"]),
    } <= kinds


@pytest.mark.parametrize("right", [True, False], ids=["right-answers", "wrong-answers"])
async def test_every_example_suite_runs_on_the_local_server(right: bool) -> None:
    with FakeLLM(answer_fn=scripted_model(right)) as server:
        cfg = fleet(server)
        for path in discover_suites(EXAMPLES):
            suite = load_example(path, cfg)
            if suite is None:
                continue
            rows: list[Outcome] = []
            stats = await evaluate_pair(suite, cfg.candidate("small-model"), "run-1", rows.extend)
            assert stats.errors == 0, [(r.item_id, r.error) for r in rows if r.error]
            assert len(rows) == len(suite.items) and {r.item_id for r in rows} == {i.id for i in suite.items}
            assert all(r.passed is right for r in rows), (
                suite.name,
                [(r.item_id, r.reason) for r in rows if r.passed is not right],
            )
            if not right:
                assert all(r.reason for r in rows), suite.name


async def test_overrides_and_few_shot_reach_the_wire() -> None:
    with FakeLLM(answer_fn=scripted_model(True)) as server:
        cfg = fleet(server)
        suite = load_suite(EXAMPLES / "arith-numeric.yaml", config=cfg)
        for name in ("small-model", "big-model"):
            await evaluate_pair(suite, cfg.candidate(name), "run-o", lambda rows: None)
        bodies = [r.body for r in server.requests if r.path.endswith("/chat/completions")]
    by_model = {b["model"]: b for b in bodies}
    assert (
        by_model["small-model"].get("max_tokens", by_model["small-model"].get("max_completion_tokens")) == 64
    )
    assert by_model["big-model"].get("max_tokens", by_model["big-model"].get("max_completion_tokens")) == 256
    roles = [m["role"] for m in by_model["small-model"]["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]


async def test_judge_request_carries_the_rubric_and_a_bad_reply_is_a_grader_error() -> None:
    with FakeLLM(answer_fn=scripted_model(True)) as server:
        cfg = fleet(server)
        suite = load_suite(EXAMPLES / "summary-judge.yaml", config=cfg)
        item = suite.items[0]
        grade = await suite.grader.grade(item.fields["reference"], item.fields)
        assert grade.passed and grade.score == pytest.approx(0.9) and grade.reason.startswith("judge 9/10")
        sent = [r.body for r in server.requests if r.body.get("model") == "judge"][-1]
        assert sent["messages"][0]["role"] == "system" and sent.get("temperature") == 0.0
        user = sent["messages"][1]["content"]
        assert item.fields["document"] in user and "SCORE: <number from 0 to 10>" in user
        assert len(suite.grader._providers) == 1
        await suite.grader.aclose()
        assert len(suite.grader._providers) == 0
        server.answer_fn = lambda prompt: "I refuse to grade." if "Summary to grade:" in prompt else "x"
        rows: list[Outcome] = []
        stats = await evaluate_pair(suite, cfg.candidate("small-model"), "run-j", rows.extend)
        assert stats.errors == len(suite.items)
        assert all(r.error_kind == "grader_error" and "no score" in r.error for r in rows)


async def test_a_grader_that_raises_costs_only_its_item(tmp_path: Path) -> None:
    (tmp_path / "g.py").write_text(
        "def picky(response, item):\n"
        "    if item['id'] == 'q00002':\n        raise RuntimeError('grader bug on this item')\n"
        "    return response.strip() == str(item['answer'])\n"
    )
    from tests.fake_llm import write_arithmetic_suite

    path = write_arithmetic_suite(tmp_path, 5)
    spec = json.loads(path.read_text())
    spec["grader"] = {"type": "custom", "function": "g.py:picky"}
    path.write_text(json.dumps(spec))
    with FakeLLM() as server:
        cfg = fleet(server)
        rows: list[Outcome] = []
        stats = await evaluate_pair(
            load_suite(path, config=cfg), cfg.candidate("small-model"), "r", rows.extend
        )
    by_id = {r.item_id: r for r in rows}
    assert stats.errors == 1 and by_id["q00002"].error_kind == "grader_error"
    assert "RuntimeError: grader bug on this item" in by_id["q00002"].error
    assert all(r.passed for i, r in by_id.items() if i != "q00002")


async def test_judge_works_through_the_anthropic_protocol_too() -> None:
    with FakeLLM(answer_fn=scripted_model(True)) as server:
        judge = Candidate(
            name="judge",
            provider="anthropic",
            model="judge-claude",
            timeout_s=10,
            base_url=server.anthropic_base_url,
            input_price_per_mtok=3,
            output_price_per_mtok=15,
        )
        suite = load_suite(EXAMPLES / "summary-judge.yaml", config=Config(candidates=[judge]))
        item = suite.items[1]
        good = await suite.grader.grade(item.fields["reference"], item.fields)
        bad = await suite.grader.grade("Something happened somewhere.", item.fields)
        await suite.grader.aclose()
        sent = [r for r in server.requests if r.path.endswith("/messages")]
    assert good.passed and not bad.passed and bad.score == pytest.approx(0.2)
    assert len(sent) == 2 and sent[0].body["model"] == "judge-claude"
    assert "strict, fair grader" in str(sent[0].body["system"])
