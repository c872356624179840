"""Virtualenvs with the gateway-only install (`pip install ./gateways/python`), built by the tests.

    venv = build_gateway_venv(tmp / "gw")                        # a clean one: only the gateway
    venv = build_gateway_venv(tmp / "proxy", base=proxy_venv())  # on top of the LiteLLM proxy's
    venv = run_gateway_venv(tmp_path_factory, "proxy", base=proxy_venv())  # one per test run

With `base`, the base virtualenv's packages are visible underneath (a .pth file), so pip installs
only what the base lacks and the proxy runs with the gateway as a platform team's image would
have it, without touching the cached proxy virtualenv that other tests share. Where the
packages cannot be installed (no package index), the calling test skips and says why.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import REPO

GATEWAY_DIST = REPO / "gateways" / "python"
PIPELINE_PACKAGES = (
    "prefect",
    "duckdb",
    "pandas",
    "scikit-learn",
    "datasets",
    "openai",
    "anthropic",
    "torch",
    "pyarrow",
    "transformers",
    "lightgbm",
    "scipy",
    "pydantic",
)


def site_packages(venv: Path) -> Path:
    return next((venv / "lib").glob("python3*/site-packages"))


def build_gateway_venv(folder: Path, base: Path | None = None) -> Path:
    """`python -m venv folder` then the one documented command, `pip install ./gateways/python`."""
    if (folder / ".ready").exists():
        return folder
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(folder)], check=True, timeout=300)
    if base is not None:
        (site_packages(folder) / "_base_venv.pth").write_text(f"{site_packages(base)}\n")
    done = subprocess.run(
        [str(folder / "bin" / "pip"), "install", "-q", str(GATEWAY_DIST)],
        capture_output=True,
        text=True,
        timeout=900,
        cwd=REPO,
    )
    if done.returncode != 0:
        pytest.skip(
            f"cannot install the gateway distribution into a virtualenv: "
            f"{(done.stderr or done.stdout).strip()[-400:]}"
        )
    (folder / ".ready").write_text("ok")
    return folder


def run_gateway_venv(tmp_path_factory: pytest.TempPathFactory, name: str, base: Path | None = None) -> Path:
    """The run's one gateway virtualenv called `name`: built by the first pytest-xdist worker
    that asks (the others wait on a lock), then shared. Each build is ~10 s of CPU (a venv, an
    isolated setuptools build, the install); tests that only run what it holds need not repeat it."""
    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    shared = root / "gateway-venvs"
    shared.mkdir(exist_ok=True)
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return build_gateway_venv(shared / name, base=base)


def installed(venv: Path) -> set[str]:
    """The distribution names installed in `venv` itself (not those of a base underneath)."""
    out = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m, sys; "
            f"print('\\n'.join(d.metadata['Name'] for d in m.distributions(path=[{str(site_packages(venv))!r}])))",
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    return {line.strip().lower() for line in out.stdout.splitlines() if line.strip()}
