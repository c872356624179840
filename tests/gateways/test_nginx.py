"""The shipped nginx config, run by Debian's real nginx in front of the decision service and one
fake model server per candidate: each request reaches the server of the policy's choice with
that model in its body (plain and streamed); bad requests get the service's error; a service
that is down leaves the default model serving; and nginx's auth_request, which cannot carry the
body, never makes a decision on an empty prompt."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import httpx
import pytest
from openai import OpenAI

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.publish.registry import move_channel
from routeopt.artifacts.serving.route_request import messages_text
from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from tests import REPO
from tests.artifacts.policies import SUITES
from tests.fake_llm import FakeLLM
from tests.litellm_proxy import free_port

NGINX = shutil.which("nginx") or next((p for p in ("/usr/sbin/nginx",) if Path(p).exists()), None)
pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(NGINX is None, reason="needs Debian's nginx (apt-get install nginx; .ci/run does)")]
SHIPPED = REPO / "gateways" / "nginx"


def _top_level(folder: Path, port: int, service_port: int, backends: dict[str, int], default: str,
               naive_port: int) -> str:
    """A top-level config like the shipped example's, for this test's ports and paths."""
    upstreams = "\n".join(f"    upstream {c}_llm {{ server 127.0.0.1:{p}; keepalive 8; }}" for c, p in backends.items())
    mapping = "\n".join(f"        {c} {c}_llm;" for c in backends)
    temp = " ".join(f"{k}_temp_path {folder / k};" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    return f"""
