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

    def __init__(self, path: Path, line: int | None, message: str):
        where = f"{path}:{line}" if line else str(path)
        super().__init__(f"{where}: not valid YAML: {message}")
        self.path, self.line, self.detail = path, line, message


def _walk(node: yaml.Node, loc: Loc, out: LineMap) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                out[loc + (key.value,)] = key.start_mark.line + 1
                _walk(value, loc + (key.value,), out)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _walk(value, loc + (i,), out)


def load_yaml(path: Path) -> tuple[Any, LineMap]:
    """Parse a YAML file; return the data and the line map. Raises YamlError with the line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise YamlError(path, None, "file not found") from None
    except UnicodeDecodeError as exc:
        raise YamlError(path, None, f"not UTF-8 text ({exc.reason})") from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(path, mark.line + 1 if mark else None, problem) from None
    lines: LineMap = {}
    if node is not None:
        _walk(node, (), lines)
    return data, lines


def line_of(lines: LineMap, loc: Sequence[str | int]) -> int | None:
    """The line of the deepest known key on `loc` (a pydantic error location, say)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())
