"""Suite loading: prompts, overrides, includes, versions, and every bad input with file/line/field."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from routeopt.evals.config import Config
from routeopt.evals.suite.spec import (
    Problem,
    SuiteError,
    check_suite,
    discover_suites,
    load_suite,
)

ROWS = [{"id": f"q{i}", "question": f"What is {i} + {i}?", "answer": 2 * i} for i in range(10)]


def write(folder: Path, name: str, text: str) -> Path:
    path = folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(text).lstrip())
    return path


def data(folder: Path, rows: list[dict] = ROWS, name: str = "data.jsonl") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


BASE = """
name: base
owner: alice
tags: [math]
dataset: {path: data.jsonl, id_field: id}
prompt:
  system: "Answer with a number."
  template: "{{ question }}"
generation: {max_tokens: 8}
grader: {type: numeric, target: "{{ answer }}"}
"""


def config(*names: str) -> Config:
    return Config.model_validate(
        {
            "candidates": [
                {
                    "name": n,
                    "provider": "openai",
                    "model": n,
                    "input_price_per_mtok": 1,
                    "output_price_per_mtok": 1,
                }
                for n in names
            ]
        }
    )


def problems(path: Path, cfg: Config | None = None) -> list[Problem]:
    return [p for p in check_suite(path, cfg) if p.severity == "error"]


# --- loading and requests ----------------------------------------------------------------------


def test_loads_items_prompt_and_generation(tmp_path: Path) -> None:
    data(tmp_path)
    suite = load_suite(write(tmp_path, "s.yaml", BASE))
    assert suite.name == "base" and len(suite.items) == 10 and suite.items[3].id == "q3"
    assert suite.items[3].fields["answer"] == 6
    req = suite.request(suite.items[3])
    assert [(m.role, m.content) for m in req.messages] == [
        ("system", "Answer with a number."),
        ("user", "What is 3 + 3?"),
    ]
    assert req.settings.max_tokens == 8 and req.settings.temperature == 0.0
    assert suite.prompt_text(suite.items[3]) == "Answer with a number.\nWhat is 3 + 3?"
    assert len(suite.version) == 12 and suite.warnings == []


def test_chat_messages_and_stop(tmp_path: Path) -> None:
    data(tmp_path)
    suite = load_suite(
        write(
            tmp_path,
            "s.yaml",
            """
        name: chat
        dataset: {path: data.jsonl}
        prompt:
          messages:
            - {role: user, content: "Hi"}
            - {role: assistant, content: "Hello. Ask."}
            - {role: user, content: "{{ question }}"}
        generation: {stop: ["\\n"], top_p: 0.5}
        grader: {type: numeric, target: "{{ answer }}"}
    """,
        )
    )
    req = suite.request(suite.items[1])
    assert [m.role for m in req.messages] == ["user", "assistant", "user"]
    assert req.messages[-1].content == "What is 1 + 1?" and req.system is None
    assert req.settings.stop == ("\n",) and req.settings.top_p == 0.5
    assert suite.items[1].id == "1"  # no id_field: row numbers


def test_few_shot_from_another_file(tmp_path: Path) -> None:
    data(tmp_path)
    data(tmp_path, [{"q": f"{i}*2", "a": 2 * i} for i in range(20)], "train.jsonl")
    write(tmp_path, "_base.yaml", BASE)
    path = write(
        tmp_path,
        "s.yaml",
        """include: _base.yaml
prompt:
  few_shot:
    dataset: {path: train.jsonl}
    n: 3
    seed: 4
    template: "Q: {{ q }}"
    answer: "A: {{ a }}"
""",
    )
    suite = load_suite(path)
    req = suite.request(suite.items[0])
    roles = [m.role for m in req.messages]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user", "assistant", "user"]
    shots = [m.content for m in req.messages[1:7]]
    assert all(s.startswith(("Q: ", "A: ")) for s in shots)
    assert load_suite(path).request(load_suite(path).items[0]) == req  # seeded: same shots
    other = load_suite(write(tmp_path, "s2.yaml", path.read_text().replace("seed: 4", "seed: 5")))
    assert other.request(other.items[0]) != req and other.version != suite.version


def test_few_shot_from_the_same_file_never_shows_an_item_its_own_answer(tmp_path: Path) -> None:
    data(tmp_path)
    write(tmp_path, "_base.yaml", BASE)
    suite = load_suite(
        write(
            tmp_path,
            "s.yaml",
            """include: _base.yaml
prompt:
  few_shot: {dataset: {path: data.jsonl, id_field: id}, n: 3, answer: "{{ answer }}"}