user root;
daemon off;
worker_processes 1;
pid {folder / 'nginx.pid'};
error_log {folder / 'error.log'} warn;
events {{}}
http {{
    access_log off;
    {temp}
    include routeopt-http.conf;
    upstream routeopt_service {{ server 127.0.0.1:{service_port}; keepalive 8; }}
{upstreams}
    map $routeopt_model $routeopt_backend {{
        default "";
{mapping}
    }}
    map $host $routeopt_default_model {{ default {default}; }}
    server {{
        listen 127.0.0.1:{port};
        include routeopt-server.conf;
        location = /v1/chat/completions {{ include routeopt-route.conf; }}
        location = /v1/completions      {{ include routeopt-route.conf; }}
    }}
    server {{  # the set-up that does not work: auth_request sends the service no body
        listen 127.0.0.1:{naive_port};
        location = /v1/chat/completions {{
            auth_request /_route;
            auth_request_set $m $upstream_http_x_routeopt_model;
            proxy_set_header X-Routeopt-Model $m;
            proxy_pass http://{next(iter(backends))}_llm;
        }}
        location = /_route {{ internal; proxy_pass http://routeopt_service/v1/route; }}
    }}
}}
"""


def _wait_http(url: str, proc: subprocess.Popen, what: str, deadline_s: float = 120) -> None:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited with {proc.returncode}")
        try:
            urllib.request.urlopen(url, timeout=2).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise AssertionError(f"{what} did not answer within {deadline_s} s")


@pytest.fixture(scope="module")
def stack(tmp_path_factory, policies, keypair):
    from routeopt.artifacts.publish.registry import publish

    tmp = tmp_path_factory.mktemp("nginx")
    registry = tmp / "registry"
    publish(policies[0], registry, signing_key=keypair[0], lineage={"runs": ["r"]},
            metrics={"pass_rate": 0.9, "cost_usd": 0.01})
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    reg_server, reg_url = serve_in_thread(registry)
    candidates = policies[0].candidates
    fakes = {c: FakeLLM().start() for c in candidates}
    service_port, port, naive_port = free_port(), free_port(), free_port()
    env = {**os.environ, "PYTHONPATH": str(REPO), "ROUTEOPT_POLICY": reg_url,
           "ROUTEOPT_PUBLIC_KEY": str(keypair[1]), "ROUTEOPT_STATE_DIR": str(tmp / "state")}
    service = subprocess.Popen([sys.executable, "-m", "routeopt.flows.cli", "gateway", "serve", "--port", str(service_port)],
                               env=env, cwd=tmp, stderr=subprocess.PIPE, text=True)
    conf = tmp / "conf"
    shutil.copytree(SHIPPED, conf)  # as a platform team copies the folder
    for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"):
        (conf / k).mkdir()
    (conf / "test.conf").write_text(_top_level(conf, port, service_port, {c: f.port for c, f in fakes.items()},
                                               candidates[0], naive_port))
    nginx = subprocess.Popen([NGINX, "-p", str(conf), "-c", str(conf / "test.conf")],
                             stderr=subprocess.PIPE, text=True)
    try:
        _wait_http(f"http://127.0.0.1:{service_port}/readyz", service, "routeopt gateway serve")
        _wait_http(f"http://127.0.0.1:{port}/v1/chat/completions", nginx, "nginx")
        yield {"url": f"http://127.0.0.1:{port}", "naive": f"http://127.0.0.1:{naive_port}", "fakes": fakes,
               "expected": Gateway(load(registry, keypair[1], state_dir=False)), "service": service,
               "default": candidates[0], "error_log": conf / "error.log"}
    finally:
        for proc in (nginx, service):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait(30)
        reg_server.shutdown()
        for fake in fakes.values():
            fake.stop()


def _landed(fakes: dict[str, FakeLLM], marker: str) -> list[tuple[str, str]]:
    calls = [(r.t, c, r.body.get("model")) for c, f in fakes.items() for r in f.requests
             if marker in json.dumps(r.body)]
    return [(c, m) for _, c, m in sorted(calls)]


def test_each_request_reaches_the_policys_model_plain_and_streamed(stack) -> None:
    client = OpenAI(base_url=stack["url"] + "/v1", api_key="sk-client-key", max_retries=0)
    words = ["alpha", "beta", "gamma", "delta", "eps"]
    chosen = []
    for i in range(40):
        suite, difficulty = (*SUITES, None)[i % 4], 1 + i % 5
        text = f"{suite or 'add'} task difficulty {difficulty}: " + " ".join(words[(i + k) % 5] for k in range(3 * difficulty))
        messages = [{"role": "user", "content": f"{text} #{i}#"}]
        metadata = {"routeopt_suite": suite} if suite else {}
        want = stack["expected"].route(messages_text(messages), suite)
        raw = client.chat.completions.with_raw_response.create(
            model="routeopt", messages=messages, stream=i % 2 == 1, extra_body={"metadata": metadata})
        parsed = raw.parse()
        answer = "".join(c.choices[0].delta.content or "" for c in parsed if c.choices) if i % 2 \
            else parsed.choices[0].message.content
        assert answer == f"echo: {text} #{i}#"
        assert raw.headers["x-routeopt-model"] == want.model and raw.headers["x-routeopt-policy-version"] == "1"
        assert raw.headers["x-routeopt-fallbacks"] == ",".join(want.fallbacks)
        assert raw.headers["x-routeopt-decision-id"]  # nginx's $request_id
        chosen.append(want.model)
    assert [_landed(stack["fakes"], f"#{i}#") for i in range(40)] == [[(m, m)] for m in chosen]
    assert len(set(chosen)) >= 2
    upstream = [r for f in stack["fakes"].values() for r in f.requests]
    assert all(r.headers["authorization"] == "Bearer sk-client-key" for r in upstream)


def _upstream_calls(stack) -> int:
    return sum(len(f.requests) for f in stack["fakes"].values())


def test_a_bad_request_gets_the_services_error_and_reaches_no_model(stack) -> None:
    before = _upstream_calls(stack)
    r = httpx.post(stack["url"] + "/v1/chat/completions", content=b'{"model": "routeopt", "messages": [}',
                   headers={"content-type": "application/json"}, timeout=30)
    empty = httpx.post(stack["url"] + "/v1/chat/completions", json={"model": "routeopt", "messages": []}, timeout=30)
    big = httpx.post(stack["url"] + "/v1/chat/completions", content=b"x" * (17 << 20), timeout=60)
    assert r.status_code == 400 and "not JSON" in r.json()["error"]
    assert empty.status_code == 400 and "messages is empty" in empty.json()["error"]
    assert big.status_code == 413  # nginx's client_max_body_size, before anything is decided
    assert _upstream_calls(stack) == before


def test_the_shipped_example_config_is_valid_nginx(tmp_path) -> None:
    conf = tmp_path / "nginx"
    shutil.copytree(SHIPPED, conf)
    done = subprocess.run([NGINX, "-t", "-p", str(conf), "-c", str(conf / "nginx.conf"),
                           "-g", f"pid {conf / 'nginx.pid'}; error_log stderr;"], capture_output=True, text=True)
    assert done.returncode == 0 and "syntax is ok" in done.stderr, done.stderr


def test_auth_request_would_send_no_body_so_nothing_is_routed(stack) -> None:
    """The naive auth_request set-up: nginx sends the service a GET without the prompt; the
    service refuses it (405) instead of deciding on nothing, so nginx fails the request."""
    r = httpx.post(stack["naive"] + "/v1/chat/completions",
                   json={"model": "routeopt", "messages": [{"role": "user", "content": "naive-probe"}]}, timeout=30)
    assert r.status_code == 500 and not _landed(stack["fakes"], "naive-probe")
    assert "auth request unexpected status: 405" in stack["error_log"].read_text()


def test_with_the_service_down_the_default_model_serves(stack) -> None:
    """Runs last in this module: it stops the decision service."""
    stack["service"].send_signal(signal.SIGTERM)
    stack["service"].wait(30)
    r = httpx.post(stack["url"] + "/v1/chat/completions",
                   json={"model": "routeopt", "messages": [{"role": "user", "content": "down-probe"}]}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "echo: down-probe"
    assert r.headers["x-routeopt-model"] == stack["default"]
    assert r.headers["x-routeopt-default-reason"] == "decision service unavailable"
    assert _landed(stack["fakes"], "down-probe") == [(stack["default"], stack["default"])]
