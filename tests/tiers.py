"""Test tiers, read from what each test uses: `tests/conftest.py` marks every collected test.

A test's uses are the names its code refers to: the test function, the fixtures it requests and,
through them, every helper function and class written under tests/ (followed to any depth), plus
the string and path constants among them. `USES` maps what makes a test slow to its markers;
`FACTS` is the short list of tests whose reason cannot be read that way (a shell script or a
subprocess command line that starts a whole pipeline). Any of these markers also adds `slow`;
pyproject.toml registers them and says what each means.

    python -m pytest -m "not slow"          # the fast tier
    python -m pytest -m "node or venv"      # one kind of slow test
"""

from __future__ import annotations

import inspect
import re
import sys
import types
from collections.abc import Iterable, Iterator
from pathlib import Path, PurePath

import pytest

TESTS = str(Path(__file__).resolve().parent)

# A referenced name (a function, class or module, by qualified name; or a prefix of one) -> markers.
USES: dict[str, tuple[str, ...]] = {
    "prefect.testing.utilities.prefect_test_harness": ("prefect",),
    "routeopt.flows.prefect_api.launch": ("prefect",),
    "subprocess.Popen": ("subprocess_server",),
    "tests.gateway_venv.build_gateway_venv": ("venv",),
    "tests.litellm_proxy.proxy_venv": ("venv",),
    "tests.phoenix_server.phoenix_venv": ("venv",),
    "tests.installer.make_venv": ("venv",),
    "tests.gateways.node.node": ("node",),
    "routeopt.evals.providers.local.provider.LocalProvider": ("model",),
    "routeopt.evals.providers.local.provider.create": ("model",),
    "routeopt.evals.providers.local.provider.keep_loaded": ("model",),
    "routeopt.evals.selfhost.zoo.build_zoo": ("model",),
    "distributed.LocalCluster": ("cluster",),
}
# A string or path constant the code uses, matched by pattern -> markers.
CONSTANTS: dict[re.Pattern[str], tuple[str, ...]] = {
    re.compile(r"\bzoo-[sml]\b|demo/zoo\b"): ("model",),  # a zoo checkpoint, by name or folder
    re.compile(r"/shared(/|$)"): ("shared_data",),  # the ../shared folder, or a set in it
    re.compile(r"^venv$"): ("venv",),  # `python -m venv ...`
    re.compile(r"^distributed$"): ("cluster",),  # `pytest.importorskip("distributed")`, then a cluster
}
# Tests whose reason is in a command line another program runs: node id -> markers.
FACTS: dict[str, tuple[str, ...]] = {
    # benchmarks/gpu_check.sh builds tiny random checkpoints, serves them, then runs `routeopt run`
    "tests/benchmarks/test_gpu_check.py::test_shell_script_runs_the_pipeline_on_cpu": ("model",),
    "tests/benchmarks/test_gpu_check.py::test_cpu_tiny_end_to_end": ("model",),
    # the sets are found beside the checkout, or beside a worktree's parent
    "tests/gateways/test_js_runtime.py::test_policies_trained_on_every_shared_set_pass_in_javascript": (
        "shared_data",
    ),
}


def tiers(item: pytest.Item) -> set[str]:
    """The tier markers `item` earns from what it uses."""
    names: set[str] = set()
    seen: set[int] = set()
    if (func := getattr(item, "function", None)) is not None:
        _collect(func, seen, names)
    for func in _fixture_functions(item):
        _collect(func, seen, names)
    found = set(FACTS.get(item.nodeid.split("[")[0], ()))
    for name in names:
        if name.startswith("'"):
            found.update(m for pattern, marks in CONSTANTS.items() if pattern.search(name[1:]) for m in marks)
        else:
            found.update(
                m
                for trigger, marks in USES.items()
                if name == trigger or name.startswith(trigger + ".")
                for m in marks
            )
    return found


def xdist_group(item: pytest.Item, found: set[str]) -> str | None:
    """The pytest-xdist group `item` runs in (all of a group on one worker, in order), if any.

    Node tests share gateways/js/dist on disk, which a build (npm run build, npm pack) empties
    first: they run on one worker. Otherwise, a test file with a module- or class-scoped fixture
    written under tests/ runs on one worker, which sets the fixture up once."""
    if "node" in found:
        return "gateways-js"
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        if any(d.scope in ("module", "class") and _ours(_unwrapped(d.func)) for d in defs):
            return item.nodeid.split("::")[0]
    return None


def _fixture_functions(item: pytest.Item) -> Iterator[object]:
    info = getattr(item, "_fixtureinfo", None)
    for defs in info.name2fixturedefs.values() if info else ():
        for fixturedef in defs:
            func = _unwrapped(fixturedef.func)
            if _ours(func):
                yield func


def _unwrapped(func: object) -> object:
    get = getattr(func, "_get_wrapped_function", None)  # pytest's FixtureFunctionDefinition
    return get() if get is not None else func


def _ours(obj: object) -> bool:
    """A function or class written under tests/ (test folders without an __init__.py import their
    modules under bare names, so the file decides, not the module's name)."""
    if not (inspect.isfunction(obj) or inspect.isclass(obj)):
        return False
    module = sys.modules.get(getattr(obj, "__module__", None) or "")
    return (getattr(module, "__file__", None) or "").startswith(TESTS)


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _qualname(obj: object) -> str | None:
    if isinstance(obj, types.ModuleType):
        return obj.__name__
    module, qual = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qual}" if isinstance(module, str) and isinstance(qual, str) else None


def _collect(fn: object, seen: set[int], out: set[str]) -> None:
    """Add to `out` what `fn` refers to: qualified names, and constants prefixed with a quote."""
    if id(fn) in seen:
        return
    seen.add(id(fn))
    if inspect.isclass(fn):
        for member in vars(fn).values():
            member = getattr(member, "__func__", getattr(member, "fget", member))
            if inspect.isfunction(member):
                _collect(member, seen, out)
        return
    fn = inspect.unwrap(fn)
    code, scope = getattr(fn, "__code__", None), getattr(fn, "__globals__", {})
    if code is None:
        return
    for co in _codes(code):
        out.update(f"'{c}" for c in co.co_consts if isinstance(c, str) and len(c) < 300)
        for name in co.co_names:
            if "." in name or name in sys.modules:  # `import x` or `from x.y import z` in a body
                out.update(f"{name}.{attr}" for attr in co.co_names)
            obj = scope.get(name)
            if obj is None:
                continue
            _add(obj, seen, out)
            if isinstance(obj, types.ModuleType):
                _add_members(obj, co.co_names, seen, out)


def _add(obj: object, seen: set[int], out: set[str]) -> None:
    if isinstance(obj, (str, PurePath)):
        out.add(f"'{obj}")
    elif qual := _qualname(obj):
        out.add(qual)
        if _ours(obj):
            _collect(obj, seen, out)


def _add_members(module: types.ModuleType, names: Iterable[str], seen: set[int], out: set[str]) -> None:
    """`module.attr` references (the attribute's name is among the code's names)."""
    members = vars(module)
    for attr in names:
        if attr in members:
            out.add(f"{module.__name__}.{attr}")
            _add(members[attr], seen, out)
