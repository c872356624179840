"""Line-aware YAML: the parsed data plus the line of every key, so errors can name a line.

PyYAML's composer keeps a start mark on every node; we walk the node tree once and record
`path tuple -> line` (1-based), then look an error location up by its longest known prefix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import yaml

Loc = tuple[str | int, ...]
LineMap = dict[Loc, int]


class YamlError(ValueError):
    """A file that is not valid YAML; `line` is 1-based where the parser knows it."""

    def __init__(self, path: Path, line: int | None, message: str, syntax: bool = True):
        where = f"{path}:{line}" if line else str(path)
        self.path, self.line, self.syntax = path, line, syntax
        self.detail = f"not valid YAML: {message}" if syntax else message
        super().__init__(f"{where}: {self.detail}")


def _walk(node: yaml.Node, loc: Loc, out: LineMap, dupes: list[tuple[Loc, int, int]]) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    dupes.append((loc + (key.value,), line, seen[key.value]))
                seen[key.value] = line
                out[loc + (key.value,)] = line
                _walk(value, loc + (key.value,), out, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _walk(value, loc + (i,), out, dupes)


def load_yaml(path: Path) -> tuple[Any, LineMap]:
    """Parse a YAML file; return the data and the line map. Raises YamlError with the line.

    A repeated key is an error: PyYAML silently keeps the last one, which hides real mistakes.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise YamlError(path, None, "file not found", syntax=False) from None
    except UnicodeDecodeError as exc:
        raise YamlError(path, None, f"not UTF-8 text ({exc.reason})", syntax=False) from None
    except OSError as exc:
        raise YamlError(path, None, f"cannot read: {exc.strerror or exc}", syntax=False) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(path, mark.line + 1 if mark else None, problem) from None
    lines: LineMap = {}
    dupes: list[tuple[Loc, int, int]] = []
    if node is not None:
        _walk(node, (), lines, dupes)
    if dupes:
        loc, line, first = dupes[0]
        raise YamlError(path, line, f"duplicate key {'.'.join(map(str, loc))!r} (first at line {first}); "
                        "YAML keeps only the last, so merge them")
    return data, lines


def line_of(lines: LineMap, loc: Sequence[str | int]) -> int | None:
    """The line of the deepest known key on `loc` (a pydantic error location, say)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())
