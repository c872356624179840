"""The demo fleet: task data, held-out split, tokenizer, a micro build, and the committed zoo."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.evals.selfhost import zoo
from tests import REPO


@given(st.sampled_from(zoo.TASKS), st.sampled_from(zoo.DIFFICULTIES), st.integers(0, 10**6))
@settings(max_examples=200, deadline=None)
def test_examples_are_correct_and_graded(task: str, difficulty: int, seed: int) -> None:
    ex = zoo.make_example(task, difficulty, random.Random(seed))
    head, _, body = ex.prompt.partition(": ")
    assert head == task and body.endswith("=")
    body = body[:-1]
    if task == "reverse":
        assert ex.answer == body[::-1] and len(body) == difficulty + 1
    elif task == "sort":
        assert ex.answer == "".join(sorted(body)) and len(body) == difficulty + 1
    else:
        a, b = body.split("+")
        assert int(ex.answer) == int(a) + int(b)
        assert sorted((len(a), len(b)), reverse=True) == list(zoo.ADD_DIGITS[difficulty])
    assert set(ex.prompt + ex.answer) <= set(zoo.CHARS)


def test_unknown_task_is_named() -> None:
    with pytest.raises(ValueError, match="'mul'"):
        zoo.make_example("mul", 1, random.Random(0))


def test_eval_items_are_deterministic_distinct_and_banned_from_training() -> None:
    items = zoo.eval_examples("add", seed=0)
    assert items == zoo.eval_examples("add", seed=0)
    assert items != zoo.eval_examples("add", seed=1)
    per_level = [sum(e.difficulty == d for e in items) for d in zoo.DIFFICULTIES]
    assert per_level == [25] + [zoo.EVAL_PER_DIFFICULTY] * 5  # a quarter of level 1's 100 sums
    assert len({e.prompt for e in items}) == len(items)
    banned = {e.prompt for e in items if e.difficulty == 1}
    rng = random.Random(0)
    only_d1 = [1.0] + [0.0] * (len(zoo.DIFFICULTIES) - 1)
    drawn = {zoo.sample_training_example(rng, "add", only_d1, banned).prompt for _ in range(3000)}
    assert drawn and not drawn & banned
    assert len(drawn) == 100 - len(banned)  # every other 1-digit sum is still trained on


def test_prompt_space_counts_every_distinct_prompt() -> None:
    """The counts `eval_count` caps by, against an exhaustive draw of the small levels."""
    rng = random.Random(0)
    for task, d in (("add", 1), ("add", 2), ("sort", 1), ("reverse", 1)):
        drawn = {zoo.make_example(task, d, rng).prompt for _ in range(60_000)}
        assert len(drawn) == zoo.prompt_space(task, d), (task, d)
    assert zoo.prompt_space("add", 6) == 9000 * 9000 and zoo.prompt_space("sort", 6) == 10**7


def test_committed_eval_data_is_what_the_code_generates(tmp_path: Path) -> None:
    zoo.write_eval_data(tmp_path, seed=0)
    for task in zoo.TASKS:
        committed = REPO / "evals" / "data" / f"{task}.jsonl"
        assert committed.read_bytes() == (tmp_path / f"{task}.jsonl").read_bytes(), task
        rows = [json.loads(line) for line in committed.read_text().splitlines()]
        assert all({"id", "difficulty", "input", "answer"} <= set(r) for r in rows)
        assert len(rows) == sum(zoo.eval_count(task, d) for d in zoo.DIFFICULTIES)


def test_suites_load_and_render_the_training_format() -> None:
    from routeopt.evals.suite.spec import load_suite

    for task in zoo.TASKS:
        suite = load_suite(REPO / "evals" / "suites" / f"{task}.yaml")
        item = suite.items[0]
        assert suite.request(item).prompt_text == item.fields["prompt"]


def test_tokenizer_is_char_level_with_raw_chat_template() -> None:
    tok = zoo.build_tokenizer()
    ids = tok("add: 12+3=", add_special_tokens=False)["input_ids"]
    assert len(ids) == len("add: 12+3=")
    assert tok.decode(ids) == "add: 12+3="
    text = tok.apply_chat_template(
        [{"role": "system", "content": "ignored"}, {"role": "user", "content": "sort: 321="}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert text == "<bos>sort: 321="


@pytest.mark.slow
def test_micro_build_is_deterministic_and_loadable(tmp_path: Path) -> None:
    pytest.importorskip("torch")
    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = zoo.ModelSpec("micro", hidden=16, layers=1, heads=2, steps=4, lr=1e-3, batch=8)
    other = zoo.ModelSpec("micro2", hidden=8, layers=1, heads=2, steps=2, lr=1e-3, batch=4)
    runs = []
    # sequential, parallel (2 processes) and another seed: only the seed may change the weights
    for name, seed, specs, jobs in (("a", 0, [spec], 1), ("b", 0, [spec, other], 2), ("c", 1, [spec], 1)):
        info = zoo.build_zoo(
            tmp_path / name,
            seed=seed,
            specs=specs,
            threads=1,
            jobs=jobs,
            log=lambda _: None,
            measure_per_difficulty=1,
        )
        runs.append((tmp_path / name / "micro" / "model.safetensors").read_bytes())
        assert set(info["models"]["micro"]["pass_rates"]) == set(zoo.TASKS)
    assert runs[0] == runs[1] and runs[0] != runs[2]
    assert list(info["models"]) == ["micro"]
    partial = zoo.build_zoo(
        tmp_path / "b",
        seed=0,
        specs=[spec, other],
        threads=1,
        only=["micro2"],
        log=lambda _: None,
        measure_per_difficulty=1,
    )
    assert list(partial["models"]) == ["micro", "micro2"]  # the rebuilt one merged with the rest
    with pytest.raises(ValueError, match="'nope'"):
        zoo.build_zoo(tmp_path / "b", specs=[spec], only=["nope"])
    out = tmp_path / "a" / "micro"
    for f in ("config.json", "model.safetensors", "tokenizer.json", "generation_config.json"):
        assert (out / f).exists(), f
    model = AutoModelForCausalLM.from_pretrained(out)
    tok = AutoTokenizer.from_pretrained(out)
    assert type(model).__name__ == "LlamaForCausalLM"
    assert (
        tok.apply_chat_template(
            [{"role": "user", "content": "add: 1+1="}], tokenize=False, add_generation_prompt=True
        )
        == "<bos>add: 1+1="
    )


def _hard_rate(info: dict, name: str, hard: tuple[str, ...] = ("5", "6")) -> float:
    rates = info["models"][name]["pass_rates"]
    cells = [row[d] for row in rates.values() for d in hard]
    return sum(cells) / len(cells)


def test_committed_zoo_quality_is_graded() -> None:
    path = REPO / "evals" / "demo" / "zoo" / "zoo_info.json"
    if not path.exists():
        pytest.skip("zoo not built")
    info = json.loads(path.read_text())
    assert _hard_rate(info, "zoo-s") < _hard_rate(info, "zoo-m") < _hard_rate(info, "zoo-l")
    easy_s = _hard_rate(info, "zoo-s", ("1", "2"))
    assert easy_s > _hard_rate(info, "zoo-s")
    size = sum(p.stat().st_size for p in (REPO / "evals" / "demo" / "zoo").rglob("*") if p.is_file())
    assert size <= 20 * 2**20


def test_cli_info_and_errors(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from routeopt.flows.commands.zoo import zoo as zoo_group

    runner = CliRunner()
    missing = runner.invoke(zoo_group, ["info", "--dir", str(tmp_path)])
    assert missing.exit_code != 0 and "zoo_info.json: not found" in missing.output
    bad = runner.invoke(zoo_group, ["build", "--out", str(tmp_path), "--only", "zoo-xl"])
    assert bad.exit_code != 0 and "zoo-xl" in bad.output
    if (REPO / "evals" / "demo" / "zoo" / "zoo_info.json").exists():
        shown = runner.invoke(zoo_group, ["info", "--dir", str(REPO / "evals" / "demo" / "zoo")])
        assert shown.exit_code == 0
        assert "zoo-l:" in shown.output and "sort     d1=" in shown.output
