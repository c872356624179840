"""The docs site builds strictly, and the README stays short with links that resolve."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
MAX_README_LINES = 300

_FENCE = re.compile(r"^(```|~~~)")
_LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")


def _prose(text: str) -> list[str]:
    """The lines outside fenced code blocks, with inline code spans blanked out."""
    lines, fenced = [], False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if not fenced:
            lines.append(re.sub(r"`[^`]*`", "``", line))
    return lines


def github_anchors(text: str) -> set[str]:
    """The anchors GitHub gives a Markdown file's headings (duplicates get -1, -2...)."""
    seen: dict[str, int] = {}
    anchors = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        m = None if fenced else _HEADING.match(line)
        if not m:
            continue
        title = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", m.group(2))
        slug = re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        anchors.add(slug if n == 0 else f"{slug}-{n}")
    return anchors


def broken_links(text: str, base: Path) -> list[str]:
    """Relative links of a Markdown text (relative to `base`) whose file or anchor is missing."""
    broken = []
    for line in _prose(text):
        for target in _LINK.findall(line):
            if re.match(r"^[a-z][a-z0-9+.-]*:", target):
                continue  # http:, https:, mailto:
            path, _, anchor = target.partition("#")
            file = (base / path).resolve() if path else None
            if file is not None and not file.exists():
                broken.append(f"{target}: no file {file}")
                continue
            if anchor and (file is None or file.suffix == ".md"):
                doc = file.read_text(encoding="utf-8") if file else text
                if anchor not in github_anchors(doc):
                    broken.append(f"{target}: no heading with anchor #{anchor}")
    return broken


def test_readme_is_short() -> None:
    lines = README.read_text(encoding="utf-8").count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines; move detail into docs/"


def test_readme_links_resolve() -> None:
    assert broken_links(README.read_text(encoding="utf-8"), REPO) == []


def test_link_check_finds_what_is_broken(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "page.md").write_text("# A page\n\n## Real section\n", encoding="utf-8")
    text = (
        "[ok](docs/page.md#real-section) [gone](docs/nothing.md) "
        "[anchor](docs/page.md#no-such-section) [here](#top)\n\n## Top\n\n"
        "```\n[in code](docs/nothing.md)\n```\n[web](https://example.com/x)\n"
    )
    assert broken_links(text, tmp_path) == [
        f"docs/nothing.md: no file {tmp_path / 'docs' / 'nothing.md'}",
        "docs/page.md#no-such-section: no heading with anchor #no-such-section",
    ]


def test_docs_site_builds_strictly(tmp_path: Path) -> None:
    """`mkdocs build --strict` fails on a broken link or anchor, or a page left out of the nav."""
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "site")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
