"""The shipped nginx kit, run as shipped (nginx-local.conf, unprivileged, from a copy of its
folder) by Debian's real nginx in front of the decision service and one fake model server per
candidate: each request reaches the server of the policy's choice with that model in its body
(plain and streamed) and that server's own Host; bad requests get the service's error, and
nginx's own errors are JSON in the same shape; a model nginx has no upstream for is a 502 that
says who chose it; a service that is down leaves the default model serving; and nginx's
auth_request, which cannot carry the body, never makes a decision on an empty prompt."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.publish.registry import move_channel
from routeopt.artifacts.serving.route_request import messages_text
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests import REPO, documented_ports_lock
from tests.artifacts.policies import SUITES
from tests.fake_llm import FakeLLM
from tests.litellm_proxy import free_port

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx (apt-get install nginx; .ci/run does)"),
]
SHIPPED = REPO / "gateways" / "nginx"


KIT = "nginx-local.conf"  # the unprivileged variant: run as shipped, on its own fixed ports
TEMP_PATHS = ("client_body_temp", "proxy_temp", "fastcgi_temp", "uwsgi_temp", "scgi_temp")


def _kit_ports() -> dict[str, int]:
    """The ports the shipped nginx-local.conf names: its listener, the decision service and
    each model's server (by the name its backend map gives the model)."""
    text = (SHIPPED / KIT).read_text()
    listen = int(re.search(r"listen 127\.0\.0\.1:(\d+);", text).group(1))
    upstreams = dict(re.findall(r"upstream (\w+)\s*\{\s*server 127\.0\.0\.1:(\d+);", text))
    backend_map = re.search(r"map \$routeopt_model \$routeopt_backend \{(.*?)\}", text, re.S).group(1)
    models = dict(re.findall(r"^\s*([\w.-]+)\s+(\w+);", backend_map, re.M))
    models.pop("default", None)
    return {
        "nginx": listen,
        "service": int(upstreams["routeopt_service"]),
        **{m: int(upstreams[u]) for m, u in models.items()},
    }


class _FakeAt(FakeLLM):
    """A fake model server on the fixed port the kit sends that model to."""

    def __init__(self, port: int) -> None:
        super().__init__()
        self.fixed_port = port
        self.stopped = False

    async def serve(self, port: int = 0) -> None:
        await super().serve(self.fixed_port)

    def stop(self) -> None:
        if not self.stopped:
            self.stopped = True
            super().stop()


def _as_nobody(folder: Path) -> list[str]:
    """As root, nginx runs as nobody (owning its folder): the kit must not need root. Run as
    anyone else, it runs as that user."""
    if os.geteuid() != 0:
        return []
    for path in (folder, *folder.rglob("*")):
        os.chown(path, 65534, 65534)
    return ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


def _naive_config(folder: Path, port: int, service_port: int, backend_port: int) -> str:
    """The set-up that does not work, in an nginx of its own: auth_request sends the service no body."""
    temp = " ".join(
        f"{k}_temp_path {folder / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi")
    )
    return f"""
user root;
daemon off;
worker_processes 1;
pid {folder / "nginx.pid"};
error_log {folder / "error.log"} warn;
events {{}}
http {{
    access_log off;
    {temp}
    upstream routeopt_service {{ server 127.0.0.1:{service_port}; }}
    server {{
        listen 127.0.0.1:{port};
        location = /v1/chat/completions {{
            auth_request /_route;
            auth_request_set $m $upstream_http_x_routeopt_model;
            proxy_set_header X-Routeopt-Model $m;
            proxy_pass http://127.0.0.1:{backend_port};
        }}
        location = /_route {{ internal; proxy_pass http://routeopt_service/v1/route; }}
    }}
}}
"""


