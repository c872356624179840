"""The decision service's HTTP server, on a real socket: the service's answers unchanged, keep-alive
and pipelining, and each limit attacked with raw bytes (malformed requests, header floods, bodies
over the limit, slow clients); workers share one port, split connections and stop on SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from routeopt.artifacts.serving import http_server
from routeopt.artifacts.serving.decision_service import DecisionService
from routeopt.artifacts.serving.service_metrics import SharedMetrics, merge
from routeopt.artifacts.serving.http_server import Limits, Request, Response, Serving, bind
from routeopt.artifacts.serving.settings import GatewaySettings
from tests.artifacts.policies import PROMPTS
from tests.artifacts.serving.workers import two_workers


class Running:
    """A server on a thread; `stop()` ends it as SIGTERM would."""

    def __init__(self, handler, limits: Limits | None = None) -> None:
        self.sock = bind("127.0.0.1", 0)
        self.port = self.sock.getsockname()[1]
        self.serving = Serving(self.sock, handler, limits or Limits())
        self.stopped = threading.Event()
        self.thread = threading.Thread(
            target=lambda: self.serving.run(on_stop=self.stopped.set, signals=False), daemon=True
        )
        self.thread.start()

    def stop(self) -> None:
        self.serving.stop_soon()
        self.thread.join(30)
        self.sock.close()

    def connect(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port), timeout=30)
        return s


def read_answer(s: socket.socket, buffered: bytearray | None = None) -> tuple[int, dict[str, str], bytes]:
    """One HTTP answer from `s` (status, headers, body), reading by its content-length."""
    data = buffered if buffered is not None else bytearray()
    while b"\r\n\r\n" not in data:
        chunk = s.recv(65536)
        if not chunk:
            raise ConnectionError(f"closed after {bytes(data)!r}")
        data += chunk
    head, _, rest = bytes(data).partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    headers = dict(line.lower().split(": ", 1) for line in lines[1:])
    length = int(headers.get("content-length", "0"))
    body = bytearray(rest)
    while len(body) < length:
        body += s.recv(65536)
    data[:] = body[length:]
    return int(lines[0].split()[1]), headers, bytes(body[:length])


def closed(s: socket.socket) -> bool:
    """True once the server has closed the connection (reads end), whatever it sent before."""
    s.settimeout(30)
    try:
        while s.recv(65536):
            pass
    except ConnectionResetError:
        pass
    return True


def echo(request: Request) -> Response:
    if request.path == "/boom":
        raise RuntimeError("a handler bug")
    out = {
        "method": request.method,
        "path": request.path,
        "query": request.query.decode(),
        "headers": request.headers,
        "body": None if request.body is None else request.body.decode(),
    }
    return Response(413 if request.body is None else 200, json.dumps(out).encode())


@pytest.fixture()
def server() -> Iterator[Running]:
    r = Running(echo, Limits(max_body_bytes=100, max_header_bytes=2000))
    yield r
    r.stop()


@pytest.fixture()
def service(policies, publish_to, registry, keypair) -> Iterator[DecisionService]:
    publish_to(policies[0])
    s = DecisionService(GatewaySettings(source=str(registry), public_keys=(str(keypair[1]),), refresh_s=0))
    s.start()
    yield s
    s.close()


async def test_the_service_answers_over_the_server_as_it_does_as_an_asgi_app(service) -> None:
    running = Running(service.respond)
    try:
        asgi = httpx.AsyncClient(transport=httpx.ASGITransport(app=service), base_url="http://routeopt")
        async with asgi, httpx.AsyncClient(base_url=f"http://127.0.0.1:{running.port}") as real:
            for prompt, suite in PROMPTS:
                body = {"prompt": prompt, "suite": suite, "request_id": f"r-{suite}"}
                a = await asgi.post("/v1/route?explain=1", json=body)
                b = await real.post("/v1/route?explain=1", json=body)
                assert b.status_code == a.status_code == 200
                assert b.json() == a.json()
                names = [k for k in a.headers if k.startswith("x-routeopt")]
                assert names and all(b.headers[k] == a.headers[k] for k in names)
            for path in ("/healthz", "/readyz", "/metrics", "/nope"):
                assert (await real.get(path)).status_code == (await asgi.get(path)).status_code
            head = await real.head("/healthz")
            assert head.status_code == 200 and head.content == b""
            assert head.headers["content-length"] == str(len((await real.get("/healthz")).content))
            bad = await real.post("/v1/route", content=b"{not json")
            assert bad.status_code == 400 and "not JSON" in bad.json()["error"]
    finally:
        running.stop()
    assert running.stopped.is_set()


def test_keep_alive_pipelining_and_absolute_targets(server) -> None:
    with server.connect() as s:
        buffered = bytearray()
        for i in range(3):  # one connection, one request after another
            s.sendall(b"POST /a?i=%d HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\nhi" % i)
            status, headers, body = read_answer(s, buffered)
            assert status == 200 and json.loads(body)["query"] == f"i={i}"
            assert "connection" not in headers
        s.sendall(  # three at once, one of them chunked: answered in order
            b"GET /one HTTP/1.1\r\nHost: x\r\n\r\n"
            b"POST /two HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"
            b"GET http://elsewhere:81/three?q=1 HTTP/1.1\r\nHost: x\r\nX-A: 1\r\nX-A: 2\r\n\r\n"
        )
        answers = [json.loads(read_answer(s, buffered)[2]) for _ in range(3)]
        assert [a["path"] for a in answers] == ["/one", "/two", "/three"]
        assert answers[1]["body"] == "abcde" and answers[2]["query"] == "q=1"
        assert answers[2]["headers"]["x-a"] == "1, 2"
        s.sendall(b"GET /declared HTTP/1.1\r\nHost: x\r\nContent-Length: 4\r\n\r\n")  # auth_request's
        assert json.loads(read_answer(s, buffered)[2])["body"] == ""  # answered without the body...
        s.sendall(b"bodyGET /next HTTP/1.1\r\nHost: x\r\n\r\n")  # ...which, if it comes, is dropped
        assert json.loads(read_answer(s, buffered)[2])["path"] == "/next"
        s.sendall(b"GET /last HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        status, headers, _ = read_answer(s, buffered)
        assert status == 200 and headers["connection"] == "close" and closed(s)
    with server.connect() as s:  # HTTP/1.0 closes unless asked otherwise
        s.sendall(b"GET /old HTTP/1.0\r\n\r\n")
        assert read_answer(s)[0] == 200 and closed(s)


@pytest.mark.parametrize(
    "attack, status",
    [
        (b"GARBAGE\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab", 400),
        (b"GET / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\nContent-Length: 3\r\n\r\n", 400),
        (b"GET / HTTP/1.1\r\n" + b"X-Flood: " + b"a" * 3000 + b"\r\n\r\n", 431),
        (b"GET /" + b"a" * 3000 + b" HTTP/1.1\r\n\r\n", 431),
        (b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 101\r\n\r\n", 413),
        (
            b"POST / HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n65\r\n"
            + b"a" * 101
            + b"\r\n0\r\n\r\n",
            413,
        ),
        (b"GET / HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: upgrade\r\n\r\n", 200),
    ],
    ids=[
        "garbage",
        "two-lengths",
        "smuggling",
        "header-flood",
        "long-url",
        "declared-body",
        "chunked-body",
        "upgrade",
    ],
)
def test_attacks_are_answered_and_closed_and_the_server_goes_on(server, attack, status) -> None:
    with server.connect() as s:
        s.sendall(attack)
        got = read_answer(s)
        assert got[0] == status, got
        assert got[1].get("connection") == "close" and closed(s)
    with server.connect() as s:  # and the next client is served
        s.sendall(b"GET /after HTTP/1.1\r\nHost: x\r\n\r\n")
        assert read_answer(s)[0] == 200


def test_expect_continue_and_a_handler_that_fails(server) -> None:
    with server.connect() as s:
        s.sendall(b"POST /c HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\nExpect: 100-continue\r\n\r\n")
        data = bytearray()
        while b"\r\n\r\n" not in data:
            data += s.recv(100)
        assert bytes(data).startswith(b"HTTP/1.1 100 Continue\r\n\r\n")
        del data[: len(b"HTTP/1.1 100 Continue\r\n\r\n")]
        s.sendall(b"hello")
        assert json.loads(read_answer(s, data)[2])["body"] == "hello"
        s.sendall(b"GET /boom HTTP/1.1\r\nHost: x\r\n\r\n")
        status, _, body = read_answer(s, data)
        assert status == 500 and "failed to answer" in json.loads(body)["error"]
        s.sendall(b"GET /fine HTTP/1.1\r\nHost: x\r\n\r\n")  # the connection survives it
        assert read_answer(s, data)[0] == 200


def test_a_client_that_does_not_read_stops_being_read_until_it_does() -> None:
    """Thousands of pipelined requests, their answers unread: the server stops reading rather
    than buffer without end, and answers every one, in order, once the client reads."""
    server = Running(echo, Limits(keep_alive_s=3600, request_timeout_s=3600))  # no timeout closes it
    try:
        n = 40_000  # ~10 MB of answers: more than the kernel's socket buffers hold
        payload = b"".join(b"GET /p?i=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(n))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(60)
            s.connect(("127.0.0.1", server.port))
            threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
            deadline = time.monotonic() + 60
            connections = server.serving.server.connections
            while not any(not c.closing and not c.transport.is_reading() for c in list(connections)):
                assert time.monotonic() < deadline, "the server kept reading with its answers unread"
                time.sleep(0.05)
            buffered = bytearray()
            queries = [json.loads(read_answer(s, buffered)[2])["query"] for _ in range(n)]
            assert queries == [f"i={i}" for i in range(n)]
            assert all(c.transport.is_reading() for c in list(connections))
    finally:
        server.stop()


def test_a_client_that_never_reads_is_dropped_after_the_timeouts() -> None:
    """Its unread answers are not kept: closing would wait for them for ever."""
    server = Running(echo, Limits(keep_alive_s=0.2, request_timeout_s=0.2))
    try:
        payload = b"".join(b"GET /p?i=%d HTTP/1.1\r\nHost: x\r\n\r\n" % i for i in range(40_000))
        with socket.socket() as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            s.settimeout(60)
            s.connect(("127.0.0.1", server.port))
            threading.Thread(target=s.sendall, args=(payload,), daemon=True).start()
            connections = server.serving.server.connections
            deadline = time.monotonic() + 60
            while not connections:  # opened
                assert time.monotonic() < deadline
                time.sleep(0.01)
            while connections:  # and gone, though the client has read nothing
                assert time.monotonic() < deadline, "a connection with unread answers was kept"
                time.sleep(0.05)
    finally:
        server.stop()


def test_slow_and_idle_clients_are_closed() -> None:
    running = Running(echo, Limits(request_timeout_s=0.2, keep_alive_s=0.2))
    try:
        with running.connect() as slow:
            slow.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")  # and never the end of its headers
            status, headers, _ = read_answer(slow)
            assert status == 408 and headers["connection"] == "close" and closed(slow)
        with running.connect() as idle:
            idle.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
            assert read_answer(idle)[0] == 200
            assert closed(idle)  # nothing more sent: the server ends the keep-alive connection
    finally:
        running.stop()


def test_a_worker_with_more_connections_leaves_the_next_to_a_sibling() -> None:
    """Two workers' acceptors in one loop over one socket, sharing counts as forked workers do."""
    sock = bind("127.0.0.1", 0)
    counts = memoryview(bytearray(16)).cast("q")
    loop = asyncio.new_event_loop()
    servers = [http_server._Server(echo, Limits(), counts, i) for i in range(2)]
    acceptors = [http_server._Acceptor(loop, sock, s) for s in servers]
    clients = []
    try:
        clients.append(socket.create_connection(sock.getsockname()))
        acceptors[0]._ready()
        assert list(counts) == [1, 0]
        clients.append(socket.create_connection(sock.getsockname()))
        acceptors[0]._ready()  # busier than worker 1: leaves it
        assert list(counts) == [1, 0] and acceptors[0].yielding_since is not None
        acceptors[1]._ready()
        assert list(counts) == [1, 1]
        clients.append(socket.create_connection(sock.getsockname()))
        acceptors[0].yielding_since = time.monotonic() - 1  # its sibling has not taken it for long
        acceptors[0]._ready()
        assert list(counts) == [2, 1]
    finally:
        for c in clients:
            c.close()
        loop.run_until_complete(asyncio.sleep(0))
        for t in asyncio.all_tasks(loop):
            t.cancel()
        loop.close()
        sock.close()


