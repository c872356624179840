"""routeopt's tests; `tests/` mirrors the package tree."""

import fcntl
import tempfile
from pathlib import Path
from typing import IO

REPO = Path(__file__).resolve().parents[1]

FOLDERS = {
    "routeopt.flows": REPO / "flows",
    "routeopt.evals": REPO / "evals",
    "routeopt.router_training": REPO / "router_training",
    "routeopt.artifacts": REPO / "artifacts",
    "routeopt": REPO / "routeopt",
}
"""Where each installed package's source lives in the checkout (pyproject.toml's package-dir)."""


def source_file(module: str) -> Path:
    """The checkout file a dotted `routeopt.` module name is built from."""
    for package, folder in FOLDERS.items():
        if module == package or module.startswith(package + "."):
            rest = module[len(package) + 1 :].split(".") if module != package else []
            path = folder.joinpath(*rest)
            return path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
    raise ValueError(f"{module} is not one of routeopt's modules")


def documented_ports_lock() -> IO[str]:
    """Hold, until the returned file is closed, the one lock of the tests that listen on the fixed
    ports the docs and the nginx kit name (8600, 8700, 8780...): one such test at a time across
    xdist workers and concurrent sessions."""
    guard = open(Path(tempfile.gettempdir()) / "routeopt-documented-ports.lock", "w")
    fcntl.flock(guard, fcntl.LOCK_EX)
    return guard
