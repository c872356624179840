"""Clean virtualenvs for the tests, filled by uv where it is installed and by pip where not.

uv resolves and unpacks in parallel from its own cache: the wheel test's ~570 packages take
about 30 s with it, several minutes with pip. It reads the same indexes pip is configured with
on this machine (`pip config list`: index-url, extra-index-url, find-links, constraint) and picks
among them as pip does (best version across all of them). Tests of the documented
`pip install ...` command itself keep using pip (`tests/gateway_venv.py`).

    venv = make_venv(tmp / "venv")
    done = install(venv, f"{wheel}[local]", "evals", timeout=1800)   # a CompletedProcess
"""

from __future__ import annotations

import functools
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

_PIP_OPTIONS = {"index-url": "--index-url", "extra-index-url": "--extra-index-url", "find-links": "--find-links",
                "constraint": "--constraint"}  # fmt: skip


def uv() -> str | None:
    """The uv executable (on PATH or from its wheel), or None."""
    found = shutil.which("uv")
    if found is None:
        try:
            from uv import find_uv_bin  # type: ignore[import-not-found]
        except ImportError:
            return None
        found = find_uv_bin()
    return found


def make_venv(folder: Path, *, timeout: float = 300) -> Path:
    """An empty virtualenv at `folder` (replacing what was there), with pip only where uv is
    missing and pip must do the installing."""
    if (tool := uv()) is not None:
        cmd = [tool, "venv", "-q", "--clear", "--python", sys.executable, str(folder)]
    else:
        cmd = [sys.executable, "-m", "venv", "--clear", str(folder)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=timeout)
    return folder


def install(
    venv: Path,
    *requirements: str,
    timeout: float,
    env: dict[str, str] | None = None,
    cwd: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """Install `requirements` into `venv`, without byte-compiling; the caller checks returncode."""
    if (tool := uv()) is not None:
        cmd = [tool, "pip", "install", "-q", "--python", str(venv / "bin" / "python"),
               "--index-strategy", "unsafe-best-match", *pip_indexes()]  # fmt: skip
    else:
        cmd = [str(venv / "bin" / "pip"), "install", "-q", "--no-compile"]
    return subprocess.run(
        [*cmd, *requirements], capture_output=True, text=True, timeout=timeout, env=env, cwd=cwd
    )


@functools.cache
def pip_indexes() -> tuple[str, ...]:
    """pip's configured indexes, links and constraints (its files and PIP_* variables) as uv
    options, so that both installers see the same packages."""
    listed = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"], capture_output=True, text=True, timeout=60
    ).stdout
    found: dict[str, list[str]] = {}
    for line in listed.splitlines():
        key, _, value = line.partition("=")
        name = key.rsplit(".", 1)[-1]
        if name in _PIP_OPTIONS and value:
            found.setdefault(name, " ".join(shlex.split(value)).split())  # PIP_* is listed first, and wins
    return tuple(arg for name, values in found.items() for v in values for arg in (_PIP_OPTIONS[name], v))
