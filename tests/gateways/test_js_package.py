"""The JavaScript gateway as users get it: `npm pack` in gateways/js, the tarball installed into an
empty Node project (offline: the package has no runtime dependencies), imported by its name, and
routing a policy the Python pipeline published exactly as the Python runtime does, in Node and
bundled into a worker (esbuild, as wrangler bundles) run by workerd."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests.gateways.node import PACKAGE, node, package, run_node
from tests.gateways.node import tarball as packed_tarball
from tests.gateways.test_js_runtime import _python_decisions, _requests, _same, build_fixtures

NPM_ENV = {"npm_config_fund": "false", "npm_config_audit": "false", "npm_config_update_notifier": "false"}


def _npm(cwd: Path, *args: str, cache: Path, timeout: int = 600) -> subprocess.CompletedProcess:
    done = subprocess.run(
        ["npm", *args, "--cache", str(cache)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **NPM_ENV},
    )
    assert done.returncode == 0, (
        f"npm {' '.join(args)} failed in {cwd}:\n{done.stdout[-3000:]}{done.stderr[-3000:]}"
    )
    return done


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory) -> Path:
    package()
    return build_fixtures(tmp_path_factory.mktemp("js-package-fixtures"))


@pytest.fixture(scope="module")
def tarball() -> Path:
    """`npm pack` as a release runs it, its prepack script building dist/ from src/ (the build
    the other JavaScript tests run on; tests/gateways/node.py)."""
    return packed_tarball()


@pytest.fixture(scope="module")
def app(tmp_path_factory, tarball) -> dict:
    """An empty Node project that installs the tarball and routes; timed as a user would see it."""
    root = tmp_path_factory.mktemp("app")
    (root / "package.json").write_text(json.dumps({"name": "app", "private": True, "type": "module"}))
    return {"root": root, "cache": tmp_path_factory.mktemp("npm-cache")}


def test_the_tarball_holds_the_built_package_and_nothing_else(tarball) -> None:
    with tarfile.open(tarball) as t:
        names = sorted(n.removeprefix("package/") for n in t.getnames())
        manifest = json.load(t.extractfile("package/package.json"))
    assert tarball.stat().st_size < 1 << 20, f"{tarball.name} is {tarball.stat().st_size} bytes"
    assert {
        "package.json",
        "README.md",
        "LICENSE",
        "dist/index.js",
        "dist/index.d.ts",
        "dist/node.js",
        "dist/node.d.ts",
        "dist/blake2b-wasm.js",
        "dist/kernel-wasm.js",
    } <= set(names)
    assert all(n in ("package.json", "README.md", "LICENSE") or n.startswith("dist/") for n in names), names
    assert not any(n.endswith(".ts") and not n.endswith(".d.ts") for n in names)
    assert manifest["name"] == "@routeopt/gateway" and manifest["license"] == "Apache-2.0"
    assert "dependencies" not in manifest and manifest["sideEffects"] is False
    assert manifest["exports"]["."] == {"types": "./dist/index.d.ts", "default": "./dist/index.js"}
    print(f"\n{tarball.name}: {tarball.stat().st_size} bytes, {len(names)} files")


def test_an_empty_project_installs_the_tarball_offline_and_routes_like_python(app, tarball, fixtures) -> None:
    requests = _requests()
    (app["root"] / "requests.json").write_text(json.dumps({"requests": requests}))
    (app["root"] / "route.mjs").write_text((PACKAGE / "test" / "package" / "route.mjs").read_text())
    version = next((fixtures / "registry" / "versions").glob("000001-*"))
    pem = fixtures / "keys" / "public_key.pem"
    started = time.perf_counter()
    _npm(app["root"], "install", "--offline", str(tarball), cache=app["cache"])
    done = subprocess.run(
        [node(), "route.mjs", str(version), str(pem), "requests.json"],
        cwd=app["root"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    seconds = time.perf_counter() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    print(
        f"\nnpm install {tarball.name} + route {len(requests)} requests in an empty project: {seconds:.1f} s"
    )
    assert seconds <= 30
    installed = sorted(p.name for p in (app["root"] / "node_modules").iterdir() if not p.name.startswith("."))
    assert installed == ["@routeopt"] and [
        p.name for p in (app["root"] / "node_modules" / "@routeopt").iterdir()
    ] == ["gateway"]
    answer = json.loads(done.stdout)
    assert answer["version"] == 1 and "agree at every layer" in answer["conformance"]
    assert answer["kernel"] == "webassembly" and answer["fileLog"] == "function"
    # the package's major version is the policy format it reads
    assert int(answer["packageVersion"].split(".")[0]) == answer["formatVersion"] == 3
    expected = json.loads((fixtures / "expected" / "demo-linear.json").read_text())["requests"]
    assert len(answer["decisions"]) == len(expected)
    for js_d, py_d in zip(answer["decisions"], expected):
        _same(js_d, py_d)


def test_the_installed_types_check_under_nodenext(app, tarball) -> None:
    """The exports' types resolve as a TypeScript app resolves them (node16/nodenext)."""
    if not (app["root"] / "node_modules" / "@routeopt" / "gateway").exists():
        _npm(app["root"], "install", "--offline", str(tarball), cache=app["cache"])
    (app["root"] / "check.ts").write_text(
        'import { Router, type Decision } from "@routeopt/gateway";\n'
        'import { FileLog } from "@routeopt/gateway/node";\n'
        "const router: Router = await Router.open({ files: {}, allowUnsigned: true });\n"
        'const d: Decision = router.route("hi", { suite: "add" });\n'
        "const model: string = d.model;\n"
        'new FileLog("/tmp/x").write(model);\n'
    )
    done = subprocess.run(
        [
            node(),
            str(PACKAGE / "node_modules" / "typescript" / "bin" / "tsc"),
            "--noEmit",
            "--strict",
            "--module",
            "nodenext",
            "--moduleResolution",
            "nodenext",
            "--target",
            "es2022",
            "--lib",
            "es2022,dom",
            "check.ts",
        ],
        cwd=app["root"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]


def test_a_worker_bundles_the_installed_package_and_routes_like_python(app, tarball, fixtures) -> None:
    if not (app["root"] / "node_modules" / "@routeopt" / "gateway").exists():
        _npm(app["root"], "install", "--offline", str(tarball), cache=app["cache"])
    (app["root"] / "worker.mjs").write_text((PACKAGE / "test" / "package" / "worker.mjs").read_text())
    requests = _requests()
    (app["root"] / "worker-requests.json").write_text(json.dumps({"requests": requests}))
    server, url = serve_in_thread(fixtures / "registry")
    try:
        done = run_node(
            "test/package/worker-run.mjs",
            str(app["root"]),
            url,
            str(fixtures / "keys" / "public_key.pem"),
            str(app["root"] / "worker-requests.json"),
            timeout=600,
        )
    finally:
        server.shutdown()
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    answer = json.loads(done.stdout)
    assert "error" not in answer, answer
    # the bundle took the package from the app's node_modules, not from the checkout's src/
    assert answer["bundled"] and all(
        p.startswith(os.path.join("node_modules", "@routeopt", "gateway", "dist"))
        for p in answer["bundled"]
        if p != "worker.mjs"
    ), answer["bundled"]
    assert answer["kernel"] == "javascript" and answer["status"]["version"] == 2
    python = load(
        fixtures / "registry",
        public_key=fixtures / "keys" / "public_key.pem",
        channel="latest",
        state_dir=False,
    )
    for js_d, py_d in zip(answer["decisions"], _python_decisions(python, requests)):
        _same(js_d, py_d)
