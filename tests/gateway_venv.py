"""Virtualenvs with the gateway-only install (`pip install ./gateways/python`), built by the tests.

    venv = build_gateway_venv(tmp / "gw")                        # a clean one: only the gateway
    venv = build_gateway_venv(tmp / "proxy", base=proxy_venv())  # on top of the LiteLLM proxy's

With `base`, the base virtualenv's packages are visible underneath (a .pth file), so pip installs
only what the base lacks and the proxy runs with the gateway as a platform team's image would
have it, without touching the cached proxy virtualenv that other tests share. Where the
packages cannot be installed (no package index), the calling test skips and says why.
"""

from __future__ import annotations

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
