"""Reading suite YAML: line-aware parsing, `include:` with deep merge and cycle detection, and
where each key came from.

PyYAML's composer keeps a start mark on every node; the node tree is walked once to record
`path tuple -> line` (1-based), so any error location is looked up by its longest known prefix.
lm-evaluation-harness task YAMLs inherit the same way as here: a variant is a few lines that
include a base and override what differs. Mappings merge key by key; lists and scalars replace; a
mapping whose `type` differs from the base's replaces it whole (a different grader is not a patch).
Relative file paths are resolved against the file that wrote them, so a base can live anywhere.
The line-aware reader (`load_yaml`) is `routeopt.evals.config`'s, which reads routeopt.yaml the same way.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, Sequence

from routeopt.evals.config import Loc, YamlError, load_yaml


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a suite: the file and line it is on, the field, and what to do."""

    file: Path
    line: int | None
    field: str
    message: str
    severity: Literal["error", "warning"] = "error"

    def __str__(self) -> str:
        where = f"{self.file}:{self.line}" if self.line else str(self.file)
        tag = "warning: " if self.severity == "warning" else ""
        return f"{where}: {tag}{self.field}: {self.message}"


class SuiteError(ValueError):
    """A suite that cannot be used; `problems` lists each with file, line and field."""

    def __init__(self, problems: Sequence[Problem] | str):
        if isinstance(problems, str):
            self.problems: list[Problem] = []
            super().__init__(problems)
            return
        self.problems = list(problems)
        head = "invalid suite"
        if self.problems:
            head = f"{self.problems[0].file}: {len(self.problems)} problem(s)"
        super().__init__("\n  ".join([head] + [str(p) for p in self.problems]))


class Provenance:
    """`loc -> (file, line)` for every key of the merged spec, so errors point at the source."""

    def __init__(self) -> None:
        self.where: dict[Loc, tuple[Path, int]] = {}

    def record(self, path: Path, lines: dict[Loc, int]) -> None:
        for loc, line in lines.items():
            self.where[loc] = (path, line)

    def locate(self, loc: Sequence[str | int], default: Path) -> tuple[Path, int | None]:
        loc = tuple(loc)
        while True:
            if loc in self.where:
                return self.where[loc]
            if not loc:
                return default, None
            loc = loc[:-1]


def deep_merge(base: Any, over: Any) -> Any:
    """`over` on top of `base`: mappings merge recursively, everything else replaces."""
    if not isinstance(base, dict) or not isinstance(over, dict):
        return over
    if "type" in over and "type" in base and over["type"] != base["type"]:
        return over
    out = dict(base)
    for key, value in over.items():
        out[key] = deep_merge(base[key], value) if key in base else value
    return out


def _absolute(value: Any, base_dir: Path) -> Any:
    if isinstance(value, str) and value and not Path(value).is_absolute():
        return str((base_dir / value).resolve())
    return value


def _resolve_paths(data: dict[str, Any], base_dir: Path) -> None:
    """Make the file paths a suite file writes absolute, relative to that file."""
    prompt = data.get("prompt")
    few_shot = prompt.get("few_shot") if isinstance(prompt, dict) else None
    for ds in (data.get("dataset"), few_shot.get("dataset") if isinstance(few_shot, dict) else None):
        if not isinstance(ds, dict):
            continue
        if "path" in ds:
            ds["path"] = _absolute(ds["path"], base_dir)
        hf = ds.get("hf")
        if isinstance(hf, dict) and isinstance(hf.get("name"), str) and hf["name"].startswith(("./", "../")):
            hf["name"] = _absolute(hf["name"], base_dir)
    _resolve_functions(data.get("grader"), base_dir)


def _resolve_functions(grader: Any, base_dir: Path) -> None:
    if not isinstance(grader, dict):
        return
    fn = grader.get("function")
    if grader.get("type") == "custom" and isinstance(fn, str) and ".py:" in fn:
        file, _, name = fn.rpartition(":")
        grader["function"] = f"{_absolute(file, base_dir)}:{name}"
    for child in grader.get("graders") or []:
        _resolve_functions(child, base_dir)


def _include_list(data: dict[str, Any], path: Path, lines: dict[Loc, int]) -> list[str]:
    inc = data.pop("include", None)
    if inc is None:
        return []
    if isinstance(inc, str):
        return [inc]
    if isinstance(inc, list) and all(isinstance(i, str) for i in inc):
        return inc
    line = lines.get(("include",))
    raise SuiteError([Problem(path, line, "include", "must be a file name or a list of them")])


def _read(path: Path, stack: tuple[Path, ...], prov: Provenance) -> dict[str, Any]:
    if path in stack:
        chain = " -> ".join(p.name for p in stack + (path,))
        raise SuiteError([Problem(stack[-1], None, "include", f"include cycle: {chain}")])
    try:
        data, lines = load_yaml(path)
    except YamlError as exc:
        raise SuiteError([Problem(path, exc.line, "(yaml)", exc.detail)]) from None
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise SuiteError([Problem(path, 1, "(top level)", "expected a mapping of suite fields")])
    merged: dict[str, Any] = {}
    for name in _include_list(data, path, lines):
        target = (path.parent / name).resolve()
        if not target.is_file():
            raise SuiteError([Problem(path, lines.get(("include",)), "include", f"file not found: {target}")])
        merged = deep_merge(merged, _read(target, stack + (path,), prov))
    _resolve_paths(data, path.parent)
    prov.record(path, lines)
    return deep_merge(merged, data)


def resolve_includes(path: Path) -> tuple[dict[str, Any], Provenance]:
    """The suite's raw spec after includes and where each key came from; SuiteError if unreadable."""
    prov = Provenance()
    return _read(path.resolve(), (), prov), prov
