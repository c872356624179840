"""Every grader's pass and fail cases, spec errors, combinators and custom functions."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

from routeopt.evals.grading import (
    GRADERS,
    Grade,
    Grader,
    GraderSpecError,
    build_grader,
    register_grader,
    render,
)
from routeopt.evals.grading.builtin import extract_choice, extract_json


async def grade(spec: dict, response: str, item: dict | None = None) -> Grade:
    return await build_grader(spec).grade(response, item or {})


# --- registry and spec errors ------------------------------------------------------------------


def test_registry_has_every_grader_and_refuses_duplicates() -> None:
    assert {
        "exact_match",
        "regex",
        "numeric",
        "multiple_choice",
        "contains",
        "not_contains",
        "json",
        "code",
        "judge",
        "custom",
        "all",
        "any",
        "weighted",
    } <= set(GRADERS)
    with pytest.raises(ValueError, match="registered twice"):
        register_grader("numeric")(Grader)


def test_unknown_grader_names_the_known_ones() -> None:
    with pytest.raises(GraderSpecError, match=r"unknown grader 'nope'.*numeric") as err:
        build_grader({"type": "nope"})
    assert err.value.problems[0][0] == ("type",)


def test_nested_spec_errors_are_all_reported_with_their_location() -> None:
    spec = {
        "type": "all",
        "graders": [
            {"type": "numeric", "target": "{{ a }}", "abs_tol": -1},
            {"type": "regex", "pattern": "(", "target": "x"},
            {"type": "bogus"},
        ],
    }
    with pytest.raises(GraderSpecError) as err:
        build_grader(spec)
    locs = [loc for loc, _ in err.value.problems]
    assert ("graders", 0, "abs_tol") in locs
    assert ("graders", 1, "pattern") in locs
    assert ("graders", 2, "type") in locs


def test_missing_type_and_extra_field() -> None:
    with pytest.raises(ValueError, match="needs a `type`"):
        build_grader({"target": "x"})
    with pytest.raises(GraderSpecError, match="tolerance"):
        build_grader({"type": "numeric", "target": "1", "tolerance": 1})


def test_render_is_strict_and_sandboxed() -> None:
    assert render("{{ a }}-{{ b }}", {"a": 1, "b": "x"}) == "1-x"
    with pytest.raises(Exception, match="'b' is undefined"):
        render("{{ a }}{{ b }}", {"a": 1})
    with pytest.raises(Exception):
        render("{{ a.__class__.__mro__[1].__subclasses__() }}", {"a": 1})


# --- text graders --------------------------------------------------------------------------------


async def test_exact_match_with_normalisation() -> None:
    spec = {
        "type": "exact_match",
        "target": "{{ answer }}",
        "normalize": ["strip", "lower", "strip_punctuation", "collapse_whitespace"],
    }
    assert (await grade(spec, "  Paris,  France! ", {"answer": "paris france"})).passed
    fail = await grade(spec, "Lyon", {"answer": "Paris"})
    assert not fail.passed and fail.score == 0 and "expected 'paris'" in fail.reason
    assert not (await grade({"type": "exact_match", "target": "{{ a }}"}, "paris", {"a": "Paris"})).passed


async def test_regex_extract_then_compare() -> None:
    spec = {"type": "regex", "pattern": r"Answer:\s*(\w+)", "target": "{{ a }}", "last": True}
    assert (await grade(spec, "Answer: no\nAnswer: yes", {"a": "yes"})).passed
    assert not (await grade({**spec, "last": False}, "Answer: no\nAnswer: yes", {"a": "yes"})).passed
    missing = await grade(spec, "I don't know", {"a": "yes"})
    assert not missing.passed and "not found" in missing.reason


@pytest.mark.parametrize(
    ("response", "target", "tol", "passed"),
    [
        ("The answer is 1,234.", "1234", {}, True),
        ("so 3.14159", "3.1416", {"abs_tol": 1e-3}, True),
        ("so 3.2", "3.1416", {"abs_tol": 1e-3}, False),
        ("about 105", "100", {"rel_tol": 0.06}, True),
        ("about 107", "100", {"rel_tol": 0.06}, False),
        ("first 7 then 8", "8", {}, True),
        ("-2.5e3", "-2500", {}, True),
    ],
)
async def test_numeric_tolerances(response: str, target: str, tol: dict, passed: bool) -> None:
    g = await grade({"type": "numeric", "target": "{{ t }}", **tol}, response, {"t": target})
    assert g.passed is passed and g.score == float(passed)


async def test_numeric_no_number_and_bad_target() -> None:
    g = await grade({"type": "numeric", "target": "{{ t }}"}, "no idea", {"t": "4"})
    assert not g.passed and g.reason == "no number in response"
    with pytest.raises(ValueError, match="not a number"):
        await grade({"type": "numeric", "target": "{{ t }}"}, "4", {"t": "four"})


@pytest.mark.parametrize(
    ("response", "choice"),
    [
        ("B", "B"),
        ("(c)", None),
        ("(C)", "C"),
        ("The answer is (D).", "D"),
        ("Answer: a", "A"),
        ("A) is wrong because... so the answer is C", "C"),
        ("I pick B.", "B"),
        ("A. no\nB. yes", "A"),
        ("A or B", None),
        ("Nothing here", None),
        ("The answer is a tricky one, but I pick C", "C"),
        ("answer is (b)", "B"),
        ("ANSWER - D", "D"),
    ],
)
def test_extract_choice(response: str, choice: str | None) -> None:
    assert extract_choice(response, "ABCD") == choice


async def test_multiple_choice_pass_fail_and_index_target() -> None:
    spec = {"type": "multiple_choice", "target": "{{ answer }}"}
    assert (await grade(spec, "Answer: B", {"answer": "b"})).passed
    wrong = await grade(spec, "Answer: C", {"answer": "B"})
    assert not wrong.passed and wrong.reason == "chose C, expected B"
    assert not (await grade(spec, "A or B?", {"answer": "B"})).passed
    idx = {"type": "multiple_choice", "target": "{{ label }}", "target_is_index": True, "letters": "ABCDE"}
    assert (await grade(idx, "E", {"label": 4})).passed
    with pytest.raises(ValueError, match="not one of the letters"):
        await grade(spec, "A", {"answer": "Z"})


async def test_multiple_choice_by_option_text() -> None:
    spec = {
        "type": "multiple_choice",
        "target": "{{ answer }}",
        "letters": "ABC",
        "choices": ["{{ opts[0] }}", "{{ opts[1] }}", "{{ opts[2] }}"],
    }
    item = {"answer": "B", "opts": ["Venus", "Mars", "Jupiter"]}
    assert (await grade(spec, "mars.", item)).passed
    assert not (await grade(spec, "Venus", item)).passed
    assert not (await grade(spec, "Mars or Venus", item)).passed
    with pytest.raises(GraderSpecError, match="choices has 2 entries for 3 letters"):
        build_grader({**spec, "choices": ["x", "y"]})


async def test_contains_and_not_contains() -> None:
    spec = {"type": "contains", "target": ["{{ a }}", "Berlin"]}
    assert (await grade(spec, "paris and berlin", {"a": "Paris"})).passed
    part = await grade(spec, "only paris", {"a": "Paris"})
    assert not part.passed and part.score == 0.5 and "Berlin" in part.reason
    assert (await grade({**spec, "mode": "any"}, "only paris", {"a": "Paris"})).passed
    assert not (await grade({**spec, "case_sensitive": True}, "paris berlin", {"a": "Paris"})).passed
    nc = {"type": "not_contains", "target": ["sorry", "as an AI"]}
    assert (await grade(nc, "Here it is.", {})).passed
    bad = await grade(nc, "Sorry, as an AI I can't", {})
    assert not bad.passed and bad.score == 0.0


# --- JSON ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        '{"a": 1}',
        'Sure!\n```json\n{"a": 1}\n```\nDone.',
        'The result is {"a": 1} as asked.',
    ],
)
def test_extract_json_finds_the_object(text: str) -> None:
    assert extract_json(text) == (True, {"a": 1})


def test_extract_json_nothing() -> None:
    assert extract_json("no json {here") == (False, None)


JSON_SPEC = {
    "type": "json",
    "schema": {
        "type": "object",
        "required": ["name", "age"],
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    },
    "fields": {"name": "{{ name }}", "age": "{{ age }}", "tags.0": "x"},
}


async def test_json_pass() -> None:
    g = await grade(
        JSON_SPEC, '```json\n{"name": "Ann", "age": 34, "tags": ["x"]}\n```', {"name": "Ann", "age": 34}
    )
    assert g == Grade(1.0, True, None)


async def test_json_schema_and_field_failures_give_partial_score() -> None:
    g = await grade(JSON_SPEC, '{"name": "Ann", "age": "34", "tags": ["y"]}', {"name": "Ann", "age": 34})
    # checks: parses ok, schema fails (age is a string), name ok, age matches the rendered
    # template "34" as text (types are the schema's job), tags.0 wrong
    assert not g.passed and g.score == pytest.approx(3 / 5)
    assert "schema: age" in g.reason and "tags.0: got 'y'" in g.reason and "age: got" not in g.reason
    typed = await grade({"type": "json", "fields": {"n": 2, "ok": True}}, '{"n": 2.0, "ok": 1}', {})
    assert typed.score == pytest.approx(2 / 3) and "ok: got 1" in typed.reason
    none = await grade(JSON_SPEC, "I can't", {"name": "Ann", "age": 1})
    assert none == Grade(0.0, False, "no JSON found in response")


def test_json_invalid_schema_is_a_spec_error() -> None:
    with pytest.raises(GraderSpecError, match="not a valid JSON Schema"):
        build_grader({"type": "json", "schema": {"type": "nonsense"}})


# --- custom and combinators --------------------------------------------------------------------


def _custom_module(tmp_path: Path) -> Path:
    path = tmp_path / "my_graders.py"
    path.write_text(
        "from routeopt.evals.grading import Grade\n"
        "def length_ok(response, item, limit=5):\n    return len(response) <= limit\n"
        "def half(response, item):\n    return 0.5\n"
        "async def full(response, item):\n    return Grade(1.0, True, 'async ok')\n"
        "def broken(response, item):\n    raise KeyError('oops')\n"
        "def weird(response, item):\n    return 'yes'\n"
    )
    return path


async def test_custom_functions_by_file(tmp_path: Path) -> None:
    f = _custom_module(tmp_path)
    assert (await grade({"type": "custom", "function": f"{f}:length_ok"}, "abc")).passed
    assert not (
        await grade({"type": "custom", "function": f"{f}:length_ok", "params": {"limit": 2}}, "abc")
    ).passed
    assert (await grade({"type": "custom", "function": f"{f}:half", "threshold": 0.5}, "x")) == Grade(
        0.5, True
    )
    assert not (await grade({"type": "custom", "function": f"{f}:half"}, "x")).passed
    assert (await grade({"type": "custom", "function": f"{f}:full"}, "x")).reason == "async ok"
    with pytest.raises(KeyError):
        await grade({"type": "custom", "function": f"{f}:broken"}, "x")
    with pytest.raises(TypeError, match="returned str"):
        await grade({"type": "custom", "function": f"{f}:weird"}, "x")


def test_custom_resolution_errors(tmp_path: Path) -> None:
    f = _custom_module(tmp_path)
    for ref, msg in [
        ("nomodule_xyz:fn", "cannot import"),
        (f"{f}:missing", "no callable"),
        ("json", "must look like"),
        (f"{tmp_path}/absent.py:fn", "file not found"),
    ]:
        with pytest.raises(GraderSpecError, match=msg):
            build_grader({"type": "custom", "function": ref})
    assert build_grader({"type": "custom", "function": "json:dumps"}).fingerprint()


async def test_custom_relative_to_suite_folder(tmp_path: Path) -> None:
    from routeopt.evals.grading import GraderContext

    _custom_module(tmp_path)
    g = build_grader(
        {"type": "custom", "function": "my_graders.py:length_ok"}, GraderContext(base_dir=tmp_path)
    )
    assert (await g.grade("ab", {})).passed


async def test_all_any_weighted() -> None:
    eq = {"type": "exact_match", "target": "{{ a }}"}
    has = {"type": "contains", "target": "4"}
    item = {"a": "4"}
    assert (await grade({"type": "all", "graders": [eq, has]}, "4", item)).passed
    both = await grade({"type": "all", "graders": [eq, has]}, "it is 4", item)
    assert not both.passed and both.score == 0.5 and "exact_match" in both.reason
    assert (await grade({"type": "any", "graders": [eq, has]}, "it is 4", item)) == Grade(1.0, True, None)
    assert not (await grade({"type": "any", "graders": [eq, has]}, "five", item)).passed
    w = {"type": "weighted", "graders": [eq, has], "weights": [3, 1], "threshold": 0.25}
    g = await grade(w, "it is 4", item)
    assert g.passed and g.score == pytest.approx(0.25)
    assert not (await grade({**w, "threshold": 0.5}, "it is 4", item)).passed


def test_weighted_spec_errors() -> None:
    eq = {"type": "exact_match", "target": "x"}
    with pytest.raises(GraderSpecError, match="weights has 1 entries for 2 graders"):
        build_grader({"type": "weighted", "graders": [eq, eq], "weights": [1]})
    with pytest.raises(GraderSpecError, match="positive sum"):
        build_grader({"type": "weighted", "graders": [eq], "weights": [0]})
    with pytest.raises(GraderSpecError, match="graders"):
        build_grader({"type": "all", "graders": []})


@given(
    st.lists(st.floats(0, 1), min_size=1, max_size=5), st.lists(st.floats(0.01, 10), min_size=5, max_size=5)
)
def test_weighted_score_is_a_convex_combination(scores: list[float], weights: list[float]) -> None:
    import asyncio

    from routeopt.evals.grading.builtin import Weighted

    class Fixed(Grader):
        type: str = "fixed"
        value: float

        async def grade(self, response: str, item: dict) -> Grade:
            return Grade(self.value, self.value >= 0.5)

    w = Weighted(graders=[{}] * len(scores), weights=weights[: len(scores)])
    w._children = [Fixed(value=s) for s in scores]
    g = asyncio.run(w.grade("", {}))
    assert min(scores) - 1e-9 <= g.score <= max(scores) + 1e-9


def test_grade_rejects_out_of_range_scores() -> None:
    for bad in (-0.1, 1.1, float("nan")):
        with pytest.raises(ValueError):
            Grade(bad, False)
    assert json.dumps(Grade(1.0, True).__dict__)


@given(st.floats(allow_nan=False, allow_infinity=False, width=64))
def test_numeric_reads_back_any_printed_float(x: float) -> None:
    import asyncio

    g = build_grader({"type": "numeric", "target": "{{ t }}", "rel_tol": 1e-12})
    assert asyncio.run(g.grade(f"Working... the answer is {x!r}.", {"t": repr(x)})).passed


@example("! a", ["strip", "strip_punctuation"])
@given(
    st.text(max_size=40),
    st.lists(
        st.sampled_from(["strip", "lower", "collapse_whitespace", "strip_punctuation", "nfkc"]), max_size=5
    ),
)
def test_normalisation_is_idempotent_so_exact_match_is_reflexive(text: str, steps: list) -> None:
    import asyncio

    from routeopt.evals.grading.builtin import normalize

    once = normalize(text, steps)
    assert normalize(once, steps) == once
    g = build_grader({"type": "exact_match", "target": "{{ t }}", "normalize": steps})
    assert asyncio.run(g.grade(text, {"t": text})).passed


def test_a_grader_from_another_distribution_comes_in_through_its_entry_point(tmp_path, monkeypatch) -> None:
    """A real (tiny) installed distribution declares `routeopt.graders`; a suite that names the
    grader gets it without anyone importing the plugin, and only a Grader subclass is accepted."""
    from routeopt.evals.grading.base import GRADERS

    (tmp_path / "shout_plugin.py").write_text(
        "from typing import Literal\n"
        "from routeopt.evals.grading import Grade, Grader\n"
        "class Shout(Grader):\n"
        "    type: Literal['shout'] = 'shout'\n"
        "    async def grade(self, response, item):\n"
        "        return Grade(1.0 if response.isupper() else 0.0, response.isupper())\n"
        "not_a_grader = 42\n"
    )
    info = tmp_path / "shout_plugin-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: shout-plugin\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(
        "[routeopt.graders]\nshout = shout_plugin:Shout\nbogus = shout_plugin:not_a_grader\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr("routeopt.evals.grading.base.GRADERS", dict(GRADERS))  # leave the registry as it was
    assert "shout" not in GRADERS
    g = build_grader({"type": "shout"})
    assert asyncio.run(g.grade("HEY", {})).passed and not asyncio.run(g.grade("hey", {})).passed
    with pytest.raises(TypeError, match="not a Grader subclass"):
        build_grader({"type": "bogus"})


# --- graders travel to workers in other processes ----------------------------------------------


def _every_grader(tmp_path: Path, judge_url: str) -> list[tuple[dict, str, dict]]:
    """(spec, response, item) for every grader type, each response passing."""
    from routeopt.evals.config import Candidate, Config

    f = _custom_module(tmp_path)
    item = {"a": "4", "tests": ["assert add(2, 2) == 4"]}
    code = "```python\ndef add(a, b):\n    return a + b\n```"
    judge = {"type": "judge", "candidate": "judge", "rubric": "Is {{ response }} four?"}
    specs = [
        ({"type": "exact_match", "target": "{{ a }}"}, "4"),
        ({"type": "regex", "pattern": r"is (\d+)", "target": "{{ a }}"}, "it is 4"),
        ({"type": "numeric", "target": "{{ a }}"}, "4.0"),
        ({"type": "multiple_choice", "target": "B", "letters": "AB", "choices": ["3", "4"]}, "4"),
        ({"type": "contains", "target": "4"}, "it is 4"),
        (
            {"type": "json", "schema": {"type": "object", "required": ["a"]}, "fields": {"a": "{{ a }}"}},
            '{"a": "4"}',
        ),
        ({"type": "code", "tests_field": "tests", "timeout_s": 30}, code),
        (judge, "4"),
        ({"type": "custom", "function": f"{f}:length_ok"}, "4"),
        ({"type": "all", "graders": [{"type": "contains", "target": "4"}, judge]}, "4"),
        ({"type": "any", "graders": [{"type": "code", "tests_field": "tests"}, judge]}, code),
        (
            {
                "type": "weighted",
                "graders": [{"type": "custom", "function": f"{f}:half"}, judge],
                "threshold": 0.5,
            },
            "4",
        ),
    ]
    cfg = Config(
        candidates=[
            Candidate(
                name="judge",
                provider="openai",
                model="j",
                base_url=judge_url,
                input_price_per_mtok=1,
                output_price_per_mtok=1,
                timeout_s=30,
            )
        ]
    )
    return [(spec, response, item, cfg) for spec, response in specs]


async def test_every_grader_pickles_without_runtime_state_and_grades_the_same(tmp_path: Path) -> None:
    """Dask sends suites to worker processes with pickle: locks, clients and loaded functions
    stay behind and are rebuilt there; a custom grader's file need not exist on the worker."""
    import pickle

    from routeopt.evals.grading import GraderContext
    from routeopt.evals.grading.sandbox import isolation
    from tests.fake_llm import FakeLLM

    no_sandbox = isinstance(isolation(False), str)
    with FakeLLM(answer_fn=lambda p: "SCORE: 9" if p.startswith("Is ") else "x") as server:
        cases = _every_grader(tmp_path, server.openai_base_url)
        assert {s["type"] for s, *_ in cases} >= set(GRADERS) - {"not_contains"}
        for spec, response, item, cfg in cases:
            if no_sandbox and "code" in json.dumps(spec):
                continue
            grader = build_grader(spec, GraderContext(config=cfg, base_dir=tmp_path))
            before = await grader.grade(response, item)
            copy = pickle.loads(pickle.dumps(grader))
            (tmp_path / "my_graders.py").rename(tmp_path / "moved.py")  # not on the "worker"
            try:
                after = await copy.grade(response, item)
            finally:
                (tmp_path / "moved.py").rename(tmp_path / "my_graders.py")
            assert before == after and after.passed, (spec["type"], before, after)
            assert copy.fingerprint() == grader.fingerprint()
            await grader.aclose()
            await copy.aclose()