def _wait_http(url: str, proc: subprocess.Popen | None, what: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc is not None and proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not answer within {deadline_s} s")


def _free(ports: dict[str, int]) -> None:
    for what, port in ports.items():
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as servers bind: past TIME_WAIT
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                pytest.fail(
                    f"port {port} ({what}) is taken: the test runs the shipped {KIT} as it is, "
                    f"on its ports {sorted(ports.values())}; free them"
                )


@pytest.fixture(scope="module")
def stack(tmp_path_factory, policies, keypair):
    from routeopt.artifacts.publish.registry import publish

    tmp = tmp_path_factory.mktemp("nginx")
    ports = _kit_ports()
    assert set(policies[0].candidates) <= set(ports), (
        f"{KIT}'s backend map lacks a candidate of the test policy"
    )
    # one test session at a time on the kit's fixed ports
    guard = documented_ports_lock()
    _free(ports)
    registry = tmp / "registry"
    publish(
        policies[0],
        registry,
        signing_key=keypair[0],
        lineage={"runs": ["r"]},
        metrics={"pass_rate": 0.9, "cost_usd": 0.01},
    )
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    reg_server, reg_url = serve_in_thread(registry)
    candidates = policies[0].candidates
    fakes = {c: _FakeAt(ports[c]).start() for c in candidates}
    naive_port = free_port()
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "ROUTEOPT_POLICY": reg_url,
        "ROUTEOPT_PUBLIC_KEY": str(keypair[1]),
        "ROUTEOPT_STATE_DIR": str(tmp / "state"),
    }
    service = subprocess.Popen(
        [sys.executable, "-m", "routeopt.flows.cli", "gateway", "serve", "--port", str(ports["service"])],
        env=env,
        cwd=tmp,
        stderr=subprocess.PIPE,
        text=True,
    )
    # the kit as a user runs it: the folder copied anywhere, `nginx -p "$PWD" -c nginx-local.conf` in it
    kit = Path(tempfile.mkdtemp(prefix="routeopt-nginx-"))
    shutil.copytree(SHIPPED, kit, dirs_exist_ok=True)
    user = _as_nobody(kit)
    command = [*user, NGINX, "-p", str(kit), "-c", KIT]
    started = subprocess.run(command, cwd=kit, capture_output=True, text=True, timeout=60)
    naive_dir = tmp / "naive"
    for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (naive_dir / k).mkdir(parents=True)
    (naive_dir / "naive.conf").write_text(
        _naive_config(naive_dir, naive_port, ports["service"], ports[candidates[0]])
    )
    naive = subprocess.Popen(
        [NGINX, "-p", str(naive_dir), "-c", str(naive_dir / "naive.conf")], stderr=subprocess.PIPE, text=True
    )
    try:
        assert started.returncode == 0, f"{' '.join(command)} failed:\n{started.stderr}"
        _wait_http(f"http://127.0.0.1:{ports['service']}/readyz", service, "routeopt gateway serve")
        _wait_http(f"http://127.0.0.1:{ports['nginx']}/v1/chat/completions", None, "nginx")
        _wait_http(f"http://127.0.0.1:{naive_port}/v1/chat/completions", naive, "the auth_request nginx")
        yield {
            "url": f"http://127.0.0.1:{ports['nginx']}",
            "naive": f"http://127.0.0.1:{naive_port}",
            "fakes": fakes,
            "expected": Gateway(load(registry, keypair[1], state_dir=False)),
            "service": service,
            "default": re.search(
                r"\$routeopt_default_model \{\s*default (\S+);", (SHIPPED / KIT).read_text()
            ).group(1),
            "error_log": naive_dir / "error.log",
            "kit": kit,
            "ports": ports,
            "as_nobody": bool(user),
        }
    finally:
        subprocess.run(
            [*user, NGINX, "-p", str(kit), "-c", KIT, "-s", "stop"], cwd=kit, capture_output=True, timeout=60
        )
        for proc in (naive, service):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        reg_server.shutdown()
        for fake in fakes.values():
            fake.stop()
        _wait_gone(kit / "nginx.pid")
        shutil.rmtree(kit, ignore_errors=True)
        guard.close()


def _wait_gone(pid_file: Path, deadline_s: float = 30) -> None:
    end = time.monotonic() + deadline_s
    while pid_file.exists() and time.monotonic() < end:
        time.sleep(0.05)


def _landed(fakes: dict[str, FakeLLM], marker: str) -> list[tuple[str, str]]:
    calls = [
        (r.t, c, r.body.get("model"))
        for c, f in fakes.items()
        for r in f.requests
        if marker in json.dumps(r.body)
    ]
    return [(c, m) for _, c, m in sorted(calls)]