def _samples(text: str) -> dict[str, float]:
    return {
        k: float(v) for k, v in (line.rsplit(" ", 1) for line in text.splitlines() if line and line[0] != "#")
    }


async def test_metrics_count_every_worker_whichever_answers(policies, publish_to, registry, keypair) -> None:
    """Two workers' services on one share: counters and the histogram are the sums, a model only
    the other worker chose appears, gauges stay the answering worker's, and scraping it twice
    never goes backwards (no counter reset for Prometheus)."""
    publish_to(policies[0])
    async with two_workers(registry, keypair[1]) as (workers, clients):
        for prompt, suite in PROMPTS:
            assert (
                await clients[0].post("/v1/route", json={"prompt": prompt, "suite": suite})
            ).status_code == 200
        await clients[1].post("/v1/route", json={"prompt": PROMPTS[0][0], "suite": PROMPTS[0][1]})
        await clients[1].post("/v1/route", content=b"{not json")
        workers[0].metrics.passthrough += 5
        own = [_samples(w.metrics.render(w.gateway.status(), True)) for w in workers]
        for w in workers:
            w._publish_metrics()
        merged = _samples((await clients[1].get("/metrics")).text)
        for key in set(own[0]) | set(own[1]):
            name = key.split("{")[0]
            if name in ("routeopt_ready", "routeopt_policy_version", "routeopt_serving_default_model"):
                assert merged[key] == own[1][key]
            elif not name.startswith("routeopt_route_seconds_sum"):
                assert merged[key] == own[0].get(key, 0) + own[1].get(key, 0), key
        assert merged["routeopt_passthrough_total"] == 5
        assert merged['routeopt_refused_requests_total{reason="bad_request"}'] == 1
        assert merged["routeopt_route_seconds_count"] == len(PROMPTS) + 1
        again = _samples((await clients[0].get("/metrics")).text)
        assert all(
            again[k] >= v for k, v in merged.items() if k.endswith(("_total", "_count")) or "_bucket" in k
        )


