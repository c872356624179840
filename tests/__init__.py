"""routeopt's tests; `tests/` mirrors the package tree."""

from pathlib import Path

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
