"""The package layering that `evals/__init__.py` and docs/architecture.md describe, enforced.

Every import in every module (including imports inside functions) is read from the source; a
package may import only itself and the packages listed for it. Data flows one way:
evals -> router_training -> artifacts -> reports, with flows on top and `common` underneath.
"""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest

from tests import REPO

P = "routeopt."
OURS = tuple(P + n for n in ("common", "evals", "router_training", "artifacts", "reports", "flows"))
FOLDERS = {P + "common": REPO / "routeopt" / "common", P + "reports": REPO / "routeopt" / "reports",
           P + "evals": REPO / "evals", P + "router_training": REPO / "router_training",
           P + "artifacts": REPO / "artifacts", P + "flows": REPO / "flows"}
EVALS = tuple(P + "evals." + n for n in ("config", "providers", "grading", "suite", "storage", "execution",
                                          "selfhost"))
E = {n.rsplit(".", 1)[1]: n for n in EVALS}
ALLOWED: dict[str, set[str]] = {
    P + "common": set(),
    P + "evals": set(),
    E["config"]: set(),
    E["providers"]: {E["config"]},
    E["grading"]: {E["config"], E["providers"]},
    E["suite"]: {E["config"], E["providers"], E["grading"]},
    E["storage"]: {E["config"], E["suite"]},
    E["execution"]: {E["config"], E["providers"], E["grading"], E["suite"], E["storage"]},
    E["selfhost"]: {E["config"], E["providers"], E["suite"], E["storage"]},
    P + "router_training": set(),
    P + "artifacts": {P + "router_training"},
    P + "reports": {P + "evals", *EVALS, P + "router_training", P + "artifacts"},
    P + "flows": {P + "evals", *EVALS, P + "router_training", P + "artifacts", P + "reports"},
}


def unit(module: str) -> str | None:
    """The layer a dotted module name belongs to (its evals sub-package, or its top package)."""
    for name in (*EVALS, *OURS):
        if module == name or module.startswith(name + "."):
            return name
    return None


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)  # from pkg import module
    return found


def modules() -> list[Path]:
    return sorted(p for folder in FOLDERS.values() for p in folder.rglob("*.py")
                  if "suites" not in p.relative_to(REPO).parts)


def module_name(path: Path) -> str:
    """The dotted name a source file installs as."""
    for package, folder in FOLDERS.items():
        if path.is_relative_to(folder):
            parts = path.relative_to(folder).with_suffix("").parts
            return ".".join((package, *parts)).removesuffix(".__init__")
    raise ValueError(path)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_layers(path: Path) -> None:
    me = unit(module_name(path))
    assert me is not None
    allowed = ALLOWED[me] | {me} | ({P + "common"} if me != P + "common" else set())
    if me.startswith(P + "evals."):
        allowed.add(P + "evals")  # the package itself (its docstring), never a sibling via it
    wrong = sorted(m for m in imports(path) if (u := unit(m)) is not None and u not in allowed
                   and not (u == P + "evals" and m != P + "evals"))
    assert not wrong, f"{path.relative_to(REPO)} ({me}) imports {wrong}; allowed: {sorted(ALLOWED[me])}"


GATEWAY_MODULES = ("policy", "features", "numerics", "trees", "tensors", "policy_files", "conformance",
                   "conformance_inputs", "batch", "draws")


def test_the_gateway_modules_are_leaves_of_router_training() -> None:
    """What a gateway loads (the policy, its format 3 files, its self-check and the draws:
    docs/architecture.md, "The gateway side") imports no other router_training module but each
    other and the optional embeddings, so numpy is all they need."""
    rt = P + "router_training"
    allowed = {f"{rt}.{n}" for n in GATEWAY_MODULES} | {f"{rt}.embeddings"}
    for name in GATEWAY_MODULES:
        ours = {".".join(m.split(".")[:3]) for m in imports(REPO / "router_training" / f"{name}.py")
                if unit(m) == rt}
        assert ours <= allowed, (name, ours - allowed)


def _distribution(requirement: str) -> str:
    return re.split(r"[\[<>=!~; ]", requirement, maxsplit=1)[0].lower().replace("_", "-")


def test_every_third_party_import_is_a_declared_dependency() -> None:
    """A module imported only because another dependency happens to pull it in (httpx2 came
    with the openai and anthropic SDKs, jsonschema with prefect) breaks when that one changes."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    declared = {_distribution(r) for r in project["dependencies"]}
    declared |= {_distribution(r) for reqs in project["optional-dependencies"].values() for r in reqs}
    providers = packages_distributions()
    undeclared: dict[str, list[str]] = {}
    for path in modules():
        for module in imports(path):
            top = module.split(".")[0]
            if top == "routeopt" or top in sys.stdlib_module_names or top == "__future__":
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(top, ())}
            if not dists & declared and top.replace("_", "-") not in declared:
                undeclared.setdefault(top, []).append(str(path.relative_to(REPO)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
