"""`routeopt import traffic`: logged prompts with kept text become judge-graded suites."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from routeopt.evals.config import load_config
from routeopt.evals.suite.traffic_suite import allocate
from routeopt.flows.cli import cli
from tests.evals.storage.test_traffic import decision, write_log
from tests.fake_llm import FakeLLM, default_answer


@given(st.lists(st.integers(0, 50), min_size=1, max_size=12), st.integers(0, 400))
def test_allocation_is_proportional_and_never_exceeds_a_stratum(sizes, n) -> None:
    take = allocate(sizes, n)
    assert sum(take) == min(n, sum(sizes))
    assert all(0 <= t <= s for t, s in zip(take, sizes))
    if sum(sizes) and n < sum(sizes):
        assert all(abs(t - s * n / sum(sizes)) < 1 + 1e-9 for t, s in zip(take, sizes))


def judge_or_echo(prompt: str) -> str:
    if "Response to grade:" in prompt:
        return "Fine answer.\nSCORE: 8"
    return default_answer(prompt)


@pytest.fixture()
def server():
    with FakeLLM(answer_fn=judge_or_echo) as s:
        yield s


def _config(tmp_path: Path, server: FakeLLM) -> Path:
    cfg = tmp_path / "routeopt.yaml"
    base = server.openai_base_url
    cfg.write_text(
        "candidates:\n"
        + "".join(
            f"  - {{name: {n}, provider: openai, model: {n}-model, base_url: '{base}', "
            "input_price_per_mtok: 1, output_price_per_mtok: 2, max_retries: 0}\n"
            for n in ("weak", "strong", "judge")
        )
        + "suites_dir: suites\ndb_path: db.duckdb\ntraffic: {judge: judge}\n"
    )
    (tmp_path / "suites").mkdir()
    return cfg


def _log(tmp_path: Path) -> Path:
    records = []
    for day in ("01", "02"):
        for i in range(12):
            suite = "billing" if i % 3 else "support"
            text = None if i == 11 else f"{suite} question {i} on day {day}"
            rec = decision(f"{day}-{i}", time=f"2025-03-{day}T0{i % 10}:00:00Z", suite=suite)
            if text:
                rec["text"] = text
            records.append(rec)
    records.append(
        decision(
            "dup",
            time="2025-03-02T09:30:00Z",
            suite="billing",
            text="billing question 1 on day 02",
            prompt_hash="h02-1",
        )
    )
    return write_log(tmp_path / "log" / "d.jsonl", records)


def _run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code == 0) is ok, result.output
    return result.output


def test_import_traffic_writes_judge_suites_the_runner_evaluates(tmp_path, server) -> None:
    from routeopt.evals.execution.runner import evaluate_pair
    from routeopt.evals.suite.spec import load_suite

    cfg_path = _config(tmp_path, server)
    out = _run("import", "traffic", str(_log(tmp_path)), "--sample", "8", "--config", str(cfg_path))
    assert "traffic-billing: 6 items" in out and "traffic-support: 2 items" in out  # 7+7 and 4+4 with text
    suite_file = tmp_path / "suites" / "traffic-billing.yaml"
    spec = yaml.safe_load(suite_file.read_text())
    assert spec["grader"]["type"] == "judge" and spec["grader"]["candidate"] == "judge"
    assert spec["dataset"]["path"] == "../data/traffic-billing.jsonl"
    items = [
        json.loads(line) for line in (tmp_path / "data" / "traffic-billing.jsonl").read_text().splitlines()
    ]
    assert len({i["prompt"] for i in items}) == 6 and {i["day"] for i in items} == {
        "2025-03-01",
        "2025-03-02",
    }
    assert all("question" in i["prompt"] and i["logged_suite"] == "billing" for i in items)
    assert "billing 2025-03-01: " in suite_file.read_text().splitlines()[0]
    cfg = load_config(cfg_path)
    suite = load_suite(suite_file, config=cfg)
    rows: list = []
    stats = asyncio.run(evaluate_pair(suite, cfg.candidate("weak"), "run-1", rows.extend))
    assert stats.errors == 0 and len(rows) == 6
    assert all(o.score == pytest.approx(0.8) and o.passed for o in rows)
    judged = [r.body for r in server.requests if "Response to grade" in json.dumps(r.body)]
    assert len(judged) == 6 and all(r["model"] == "judge-model" for r in judged)
    again = _run("import", "traffic", str(tmp_path / "log"), "--sample", "8", "--config", str(cfg_path))
    assert again == out  # same log and seed: the same suites


def test_reference_answers_come_from_the_strongest_candidate(tmp_path, server) -> None:
    cfg_path = _config(tmp_path, server)
    _run(
        "import",
        "traffic",
        str(_log(tmp_path)),
        "--sample",
        "4",
        "--config",
        str(cfg_path),
        "--reference",
        "strong",
        "--name",
        "prod",
    )
    items = [
        json.loads(line)
        for f in sorted((tmp_path / "data").glob("prod-*.jsonl"))
        for line in f.read_text().splitlines()
    ]
    sent = [r.body for r in server.requests]
    assert len(items) == 4 and len(sent) == 4 and all(b["model"] == "strong-model" for b in sent)
    assert sorted(b["messages"][-1]["content"] for b in sent) == sorted(i["prompt"] for i in items)
    assert all(i["reference"] == f"echo: {i['prompt']}" for i in items)
    rubric = yaml.safe_load((tmp_path / "suites" / "prod-billing.yaml").read_text())["grader"]["rubric"]
    assert "{{ reference }}" in rubric


def test_clear_errors(tmp_path, server) -> None:
    cfg_path = _config(tmp_path, server)
    hidden = write_log(tmp_path / "hidden.jsonl", [decision("a"), decision("b")])
    assert "none of the 2 logged decisions kept its text" in _run(
        "import", "traffic", str(hidden), "--sample", "3", "--config", str(cfg_path), ok=False
    )
    assert "--judge 'nobody' is not a candidate" in _run(
        "import",
        "traffic",
        str(_log(tmp_path)),
        "--sample",
        "3",
        "--config",
        str(cfg_path),
        "--judge",
        "nobody",
        ok=False,
    )
    assert "no champion policy" in _run(
        "import",
        "traffic",
        str(_log(tmp_path)),
        "--sample",
        "3",
        "--config",
        str(cfg_path),
        "--reference",
        "strongest",
        "--registry",
        str(tmp_path / "noreg"),
        ok=False,
    )
