"""`routeopt suites`: list, validate, scaffold and inspect eval suites."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

import click

if TYPE_CHECKING:
    from routeopt.evals.config import Config
    from routeopt.evals.suite.spec import Suite

SCAFFOLD_ROWS = [
    {"id": "1", "question": "What is 2 + 3?", "answer": "5"},
    {"id": "2", "question": "What is 7 * 6?", "answer": "42"},
    {"id": "3", "question": "What is 10 - 4?", "answer": "6"},
]

SCAFFOLD = """\
# {name}: a new eval suite. Docs: docs/adding-a-suite.md
name: {name}
description: "What this suite checks, in one line."
owner: {owner}
tags: [new]
dataset:
  path: {data}           # JSONL, CSV or Parquet; or `hf: {{name: ..., split: test}}`
  id_field: id
  # limit: 100           # seeded sample of at most this many items
prompt:
  system: "Answer with a number only."
  template: "{{{{ question }}}}"
generation:
  max_tokens: 16
  temperature: 0.0
grader:
  type: numeric
  target: "{{{{ answer }}}}"
"""


def _config(path: str | None) -> "Config | None":
    """The config named, else the default one if it loads; suites that need it say so."""
    from routeopt.evals.config import ConfigError, default_config_path, load_config

    candidate = Path(path) if path else default_config_path()
    if not candidate.exists():
        if path:
            raise click.UsageError(f"{path}: config file not found")
        return None
    try:
        return load_config(candidate)
    except ConfigError as exc:
        if path:
            raise click.UsageError(str(exc)) from None
        click.echo(f"warning: ignoring default config: {exc}", err=True)
        return None


def _suites_dir(config: "Config | None", given: str | None) -> Path:
    if given:
        return Path(given)
    return config.suites_dir if config is not None else Path("evals/suites")


def _suite_files(root: Path, recursive: bool) -> list[Path]:
    if root.is_file():
        return [root]
    pattern = "**/*.yaml" if recursive else "*.yaml"
    return sorted(p for p in root.glob(pattern) if not p.name.startswith("_"))


config_option = click.option(
    "--config",
    "config_path",
    type=click.Path(dir_okay=False),
    default=None,
    help="routeopt.yaml (judge graders and overrides need its candidates)",
)


@click.group("suites")
def suites() -> None:
    """Eval suites: list, validate, scaffold and inspect them."""


@suites.command("list")
@click.option("--dir", "folder", type=click.Path(file_okay=False), default=None, help="suites folder")
@click.option("-r", "--recursive", is_flag=True, help="include sub-folders (e.g. examples/)")
@config_option
def list_cmd(folder: str | None, recursive: bool, config_path: str | None) -> None:
    """Each suite with its items, grader and version (or why it does not load)."""
    from routeopt.evals.suite.spec import SuiteError, load_suite

    config = _config(config_path)
    root = _suites_dir(config, folder)
    if not root.is_dir():
        raise click.UsageError(f"{root}: suites folder not found")
    rows = [("SUITE", "ITEMS", "GRADER", "VERSION", "FILE")]
    failures: list[str] = []
    for path in _suite_files(root, recursive):
        try:
            s = load_suite(path, config=config)
            rows.append((s.name, str(len(s.items)), s.grader.type, s.version, str(path)))
        except SuiteError as exc:
            rows.append((path.stem, "-", "-", f"ERROR ({len(exc.problems) or 1})", str(path)))
            failures.append(str(exc.problems[0]) if exc.problems else str(exc))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    for r in rows:
        click.echo("  ".join(c.ljust(w) for c, w in zip(r, widths)) + "  " + r[4])
    if failures:
        click.echo("\nnot loadable (`routeopt suites validate` lists every problem):")
        for line in failures:
            click.echo(f"  {line}")


@suites.command("validate")
@click.argument("path", required=False, type=click.Path(exists=True))
@config_option
def validate_cmd(path: str | None, config_path: str | None) -> None:
    """Check a suite file, or every suite under a folder (default: the config's suites folder).

    Prints every problem with its file, line and field, and exits 1 if any is an error.
    """
    from routeopt.evals.suite.spec import check_suite

    config = _config(config_path)
    root = Path(path) if path else _suites_dir(config, None)
    files = _suite_files(root, recursive=path is not None)
    if not files:
        raise click.UsageError(f"{root}: no suite files (*.yaml) found")
    total = 0
    for f in files:
        problems = check_suite(f, config=config)
        errors = [p for p in problems if p.severity == "error"]
        total += len(errors)
        for p in problems:
            click.echo(str(p))
        if not errors:
            click.echo(f"ok  {f}")
    if total:
        click.echo(f"{total} problem(s) in {len(files)} file(s)", err=True)
        sys.exit(1)


@suites.command("new")
@click.argument("name")
@click.option("--dir", "folder", type=click.Path(file_okay=False), default=None, help="suites folder")
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False),
    default=None,
    help="where the example dataset goes (default: <suites folder>/../data)",
)
@config_option
def new_cmd(name: str, folder: str | None, data_dir: str | None, config_path: str | None) -> None:
    """Write a working suite scaffold NAME.yaml and a small example dataset, then validate it."""
    import json
    import re

    from routeopt.evals.suite.spec import check_suite

    if not re.fullmatch(r"[a-z0-9][a-z0-9_.-]*", name):
        raise click.UsageError(f"suite name {name!r}: use lower-case letters, digits, '_', '.', '-'")
    config = _config(config_path)
    root = _suites_dir(config, folder)
    data_root = Path(data_dir) if data_dir else root / ".." / "data"
    suite_path, data_path = root / f"{name}.yaml", data_root / f"{name}.jsonl"
    for p in (suite_path, data_path):
        if p.exists():
            raise click.UsageError(f"{p} exists; pick another name or remove it")
    root.mkdir(parents=True, exist_ok=True)
    data_root.mkdir(parents=True, exist_ok=True)
    data_path.write_text("".join(json.dumps(r) + "\n" for r in SCAFFOLD_ROWS))
    rel = Path(os.path.relpath(data_path.resolve(), suite_path.parent.resolve()))
    owner = os.environ.get("USER") or "you"
    suite_path.write_text(SCAFFOLD.format(name=name, data=rel.as_posix(), owner=owner))
    problems = check_suite(suite_path, config=config)
    for p in problems:
        click.echo(str(p), err=True)
    if problems:
        sys.exit(1)
    click.echo(f"wrote {suite_path} and {data_path}; edit them, then `routeopt suites show {name}`")


def _find(name: str, root: Path) -> Path:
    """A suite by file path, file stem or `name:`, searched under the suites folder."""
    from routeopt.evals.suite.files import resolve_includes

    given = Path(name)
    if given.suffix in (".yaml", ".yml") and given.is_file():
        return given
    files = _suite_files(root, recursive=True) if root.is_dir() else []
    for f in files:
        if f.stem == name:
            return f
    for f in files:
        try:
            if resolve_includes(f)[0].get("name") == name:
                return f
        except ValueError:
            continue
    raise click.UsageError(f"no suite {name!r} under {root}; `routeopt suites list -r` shows them")


def _show(suite: "Suite", item_id: str | None, candidate: str | None) -> None:
    import yaml

    click.echo(
        f"# {suite.source}\n# version {suite.version}, {len(suite.items)} items"
        + (f", {len(suite.skipped)} rows skipped:" if suite.skipped else "")
    )
    for why in suite.skipped[:20]:
        click.echo(f"#   skipped {why}")
    resolved: dict[str, Any] = suite.resolved()
    click.echo(yaml.safe_dump(resolved, sort_keys=False, allow_unicode=True, width=100).rstrip())
    item = suite.items[0]
    if item_id is not None:
        matches = [i for i in suite.items if i.id == item_id]
        if not matches:
            raise click.UsageError(f"suite {suite.name!r} has no item {item_id!r}")
        item = matches[0]
    request = suite.request(item, candidate)
    click.echo(f"\n# example request: item {item.id!r}" + (f", candidate {candidate!r}" if candidate else ""))
    s = request.settings
    click.echo(f"# max_tokens={s.max_tokens} temperature={s.temperature} stop={list(s.stop)}")
    for m in request.messages:
        click.echo(f"--- {m.role}\n{m.content}")


@suites.command("show")
@click.argument("name")
@click.option("--dir", "folder", type=click.Path(file_okay=False), default=None, help="suites folder")
@click.option("--item", "item_id", default=None, help="render this item's prompt (default: the first)")
@click.option("--candidate", default=None, help="apply this candidate's generation overrides")
@config_option
def show_cmd(
    name: str, folder: str | None, item_id: str | None, candidate: str | None, config_path: str | None
) -> None:
    """The resolved suite (after includes) and a rendered example prompt."""
    from routeopt.evals.suite.spec import SuiteError, load_suite

    config = _config(config_path)
    path = _find(name, _suites_dir(config, folder))
    try:
        suite = load_suite(path, config=config)
    except SuiteError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    for w in suite.warnings:
        click.echo(str(w), err=True)
    _show(suite, item_id, candidate)
