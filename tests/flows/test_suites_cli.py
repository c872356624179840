"""`routeopt suites list | validate | new | show` through click's test runner."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

from routeopt.flows.commands.suites import suites

CONFIG = """
candidates:
  - {name: small, provider: openai, model: s, base_url: "http://127.0.0.1:9/v1", input_price_per_mtok: 1, output_price_per_mtok: 1}
  - {name: big, provider: openai, model: b, base_url: "http://127.0.0.1:9/v1", input_price_per_mtok: 5, output_price_per_mtok: 5}
suites_dir: suites
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "routeopt.yaml").write_text(CONFIG)
    (tmp_path / "suites").mkdir()
    return tmp_path


def run(project: Path, *args: str) -> "object":
    return CliRunner().invoke(
        suites, [*args, "--config", str(project / "routeopt.yaml")], catch_exceptions=False
    )


def test_new_writes_a_working_scaffold_that_validates_and_shows(project: Path) -> None:
    res = run(project, "new", "my-suite")
    assert res.exit_code == 0, res.output
    suite_file = project / "suites" / "my-suite.yaml"
    assert suite_file.exists() and (project / "data" / "my-suite.jsonl").exists()
    assert "path: ../data/my-suite.jsonl" in suite_file.read_text()
    res = run(project, "validate", str(suite_file))
    assert res.exit_code == 0 and f"ok  {suite_file}" in res.output
    res = run(project, "show", "my-suite")
    assert res.exit_code == 0, res.output
    assert "name: my-suite" in res.output and "--- user\nWhat is 2 + 3?" in res.output
    again = run(project, "new", "my-suite")
    assert again.exit_code != 0 and "exists" in again.output
    bad = run(project, "new", "Bad Name")
    assert bad.exit_code != 0 and "lower-case" in bad.output


def test_validate_reports_every_problem_with_line_and_exits_1(project: Path) -> None:
    run(project, "new", "good")
    bad = project / "suites" / "bad.yaml"
    bad.write_text(
        "name: bad\n"
        "dataset: {path: ../data/good.jsonl, id_field: id}\n"
        "prompt: {template: '{{ questionn }}'}\n"
        "generation: {max_tokens: 0}\n"
        "grader: {type: nope}\n"
    )
    res = run(project, "validate", str(project / "suites"))
    assert res.exit_code == 1
    out = res.output
    assert f"{bad}:3: prompt.template: 'questionn' is undefined" in out
    assert f"{bad}:4: generation.max_tokens:" in out
    assert f"{bad}:5: grader.type: unknown grader 'nope'" in out
    assert f"ok  {project / 'suites' / 'good.yaml'}" in out
    assert "3 problem(s) in 2 file(s)" in out


def test_validate_says_which_field_a_misspelt_one_was_meant_to_be(project: Path) -> None:
    run(project, "new", "good")
    typo = project / "suites" / "typo.yaml"
    typo.write_text(
        "name: typo\n"
        "dataset: {path: ../data/good.jsonl, id_field: id}\n"
        "prompt:\n"
        "  templat: '{{ question }}'\n"
        "gradr: {type: numeric, target: '{{ answer }}'}\n"
        "generation: {max_tokens: 4, temprature: 0}\n"
        "owner: {name: x}\n"
        "zzz: 1\n"
    )
    res = run(project, "validate", str(typo))
    assert res.exit_code == 1
    out = res.output
    assert f"{typo}:4: prompt.templat: Extra inputs are not permitted; did you mean 'template'?" in out
    assert f"{typo}:5: gradr: Extra inputs are not permitted; did you mean 'grader'?" in out
    assert (
        f"{typo}:6: generation.temprature: Extra inputs are not permitted; did you mean 'temperature'?" in out
    )
    assert f"{typo}:8: zzz: Extra inputs are not permitted\n" in out  # nothing is spelt like it
    typo.write_text(typo.read_text().replace("gradr:", "grader:").replace("target:", "targt:"))
    res = run(project, "validate", str(typo))
    assert f"{typo}:5: grader.targt: Extra inputs are not permitted; did you mean 'target'?" in res.output


def test_validate_malformed_yaml(project: Path) -> None:
    (project / "suites" / "broken.yaml").write_text("name: [unclosed\n")
    res = run(project, "validate")
    assert res.exit_code == 1 and "broken.yaml:2: (yaml): not valid YAML" in res.output


def test_list_shows_versions_and_errors(project: Path) -> None:
    run(project, "new", "alpha")
    (project / "suites" / "beta.yaml").write_text("name: beta\n")
    res = run(project, "list")
    assert res.exit_code == 0
    table, _, failures = res.output.partition("\nnot loadable")
    lines = {line.split()[0]: line for line in table.splitlines()[1:]}
    assert "numeric" in lines["alpha"] and "3" in lines["alpha"].split()
    assert "ERROR" in lines["beta"]
    assert "beta.yaml" in failures and "dataset: Field required" in failures


def test_show_applies_candidate_overrides_and_picks_items(project: Path) -> None:
    run(project, "new", "ov")
    f = project / "suites" / "ov.yaml"
    f.write_text(f.read_text() + "overrides:\n  big: {generation: {max_tokens: 99}}\n")
    res = run(project, "show", "ov", "--candidate", "big", "--item", "2")
    assert res.exit_code == 0, res.output
    assert "max_tokens=99" in res.output and "What is 7 * 6?" in res.output
    missing = run(project, "show", "ov", "--item", "nope")
    assert missing.exit_code != 0 and "no item 'nope'" in missing.output
    unknown = run(project, "show", "zzz")
    assert unknown.exit_code != 0 and "no suite 'zzz'" in unknown.output