def test_metrics_slots_skip_a_write_in_progress_and_texts_merge_by_family() -> None:
    shared = SharedMetrics(3)
    assert shared.others(0) == []  # nobody published yet
    shared.publish(1, '# TYPE a counter\na{x="1"} 2\n# TYPE g gauge\ng 7\n')
    shared.publish(2, '# TYPE a counter\na{x="2"} 3\n# TYPE g gauge\ng 9\n')
    own = '# HELP a A.\n# TYPE a counter\na{x="1"} 1\n# TYPE g gauge\ng 1\n'
    assert merge(own, shared.others(0)).splitlines() == [
        "# HELP a A.",
        "# TYPE a counter",
        'a{x="1"} 3',
        'a{x="2"} 3',
        "# TYPE g gauge",
        "g 1",
    ]
    SharedMetrics._HEAD.pack_into(shared._memory, 2 * shared.SLOT_BYTES, 7, 0)  # worker 2 mid-write
    assert shared.others(0) == ['# TYPE a counter\na{x="1"} 2\n# TYPE g gauge\ng 7\n']


WORKERS = r"""
import json, os, sys
from routeopt.artifacts.serving.http_server import Response, bind, serve_workers
sock = bind("127.0.0.1", 0)
print(sock.getsockname()[1], flush=True)
def start(index):
    if os.environ.get("FAIL_WORKER"):
        try:  # the first worker to get here fails
            os.close(os.open(os.environ["FAIL_WORKER"], os.O_CREAT | os.O_EXCL))
        except FileExistsError:
            pass
        else:
            raise SystemExit(3)
    return (lambda r: Response(200, json.dumps({"pid": os.getpid()}).encode())), (lambda: print("stopped", flush=True))
sys.exit(serve_workers(sock, 2, start))
"""


