"""Reading the README's sample output: the figures a run must print (the wheel test in
tests/test_packaging.py compares them with its run of the demo from an empty folder)."""

from __future__ import annotations

import re
from pathlib import Path


REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"

_LOG_LINE = re.compile(r"^\d\d:\d\d:\d\d\.\d+ \| ")  # Prefect's log lines, times and run names
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_TIMED_COLUMN = re.compile(r"\blat\b|\bttft\b")  # measured times: they differ from run to run
_VOLATILE = [  # what differs between runs, figures aside
    (re.compile(r"run-\d{8}-\d{6}-[0-9a-f]+"), "RUN-ID"),
    (re.compile(r"wall time: \S+"), "wall time: TIME"),
    (re.compile(r"\b[0-9a-f]{16}\b"), "KEY-ID"),
    (re.compile(r"(?:/[\w.\-]+)+/?"), "PATH"),
]


def readme_sample(text: str) -> str:
    """The fenced block of the README's quickstart that shows a run's summary."""
    quickstart = text.split("\n## Quickstart", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", quickstart, flags=re.S | re.M)
    samples = [b for b in blocks if "pass rate" in b]
    assert len(samples) == 1, "the README's quickstart should show one run's output"
    return samples[0]


def _mask(line: str) -> str:
    for pattern, replacement in _VOLATILE:
        line = pattern.sub(replacement, line)
    return line


def _cells(line: str, bar: str) -> list[str]:
    return [c.strip() for c in line.strip().strip(bar).split(bar)]


def figures(text: str) -> tuple[list[list[tuple[str, ...]]], str]:
    """A summary's tables (rows of figures, timed columns left out) and its other text, masked.

    Table rows keep their order and every cell but measured times; the text between tables is
    compared word for word once run ids, paths, key ids and the wall time are masked.
    """
    tables: list[list[tuple[str, ...]]] = []
    keep: list[int] = []
    prose: list[str] = []
    for raw in _ANSI.sub("", text).splitlines():
        line = raw.strip()
        if not line or _LOG_LINE.match(line) or line == "...":
            continue
        if line[0] in "┏┡└┌├╭╰━─":
            continue
        if line.startswith("┃"):
            header = _cells(line, "┃")
            keep = [i for i, name in enumerate(header) if not _TIMED_COLUMN.search(name)]
            tables.append([tuple(header[i] for i in keep)])
        elif line.startswith("│"):
            assert tables, f"a table row before any header: {line!r}"
            cells = _cells(line, "│")
            tables[-1].append(tuple(cells[i] for i in keep))
        else:
            prose.append(_mask(line))
    return tables, " ".join(" ".join(prose).split())


def sample_window(output: str, sample: str) -> str:
    """The part of a run's output that the sample shows: from its first line to its last."""

    def key(line: str) -> str:
        return " ".join(_mask(_ANSI.sub("", line)).split())

    shown = [key(line) for line in sample.splitlines() if line.strip()]
    lines = output.splitlines()
    keys = [key(line) for line in lines]
    assert shown[0] in keys, f"the run printed no line like the sample's first: {shown[0]!r}"
    assert shown[-1] in keys, f"the run printed no line like the sample's last: {shown[-1]!r}"
    start = keys.index(shown[0])
    end = len(keys) - 1 - keys[::-1].index(shown[-1])
    return "\n".join(lines[start : end + 1])


def test_figures_see_a_changed_number() -> None:
    sample = readme_sample(README.read_text(encoding="utf-8"))
    tables, prose = figures(sample)
    assert len(tables) == 2 and len(tables[0]) == 6 and len(tables[1]) == 5, tables
    assert "certified targets" in prose and "RUN-ID" in prose
    for old, new in (("0.502", "0.503"), ("held at ", "held at 1"), ("1250", "1249")):
        assert figures(sample.replace(old, new, 1)) != (tables, prose), old
    same = re.sub(r"wall time: \S+", "wall time: 99.9s", sample)
    assert figures(same) == (tables, prose)