def test_each_request_reaches_the_policys_model_plain_and_streamed(stack) -> None:
    client = OpenAI(base_url=stack["url"] + "/v1", api_key="sk-client-key", max_retries=0)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    chosen = []
    for i in range(40):
        suite, difficulty = (*SUITES, None)[i % 4], 1 + i % 5
        text = f"{suite or 'add'} task difficulty {difficulty}: " + " ".join(
            words[(i + k) % 5] for k in range(3 * difficulty)
        )
        messages = [{"role": "user", "content": f"{text} #{i}#"}]
        metadata = {"routeopt_suite": suite} if suite else {}
        want = stack["expected"].route(messages_text(messages), suite)
        raw = client.chat.completions.with_raw_response.create(
            model="routeopt", messages=messages, stream=i % 2 == 1, extra_body={"metadata": metadata}
        )
        parsed = raw.parse()
        answer = (
            "".join(c.choices[0].delta.content or "" for c in parsed if c.choices)
            if i % 2
            else parsed.choices[0].message.content
        )
        assert answer == f"echo: {text} #{i}#"
        assert (
            raw.headers["x-routeopt-model"] == want.model and raw.headers["x-routeopt-policy-version"] == "1"
        )
        assert raw.headers["x-routeopt-fallbacks"] == ",".join(want.fallbacks)
        assert raw.headers["x-routeopt-decision-id"]  # nginx's $request_id
        chosen.append(want.model)
    assert [_landed(stack["fakes"], f"#{i}#") for i in range(40)] == [[(m, m)] for m in chosen]
    assert len(set(chosen)) >= 2
    upstream = [r for f in stack["fakes"].values() for r in f.requests]
    assert all(r.headers["authorization"] == "Bearer sk-client-key" for r in upstream)
    # each server is sent its own name (the kit's routeopt_backend_host map), not the upstream block's
    for model, fake in stack["fakes"].items():
        assert {r.headers["host"] for r in fake.requests} <= {f"127.0.0.1:{stack['ports'][model]}"}, model


def _upstream_calls(stack) -> int:
    return sum(len(f.requests) for f in stack["fakes"].values())


def test_a_bad_request_gets_the_services_error_and_reaches_no_model(stack) -> None:
    before = _upstream_calls(stack)
    r = httpx.post(
        stack["url"] + "/v1/chat/completions",
        content=b'{"model": "routeopt", "messages": [}',
        headers={"content-type": "application/json"},
        timeout=30,
    )
    empty = httpx.post(
        stack["url"] + "/v1/chat/completions", json={"model": "routeopt", "messages": []}, timeout=30
    )
    big = httpx.post(stack["url"] + "/v1/chat/completions", content=b"x" * (17 << 20), timeout=60)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    assert empty.status_code == 400 and "messages is empty" in empty.json()["error"]
    # nginx's client_max_body_size, before anything is decided: JSON in the service's shape
    assert big.status_code == 413 and big.headers["content-type"] == "application/json"
    assert set(big.json()) == {"error"} and "16 MiB" in big.json()["error"]
    assert _upstream_calls(stack) == before


def test_the_kit_runs_unprivileged_and_writes_only_into_its_folder(stack) -> None:
    kit = stack["kit"]
    pid = int((kit / "nginx.pid").read_text())
    uid = int(
        next(
            line for line in Path(f"/proc/{pid}/status").read_text().splitlines() if line.startswith("Uid:")
        ).split()[1]
    )
    assert uid == (65534 if stack["as_nobody"] else os.geteuid())
    written = {p.name for p in kit.iterdir()} - {p.name for p in SHIPPED.iterdir()}
    assert written == {"nginx.pid", "error.log", "access.log", *TEMP_PATHS}
    assert "POST /v1/chat/completions" in (kit / "access.log").read_text()
    assert "[emerg]" not in (kit / "error.log").read_text()


def test_a_model_nginx_has_no_upstream_for_is_a_json_502_saying_who_chose_it(stack) -> None:
    """The client named a model itself: the service passes it through, unrouted, and the 502
    says so, naming the map to add it to (not nginx's expansion of a variable)."""
    before = _upstream_calls(stack)
    r = httpx.post(
        stack["url"] + "/v1/chat/completions",
        json={"model": "gpt-unmapped", "messages": [{"role": "user", "content": "unmapped-probe"}]},
        timeout=30,
    )
    assert r.status_code == 502 and r.headers["content-type"] == "application/json"
    error = r.json()["error"]
    assert "the request named the model 'gpt-unmapped' itself" in error and "routeopt chose" not in error
    assert "add it to the routeopt_backend map" in error and "  " not in error
    assert r.headers["x-routeopt-model"] == "gpt-unmapped"
    # a name JSON would need escaped is not echoed into the body, which stays valid JSON
    odd = httpx.post(
        stack["url"] + "/v1/chat/completions",
        json={"model": 'x"y\\z', "messages": [{"role": "user", "content": "odd-probe"}]},
        timeout=30,
    )
    assert odd.status_code == 502 and "not shown here" in odd.json()["error"]
    assert _upstream_calls(stack) == before


