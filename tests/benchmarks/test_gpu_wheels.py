"""benchmarks/gpu_wheels.py: which wheels it would carry to the GPU machine (no download here)."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests import REPO
from tests.benchmarks import load

gw = load("gpu_wheels")


@pytest.mark.parametrize(
    "wheel,name",
    [
        ("pydantic_core-2.46.4-cp312-cp312-manylinux2014_x86_64.whl", "pydantic-core"),
        ("SQLAlchemy-2.1.9-cp312-cp312-manylinux_2_28_x86_64.whl", "sqlalchemy"),
        ("ruamel.yaml-0.19.1-py3-none-any.whl", "ruamel-yaml"),
        ("prefect-3.9.1-py3-none-any.whl", "prefect"),
    ],
)
def test_project_names_are_normalised(wheel: str, name: str) -> None:
    assert gw.project(wheel) == name


def test_what_it_pins_is_installed_and_not_in_the_image() -> None:
    for name in gw.NEEDED:
        assert metadata.version(name)  # pinned to what the tests here ran with
        assert name not in gw.IMAGE


def test_left_out_modules_are_not_imported_by_the_cli_or_the_flow() -> None:
    """`gpu_wheels.py --check` verifies the whole path against downloaded wheels; here, without
    them: importing the CLI and the nightly flow must not load what the wheels leave out."""
    import subprocess

    # amplitude (amplitude-analytics) is left out of the list: prefect imports it for telemetry
    # inside a try/except that ignores its absence
    modules = [
        "apprise",
        "cyclopts",
        "dateparser",
        "docker",
        "docstring_parser",
        "jsonpatch",
        "oauthlib",
        "readchar",
        "requests_oauthlib",
        "rich_rst",
        "semver",
    ]
    assert len(modules) == len(gw.NEVER_IMPORTED) - 1
    code = (
        "import sys, routeopt.flows.cli, routeopt.flows.nightly; "
        f"print(sorted(m for m in {modules!r} if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == "[]"


def test_absent_modules_keep_the_image_and_the_wheels(tmp_path: Path) -> None:
    (tmp_path / "prefect-3.9.1-py3-none-any.whl").write_bytes(b"")
    gone = gw.absent_modules(tmp_path)
    assert "prefect" not in gone and "torch" not in gone and "routeopt" not in gone
    assert "duckdb" in gone  # not in the image, and no wheel for it here
