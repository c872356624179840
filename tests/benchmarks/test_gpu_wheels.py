"""benchmarks/gpu_wheels.py: which wheels it would carry to the GPU machine (no download here)."""

from __future__ import annotations

import sys
from importlib import metadata
from pathlib import Path

import pytest

from tests.benchmarks import load

REPO = Path(__file__).resolve().parents[2]
gw = load("gpu_wheels")


@pytest.mark.parametrize("wheel,name", [
    ("pydantic_core-2.46.4-cp312-cp312-manylinux2014_x86_64.whl", "pydantic-core"),
    ("SQLAlchemy-2.1.9-cp312-cp312-manylinux_2_28_x86_64.whl", "sqlalchemy"),
    ("ruamel.yaml-0.19.1-py3-none-any.whl", "ruamel-yaml"),
    ("prefect-3.9.1-py3-none-any.whl", "prefect"),
])
def test_project_names_are_normalised(wheel: str, name: str) -> None:
    assert gw.project(wheel) == name


def test_what_it_pins_is_installed_and_not_in_the_image() -> None:
    for name in gw.NEEDED:
        assert metadata.version(name)  # pinned to what the tests here ran with
        assert name not in gw.IMAGE


def test_left_out_modules_are_not_imported_by_the_pipeline() -> None:
    """The wheels leave out apprise and burner_redis: importing the CLI and the nightly flow
    (what `routeopt run` imports before its server starts) must not load them."""
    import subprocess

    code = ("import sys, flows.cli, flows.nightly; "
            "print(sorted(m for m in ('apprise', 'burner_redis') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"