def _pid(port: int, s: socket.socket | None = None) -> int:
    own = s or socket.create_connection(("127.0.0.1", port), timeout=30)
    own.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    return json.loads(read_answer(own)[2])["pid"]


def test_workers_share_the_port_and_stop_together_on_sigterm(tmp_path: Path) -> None:
    p = subprocess.Popen([sys.executable, "-c", WORKERS], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        deadline, pids = time.monotonic() + 120, set()
        while len(pids) < 2 and time.monotonic() < deadline:  # fresh connections: both workers answer
            pids.add(_pid(port))
        assert len(pids) == 2 and p.pid not in pids
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
        assert p.stdout.read().count("stopped") == 2  # each worker ran its on-stop
        for pid in pids:
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)
    finally:
        p.kill()


def test_a_worker_that_dies_ends_the_service_with_its_status(tmp_path: Path) -> None:
    env = {**os.environ, "FAIL_WORKER": str(tmp_path / "failed")}
    p = subprocess.Popen([sys.executable, "-c", WORKERS], stdout=subprocess.PIPE, text=True, env=env)
    try:
        int(p.stdout.readline())
        assert p.wait(120) == 3
    finally:
        p.kill()


def _serve(args: list[str], port: int) -> subprocess.Popen:
    command = [sys.executable, "-m", "routeopt.artifacts.serving.service_main", "serve", "--port", str(port)]
    return subprocess.Popen([*command, *args], stderr=subprocess.PIPE, text=True)


def test_the_command_with_workers_decides_as_the_embedded_gateway(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    from routeopt.artifacts.serving.gateway import Gateway
    from routeopt.artifacts.serving.loader import load

    publish_to(policies[0])
    embedded = Gateway(load(registry, keypair[1], state_dir=False))
    port = bind("127.0.0.1", 0).getsockname()[1]
    p = _serve(["--policy", str(registry), "--public-key", str(keypair[1]), "--workers", "2"], port)
    try:
        assert "2 workers" in p.stderr.readline()
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/readyz").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and p.poll() is None, "the service did not become ready"
            time.sleep(0.2)
        with httpx.Client(base_url=f"http://127.0.0.1:{port}") as c:
            for prompt, suite in PROMPTS:
                got = c.post("/v1/route", json={"prompt": prompt, "suite": suite}).json()
                assert got["model"] == embedded.route(prompt, suite).model
        p.send_signal(signal.SIGTERM)
        assert p.wait(60) == 0
    finally:
        p.kill()
        embedded.close()
    unreadable = _serve(
        ["--policy", str(registry), "--public-key", str(tmp_path / "nope.pem"), "--workers", "2"], port
    )
    assert unreadable.wait(120) == 2 and "error:" in unreadable.stderr.read()
