"""The JavaScript gateway package (gateways/js) for tests: its dev dependencies, built once.

`npm ci` installs exactly what package-lock.json pins (TypeScript, miniflare with workerd's
binary) into gateways/js/node_modules, once per lock file (a stamp records which), under a file
lock so concurrent test sessions wait for one install. `npm pack`, as a release runs it, builds
dist/ from src/ (its prepack script is `npm run build`) and writes the tarball users install,
once per content of the build's inputs (a stamp in dist/ records which), under the same lock:
the build empties dist/ first, so a second build while another pytest-xdist worker or test
session runs node on dist/ would pull the files from under it. Tests that need node skip with
the reason where node or npm is missing.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests import REPO

PACKAGE = REPO / "gateways" / "js"


def node() -> str:
    """The node executable (>= 20), or skip."""
    exe = shutil.which("node")
    if exe is None or shutil.which("npm") is None:
        pytest.skip("node and npm are not installed: the JavaScript gateway's tests need Node.js >= 20")
    major = int(
        subprocess.run(
            [exe, "-p", "process.versions.node.split('.')[0]"], capture_output=True, text=True, check=True
        ).stdout.strip()
    )
    if major < 20:
        pytest.skip(f"node {major} is too old: the JavaScript gateway needs Node.js >= 20")
    return exe


def _npm(*args: str, timeout: int = 900) -> None:
    done = subprocess.run(
        ["npm", *args],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "npm_config_fund": "false", "npm_config_audit": "false"},
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"npm {' '.join(args)} failed in {PACKAGE}:\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        )


def package() -> Path:
    """gateways/js with its dev dependencies installed and dist/ built from src/."""
    _build()
    return PACKAGE


def tarball() -> Path:
    """The tarball `npm pack` made from the current dist/ (the file a release publishes)."""
    return _build()


def _build() -> Path:
    """Install, then pack (building dist/) unless dist/ and the tarball match the inputs."""
    node()
    lock = hashlib.sha256((PACKAGE / "package-lock.json").read_bytes()).hexdigest()
    stamp = PACKAGE / "node_modules" / ".routeopt-lock"
    packed = PACKAGE / "node_modules" / ".routeopt-pack"  # npm ignores node_modules/ when packing
    with open(PACKAGE / ".install.lock", "w") as guard:
        fcntl.flock(guard, fcntl.LOCK_EX)
        if not stamp.exists() or stamp.read_text() != lock:
            _npm("ci")
            stamp.write_text(lock)
        built = PACKAGE / "dist" / ".routeopt-build"
        inputs = _build_inputs(lock)
        found = sorted(packed.glob("*.tgz"))
        if not built.exists() or built.read_text() != inputs or len(found) != 1:
            shutil.rmtree(packed, ignore_errors=True)
            packed.mkdir()
            _npm("pack", "--json", "--pack-destination", str(packed), timeout=600)
            built.write_text(inputs)
            found = sorted(packed.glob("*.tgz"))
    return found[0]


def _build_inputs(lock: str) -> str:
    """A digest of what `npm run build` reads: the sources (less the WebAssembly modules it
    writes into src/), its scripts, the TypeScript configs and the installed dependencies."""
    digest = hashlib.sha256(lock.encode())
    files = [
        *sorted(PACKAGE.glob("src/**/*.ts")),
        *sorted(PACKAGE.glob("scripts/*.mjs")),
        *sorted(PACKAGE.glob("tsconfig*.json")),
        PACKAGE / "package.json",
    ]
    for path in files:
        if not path.name.endswith("-wasm.ts"):
            digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def run_node(*args: str, env: dict | None = None, timeout: int = 900) -> subprocess.CompletedProcess:
    return subprocess.run(
        [node(), *args],
        cwd=PACKAGE,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )


def node_json(*args: str, **kw) -> dict:
    done = run_node(*args, **kw)
    assert done.returncode == 0, (
        f"node {' '.join(args)} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    )
    return json.loads(done.stdout)
