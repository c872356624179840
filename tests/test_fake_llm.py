"""The fake LLM server itself: deterministic faults, markers, records, and the process mode."""

from __future__ import annotations

import httpx
import pytest

from tests.fake_llm import FaultPlan, default_answer, fake_llm, fake_llm_process  # noqa: F401


def test_fault_plan_is_seeded_by_prompt_and_attempt():
    plan = FaultPlan({"server_error": 0.2, "drop": 0.1}, seed=5)
    picks = [plan.choose(f"prompt {i}", 1) for i in range(3000)]
    assert picks == [plan.choose(f"prompt {i}", 1) for i in range(3000)]
    assert 0.17 < picks.count("server_error") / 3000 < 0.23
    assert 0.08 < picks.count("drop") / 3000 < 0.12
    assert picks != [FaultPlan(plan.mix, seed=6).choose(f"prompt {i}", 1) for i in range(3000)]


def test_markers_beat_the_mix_and_count_attempts():
    plan = FaultPlan({"server_error": 1.0})
    assert [plan.choose("x [[fault:drop*2]]", a) for a in (1, 2, 3)] == ["drop", "drop", None]
    assert plan.choose("x [[fault:hang]]", 9) == "hang"


def test_bad_plans_are_refused():
    with pytest.raises(ValueError, match="unknown faults"):
        FaultPlan({"explode": 0.1})
    with pytest.raises(ValueError, match="more than 1"):
        FaultPlan({"drop": 0.6, "hang": 0.6})


def test_default_model():
    assert default_answer("What is 12 * 3?") == "36"
    assert default_answer("hi [[fault:drop]]") == "echo: hi"


def test_records_what_arrived_credentials_included_and_404(fake_llm):
    body = {"model": "m", "messages": [{"role": "user", "content": "What is 2 + 2?"}]}
    r = httpx.post(
        fake_llm.openai_base_url + "/chat/completions",
        json=body,
        headers={"Authorization": "Bearer sk-secret-1"},
    )
    assert r.json()["choices"][0]["message"]["content"] == "4"
    assert httpx.get(fake_llm.url + "/v1/nothing").status_code == 404
    (rec,) = fake_llm.requests
    assert rec.body == body and rec.headers["authorization"] == "Bearer sk-secret-1" and rec.attempt == 1


def test_process_mode_serves_and_reports(fake_llm_process):
    body = {"model": "m", "max_tokens": 5, "messages": [{"role": "user", "content": "What is 1 + 2?"}]}
    r = httpx.post(
        fake_llm_process.anthropic_base_url + "/v1/messages",
        json=body,
        headers={"x-api-key": "k", "anthropic-version": "2023-06-01"},
    )
    assert r.json()["content"][0]["text"] == "3" and r.json()["stop_reason"] == "end_turn"
    (rec,) = fake_llm_process.requests()
    assert rec["body"] == body and rec["headers"]["x-api-key"] == "k"