""",
        )
    )
    shot_ids = {s.id for s in suite.few_shot}
    assert len(shot_ids) == 3 and not shot_ids & {i.id for i in suite.items}
    assert len(suite.items) == 7 and sorted(suite.skipped) == sorted(
        f"item {i!r}: it is a few-shot example" for i in shot_ids
    )


def test_few_shot_template_errors_are_reported(tmp_path: Path) -> None:
    data(tmp_path)
    write(tmp_path, "_base.yaml", BASE)
    path = write(
        tmp_path,
        "s.yaml",
        """include: _base.yaml
prompt:
  few_shot: {dataset: {path: data.jsonl}, n: 2, answer: "{{ solution }}"}
""",
    )
    [p] = problems(path)
    assert p.field == "prompt.few_shot.answer" and "'solution' is undefined" in p.message


def test_per_candidate_generation_overrides(tmp_path: Path) -> None:
    data(tmp_path)
    path = write(
        tmp_path,
        "s.yaml",
        BASE
        + """
overrides:
  big: {generation: {max_tokens: 100, temperature: 0.3}}
""",
    )
    suite = load_suite(path, config=config("big", "small"))
    item = suite.items[0]
    assert suite.request(item).settings.max_tokens == 8
    assert suite.request(item, "small").settings.max_tokens == 8
    big = suite.request(item, config("big").candidates[0]).settings
    assert (big.max_tokens, big.temperature) == (100, 0.3)
    warned = load_suite(path, config=config("small"))
    assert [w.field for w in warned.warnings] == ["overrides.big"]
    assert warned.warnings[0].line == 12
    bad = write(tmp_path, "bad.yaml", BASE + "overrides:\n  big: {generation: {max_tokens: 0}}\n")
    assert [p.field for p in problems(bad)] == ["overrides.big.generation.max_tokens"]


def test_limit_samples_deterministically_in_dataset_order(tmp_path: Path) -> None:
    data(tmp_path, [{"id": i, "question": "x", "answer": i} for i in range(100)])
    text = BASE.replace("id_field: id}", "id_field: id, limit: 10, seed: 3}")
    a = load_suite(write(tmp_path, "a.yaml", text))
    b = load_suite(write(tmp_path, "b.yaml", text))
    c = load_suite(write(tmp_path, "c.yaml", text.replace("seed: 3", "seed: 4")))
    ids = [i.id for i in a.items]
    assert ids == [i.id for i in b.items] and len(ids) == 10
    assert [int(i) for i in ids] == sorted(int(i) for i in ids)
    assert ids != [i.id for i in c.items] and a.version != c.version


# --- versions ------------------------------------------------------------------------------------


def test_version_tracks_results_not_metadata_or_location(tmp_path: Path) -> None:
    data(tmp_path)
    v0 = load_suite(write(tmp_path, "s.yaml", BASE)).version
    meta = BASE.replace("owner: alice", "owner: bob\ndescription: new words").replace("[math]", "[x]")
    assert load_suite(write(tmp_path, "s.yaml", meta)).version == v0
    moved = tmp_path / "elsewhere"
    data(moved)
    assert load_suite(write(moved, "s.yaml", BASE)).version == v0
    assert load_suite(write(tmp_path, "s.yaml", BASE.replace("max_tokens: 8", "max_tokens: 9"))).version != v0
    data(tmp_path, ROWS[:-1] + [{**ROWS[-1], "answer": 0}])
    assert load_suite(write(tmp_path, "s.yaml", BASE)).version != v0


def test_custom_grader_code_changes_the_version(tmp_path: Path) -> None:
    data(tmp_path)
    (tmp_path / "g.py").write_text("def ok(response, item):\n    return True\n")
    text = BASE.replace('{type: numeric, target: "{{ answer }}"}', '{type: custom, function: "g.py:ok"}')
    v1 = load_suite(write(tmp_path, "s.yaml", text)).version
    (tmp_path / "g.py").write_text("def ok(response, item):\n    return False\n")
    assert load_suite(write(tmp_path, "s.yaml", text)).version != v1


# --- include -------------------------------------------------------------------------------------


def test_include_deep_merges_and_resolves_paths_per_file(tmp_path: Path) -> None:
    data(tmp_path / "base")
    write(tmp_path / "base", "_base.yaml", BASE)
    variant = write(
        tmp_path / "variants",
        "v.yaml",
        """
        include: ../base/_base.yaml
        name: variant
        generation: {temperature: 0.5}
        prompt: {system: "Be brief."}
    """,
    )
    suite = load_suite(variant)
    assert suite.name == "variant" and len(suite.items) == 10
    s = suite.request(suite.items[0])
    assert (s.settings.max_tokens, s.settings.temperature) == (8, 0.5)
    assert s.messages[0].content == "Be brief." and s.messages[1].content == "What is 0 + 0?"
    assert suite.spec.owner == "alice"


def test_include_a_different_grader_type_replaces_it(tmp_path: Path) -> None:
    data(tmp_path)
    write(
        tmp_path,
        "_base.yaml",
        BASE.replace('target: "{{ answer }}"}', 'target: "{{ answer }}", abs_tol: 0.5}'),
    )
    suite = load_suite(
        write(
            tmp_path,
            "v.yaml",
            """
        include: _base.yaml
        name: v
        grader: {type: exact_match, target: "{{ answer }}"}
    """,
        )
    )
    assert suite.grader.type == "exact_match"
    patched = load_suite(write(tmp_path, "w.yaml", "include: _base.yaml\nname: w\ngrader: {abs_tol: 2}\n"))
    assert patched.grader.type == "numeric" and patched.grader.abs_tol == 2


def test_include_cycle_is_detected(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", "include: b.yaml\nname: a\n")
    write(tmp_path, "b.yaml", "include: c.yaml\n")
    write(tmp_path, "c.yaml", "include: a.yaml\n")
    with pytest.raises(SuiteError, match=r"include cycle: a.yaml -> b.yaml -> c.yaml -> a.yaml"):
        load_suite(tmp_path / "a.yaml")


def test_missing_include_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "a.yaml", "name: a\ninclude: nope.yaml\n")
    [p] = problems(path)
    assert (p.file, p.line, p.field) == (path, 2, "include") and "file not found" in p.message


def test_error_in_included_file_points_at_that_file(tmp_path: Path) -> None:
    data(tmp_path)
    base = write(tmp_path, "_base.yaml", BASE.replace("max_tokens: 8", "max_tokens: -8"))
    [p] = problems(write(tmp_path, "v.yaml", "include: _base.yaml\nname: v\n"))
    assert (p.file, p.line, p.field) == (base, 8, "generation.max_tokens")


# --- bad input: every problem, each with file, line and field ---------------------------------------


def test_malformed_yaml_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, "s.yaml", "name: x\ndataset: {path: a.jsonl\nprompt: y\n")
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    [p] = err.value.problems
    assert p.file == path and p.line == 3 and "not valid YAML" in p.message
    assert str(path) in str(err.value)


def test_duplicate_key_is_an_error_not_a_silent_override(tmp_path: Path) -> None:
    data(tmp_path)
    [p] = problems(write(tmp_path, "s.yaml", BASE + "prompt: {template: other}\n"))
    assert p.line == 10 and "duplicate key 'prompt' (first at line 5)" in p.message


def test_suite_file_that_is_not_utf8(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_bytes(b"name: caf\xe9\n")
    [p] = problems(path)
    assert p.file == path and p.message.startswith("not UTF-8 text")


def test_top_level_not_a_mapping(tmp_path: Path) -> None:
    [p] = problems(write(tmp_path, "s.yaml", "- a\n- b\n"))
    assert "expected a mapping" in p.message


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    data(tmp_path)
    path = write(
        tmp_path,
        "s.yaml",
        """
        name: Bad Name
        dataset: {path: data.jsonl, id_field: id}
        prompt:
          template: "{{ question }} {{ missing_field }}"
        generation: {max_tokens: 0}
        grader: {type: numeric, target: "{{ answer }}", abs_tol: -1}
        colour: blue
    """,
    )
    found = {(p.line, p.field) for p in problems(path)}
    assert {
        (1, "name"),
        (4, "prompt.template"),
        (5, "generation.max_tokens"),
        (6, "grader.abs_tol"),
        (7, "colour"),
    } <= found
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    assert len(err.value.problems) >= 5 and f"{path}:4: prompt.template" in str(err.value)


def test_unknown_grader(tmp_path: Path) -> None:
    data(tmp_path)
    path = write(tmp_path, "s.yaml", BASE.replace("type: numeric", "type: numerik"))
    [p] = problems(path)
    assert (p.line, p.field) == (9, "grader.type") and "known graders" in p.message


def test_template_with_missing_field_names_items(tmp_path: Path) -> None:
    data(tmp_path, [{"id": "a", "question": "q", "answer": 1}, {"id": "b", "answer": 2}])
    [p] = problems(write(tmp_path, "s.yaml", BASE))
    assert p.field == "prompt.template" and p.message == "'question' is undefined (item 'b')"


def test_grader_target_with_missing_field_is_caught_at_load(tmp_path: Path) -> None:
    data(tmp_path)
    [p] = problems(write(tmp_path, "s.yaml", BASE.replace("{{ answer }}", "{{ answr }}")))
    assert (
        p.field == "grader.target" and p.message == "'answr' is undefined (item 'q0', 'q1', 'q2' and 7 more)"
    )


def test_template_syntax_error(tmp_path: Path) -> None:
    data(tmp_path)
    [p] = problems(write(tmp_path, "s.yaml", BASE.replace('"{{ question }}"', '"{{ question "')))
    assert p.field == "prompt.template" and "syntax error" in p.message


def test_empty_dataset(tmp_path: Path) -> None:
    (tmp_path / "data.jsonl").write_text("\n")
    [p] = problems(write(tmp_path, "s.yaml", BASE))
    assert p.field == "dataset" and p.line == 4 and "no usable rows" in p.message


def test_missing_dataset_file(tmp_path: Path) -> None:
    [p] = problems(write(tmp_path, "s.yaml", BASE))
    assert "dataset file not found" in p.message and str(tmp_path / "data.jsonl") in p.message


def test_bad_rows_are_named_by_line_or_skipped(tmp_path: Path) -> None:
    lines = [json.dumps(ROWS[0]), "{not json", json.dumps(ROWS[1]), "[1, 2]", json.dumps({"question": "q"})]
    (tmp_path / "data.jsonl").write_text("\n".join(lines) + "\n")
    [p] = problems(write(tmp_path, "s.yaml", BASE))
    assert f"{tmp_path / 'data.jsonl'}:2: not valid JSON" in p.message
    assert "data.jsonl:4: expected a JSON object" in p.message
    assert "data.jsonl:5: id_field: row has no 'id'" in p.message
    suite = load_suite(
        write(tmp_path, "t.yaml", BASE.replace("id_field: id}", "id_field: id, skip_bad_rows: true}"))
    )
    assert [i.id for i in suite.items] == ["q0", "q1"] and len(suite.skipped) == 3


def test_items_whose_template_fails_can_be_skipped(tmp_path: Path) -> None:
    data(tmp_path, [ROWS[0], {"id": "b", "answer": 2}, ROWS[2]])
    suite = load_suite(
        write(tmp_path, "s.yaml", BASE.replace("id_field: id}", "id_field: id, skip_bad_rows: true}"))
    )
    assert [i.id for i in suite.items] == ["q0", "q2"]
    assert suite.skipped == ["item 'b': a template does not render"]
    assert [w.field for w in suite.warnings] == ["prompt.template"]


def test_duplicate_ids_are_an_error(tmp_path: Path) -> None:
    data(tmp_path, [ROWS[0], ROWS[1], ROWS[0]])
    [p] = problems(write(tmp_path, "s.yaml", BASE))
    assert "id 'q0' repeats the row at" in p.message and "data.jsonl:3" in p.message


def test_prompt_needs_exactly_one_form(tmp_path: Path) -> None:
    data(tmp_path)
    text = BASE.replace(
        '  template: "{{ question }}"', '  template: "{{ question }}"\n  messages: [{role: user, content: x}]'
    )
    [p] = problems(write(tmp_path, "s.yaml", text))
    assert p.field == "prompt" and "exactly one of `template`" in p.message


def test_judge_needs_a_config(tmp_path: Path) -> None:
    data(tmp_path)
    text = BASE.replace(
        '{type: numeric, target: "{{ answer }}"}', '{type: judge, candidate: j, rubric: "{{ response }}"}'
    )
    path = write(tmp_path, "s.yaml", text)
    [p] = problems(path)
    assert p.field == "grader" and "config" in p.message
    [p] = problems(path, config("other"))
    assert "'j' is not in the config" in p.message
    assert load_suite(path, config=config("j")).grader.type == "judge"
    typo = write(
        tmp_path,
        "t.yaml",
        text.replace('rubric: "{{ response }}"', 'rubric: "{{ response }} {{ refrence }}"'),
    )
    [p] = problems(typo, config("j"))
    assert p.field == "grader.rubric" and "'refrence' is undefined" in p.message


def test_discover_suites_skips_bases(tmp_path: Path) -> None:
    for n in ("b.yaml", "a.yaml", "_base.yaml", "notes.txt"):
        (tmp_path / n).write_text("")
    assert [p.name for p in discover_suites(tmp_path)] == ["a.yaml", "b.yaml"]
    assert [p.name for p in discover_suites(tmp_path, ["b"])] == ["b.yaml"]
    with pytest.raises(SuiteError, match="no suite named"):
        discover_suites(tmp_path, ["zzz"])
    with pytest.raises(SuiteError, match="not found"):
        discover_suites(tmp_path / "nope")
