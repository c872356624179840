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

OURS = ("common", "evals", "router_training", "artifacts", "reports", "flows")
EVALS = ("evals.config", "evals.providers", "evals.grading", "evals.suite", "evals.storage",
         "evals.execution", "evals.selfhost")
ALLOWED: dict[str, set[str]] = {
    "common": set(),
    "evals": set(),
    "evals.config": set(),
    "evals.providers": {"evals.config"},
    "evals.grading": {"evals.config", "evals.providers"},
    "evals.suite": {"evals.config", "evals.providers", "evals.grading"},
    "evals.storage": {"evals.config", "evals.suite"},
    "evals.execution": {"evals.config", "evals.providers", "evals.grading", "evals.suite", "evals.storage"},
    "evals.selfhost": {"evals.config", "evals.providers", "evals.suite", "evals.storage"},
    "router_training": set(),
    "artifacts": {"router_training"},
    "reports": {"evals", *EVALS, "router_training", "artifacts"},
    "flows": {"evals", *EVALS, "router_training", "artifacts", "reports"},
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
    return sorted(p for top in OURS for p in (REPO / top).rglob("*.py")
                  if "suites" not in p.relative_to(REPO).parts)


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(REPO)))
def test_imports_follow_the_layers(path: Path) -> None:
    me = unit(".".join(path.relative_to(REPO).with_suffix("").parts))
    assert me is not None
    allowed = ALLOWED[me] | {me} | ({"common"} if me != "common" else set())
    if me.startswith("evals."):
        allowed.add("evals")  # the package itself (its docstring), never a sibling via it
    wrong = sorted(m for m in imports(path) if (u := unit(m)) is not None and u not in allowed
                   and not (u == "evals" and m != "evals"))
    assert not wrong, f"{path.relative_to(REPO)} ({me}) imports {wrong}; allowed: {sorted(ALLOWED[me])}"


GATEWAY_MODULES = ("policy", "features", "numerics", "trees", "tensors", "policy_files", "conformance",
                   "conformance_inputs", "batch", "draws")


def test_the_gateway_modules_are_leaves_of_router_training() -> None:
    """What a gateway loads (the policy, its format 3 files, its self-check and the draws:
    docs/architecture.md, "The gateway side") imports no other router_training module but each
    other and the optional embeddings, so numpy is all they need."""
    allowed = {f"router_training.{n}" for n in GATEWAY_MODULES} | {"router_training.embeddings"}
    for name in GATEWAY_MODULES:
        ours = {".".join(m.split(".")[:2]) for m in imports(REPO / "router_training" / f"{name}.py")
                if unit(m) == "router_training"}
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
            if unit(top) is not None or top in sys.stdlib_module_names or top == "__future__":
                continue
            dists = {d.lower().replace("_", "-") for d in providers.get(top, ())}
            if not dists & declared and top.replace("_", "-") not in declared:
                undeclared.setdefault(top, []).append(str(path.relative_to(REPO)))
    assert not undeclared, f"imported but not declared in pyproject.toml: {undeclared}"