def test_the_shipped_example_config_is_valid_nginx(tmp_path) -> None:
    conf = tmp_path / "nginx"
    shutil.copytree(SHIPPED, conf)
    done = subprocess.run(
        [
            NGINX,
            "-t",
            "-p",
            str(conf),
            "-c",
            str(conf / "nginx.conf"),
            "-g",
            f"pid {conf / 'nginx.pid'}; error_log stderr;",
        ],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0 and "syntax is ok" in done.stderr, done.stderr


def test_auth_request_would_send_no_body_so_nothing_is_routed(stack) -> None:
    """The naive auth_request set-up: nginx sends the service a GET without the prompt; the
    service refuses it (405) instead of deciding on nothing, so nginx fails the request."""
    r = httpx.post(
        stack["naive"] + "/v1/chat/completions",
        json={"model": "routeopt", "messages": [{"role": "user", "content": "naive-probe"}]},
        timeout=30,
    )
    assert r.status_code == 500 and not _landed(stack["fakes"], "naive-probe")
    assert "auth request unexpected status: 405" in stack["error_log"].read_text()


def test_with_the_service_down_the_default_model_serves(stack) -> None:
    """Runs next to last in this module: it stops the decision service."""
    stack["service"].send_signal(signal.SIGTERM)
    stack["service"].wait(30)
    r = httpx.post(
        stack["url"] + "/v1/chat/completions",
        json={"model": "routeopt", "messages": [{"role": "user", "content": "down-probe"}]},
        timeout=30,
    )
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: down-probe"
    assert r.headers["x-routeopt-model"] == stack["default"]
    assert r.headers["x-routeopt-default-reason"] == "decision service unavailable"
    assert _landed(stack["fakes"], "down-probe") == [(stack["default"], stack["default"])]


class _ChoosesUnmapped(BaseHTTPRequestHandler):
    """A decision service whose policy chooses a model nginx has no upstream for; a model the
    request names passes through, unrouted, as the real service does."""

    def do_POST(self) -> None:
        named = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)))["model"]
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", "2")
        if named == "routeopt":
            self.send_header("X-Routeopt-Model", "unmapped-model")
            self.send_header("X-Routeopt-Policy-Version", "1")
        else:
            self.send_header("X-Routeopt-Model", named)
            self.send_header("X-Routeopt-Routed", "false")
        self.send_header("X-Accel-Redirect", self.headers["X-Routeopt-Accel-Redirect"])
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *_: object) -> None:
        pass


def test_nginxs_own_failures_are_json_and_name_who_chose_the_model(stack) -> None:
    """Runs after the service is stopped: a service on its port whose policy chose a model nginx
    has no upstream for, then a model server that is down."""
    if stack["service"].poll() is None:
        stack["service"].send_signal(signal.SIGTERM)
        stack["service"].wait(30)
    server = ThreadingHTTPServer(("127.0.0.1", stack["ports"]["service"]), _ChoosesUnmapped)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    body = {"model": "routeopt", "messages": [{"role": "user", "content": "chosen-probe"}]}
    try:
        chosen = httpx.post(stack["url"] + "/v1/chat/completions", json=body, timeout=30)
        assert chosen.status_code == 502 and chosen.headers["content-type"] == "application/json"
        assert chosen.json()["error"].startswith(
            "routeopt chose the model 'unmapped-model', and nginx has no upstream"
        )
        assert "request named" not in chosen.json()["error"]

        down = stack["fakes"]["large"]
        down.stop()
        named = httpx.post(
            stack["url"] + "/v1/chat/completions",
            json={"model": "large", "messages": [{"role": "user", "content": "down-server"}]},
            timeout=30,
        )
        assert named.status_code == 502 and named.headers["content-type"] == "application/json"
        assert set(named.json()) == {"error"}
        assert "the server of the model 'large' did not answer" in named.json()["error"]
    finally:
        server.shutdown()
        server.server_close()
