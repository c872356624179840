"""The static checks CI runs: ruff's lint and format over the checkout, and mypy in strict mode over the
gateway's reference implementation (routeopt.router_training.policy and routeopt.common.io).

mypy cannot follow setuptools' package-dir mapping (the editable install finds the stage folders
with an import hook), so the type check builds the installed layout as a tree of links: a
`routeopt/` folder holding routeopt/'s own entries and one link per mapped stage folder.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import FOLDERS, REPO

STRICT = ("-p", "routeopt.router_training.policy", "-m", "routeopt.common.io")


def _tool(name: str) -> None:
    if importlib.util.find_spec(name) is None:
        pytest.skip(f"{name} is not installed (it comes with the dev extra: pip install -e '.[dev]')")


def _link_tree(root: Path) -> dict[Path, Path]:
    """`root/routeopt` laid out as the wheel installs it; returns each link -> its source."""
    package = root / "routeopt"
    package.mkdir(parents=True)
    links: dict[str, Path] = {}
    for entry in FOLDERS["routeopt"].iterdir():
        if entry.name != "__pycache__" and f"routeopt.{entry.name}" not in FOLDERS:
            links[entry.name] = entry
    for name, folder in FOLDERS.items():
        if name != "routeopt":
            links[name.removeprefix("routeopt.")] = folder
    for name, source in links.items():
        (package / name).symlink_to(source, target_is_directory=source.is_dir())
    return {package / name: source for name, source in links.items()}


def test_ruff_check_passes() -> None:
    _tool("ruff")
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=REPO, capture_output=True, text=True
    )
    assert run.returncode == 0, f"ruff check . found problems:\n{run.stdout}{run.stderr}"


def test_ruff_format_leaves_every_file_as_it_is() -> None:
    _tool("ruff")
    run = subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--check", "--no-cache", "."],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, f"run `ruff format .`; these files differ:\n{run.stdout}{run.stderr}"


def test_the_gateway_reference_implementation_is_strictly_typed(tmp_path: Path) -> None:
    """mypy --strict, with pyproject.toml's [tool.mypy] settings, over the policy package."""
    _tool("mypy")
    links = _link_tree(tmp_path / "tree")
    env = {**os.environ, "MYPYPATH": str(tmp_path / "tree")}
    command = [
        sys.executable,
        "-m",
        "mypy",
        "--strict",
        "--config-file",
        str(REPO / "pyproject.toml"),
        "--cache-dir",
        str(tmp_path / "cache"),
        *STRICT,
    ]
    run = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True)
    prefixes = {str(link.relative_to(tmp_path)): str(source) for link, source in links.items()}
    report = "".join(_in_checkout(line, prefixes) for line in (run.stdout + run.stderr).splitlines(True))
    assert run.returncode == 0, f"mypy --strict {' '.join(STRICT)} found problems:\n{report}"


def _in_checkout(line: str, prefixes: dict[str, str]) -> str:
    """mypy's line with the path of the file in the checkout instead of the link's."""
    for link, source in prefixes.items():
        if line.startswith(link + os.sep):
            return source + line[len(link) :]
    return line
