"""The decision service's HTTP/1.1 server: llhttp's parser (httptools) on an asyncio loop (uvloop
where installed), one synchronous handler call per request, and worker processes that share one
listening socket.

A decision is tens of microseconds of Python; a general ASGI server spends more than that again on
each request (a task, scope and message dicts, awaits), so the service answered half as many
requests per core under uvicorn. Here a request is parsed by llhttp's callbacks, handed to
`handler(Request) -> Response` as soon as it is complete and answered in the same loop turn;
pipelined requests are answered in order. Parsing, the part an attacker aims at, is llhttp's.

What a server owes its clients and hosts, with limits that name their option when hit:
- bodies over `max_body_bytes` get the handler's answer with `body=None` (413) and the connection
  closes, without reading the rest; `Expect: 100-continue` is answered before the body is sent;
- a request line and headers over `max_header_bytes` get 431, a malformed request 400, both closing;
- a request not complete within `request_timeout_s` of its first byte gets 408 (slow clients hold
  no connection open), an idle keep-alive connection closes after `keep_alive_s`;
- a client that does not read its answers stops being read (flow control);
- SIGTERM or SIGINT: stop accepting, close the connections, run `on_stop` (the decision log's
  last lines), exit 0.

With `workers > 1` the parent binds, forks the workers (each builds its own handler, so each has
its own policy, metrics and decision log file) and waits; a worker that dies ends the service with
its exit status, for the orchestrator to restart. The workers share how many connections each
holds, and one with more than another leaves a new connection to it: with as few connections as
CPUs, each connection gets its own core instead of two landing on one by chance.
"""

from __future__ import annotations

import asyncio
import logging
import mmap
import os
import signal
import socket
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, NamedTuple, cast

import httptools

log = logging.getLogger("routeopt.service")

JSON = b"application/json"
_REASONS = {
    100: "Continue",
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    413: "Content Too Large",
    414: "URI Too Long",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
}
_YIELD_S = 0.002  # how long a worker with more connections leaves the next accept to the others
_YIELD_AT_MOST_S = 0.05  # after which it accepts anyway (a stuck sibling must not starve clients)


class Request(NamedTuple):
    """One request. `headers` are lower-cased names (repeated ones joined by ", "); `body` is
    None when it was over `Limits.max_body_bytes` and was not read.

    Only a POST's body is read: any other method is answered as soon as its headers are complete,
    with an empty body (nginx's `auth_request` sends a GET that declares the original request's
    body and never sends it; a body that does follow is parsed and dropped)."""

    method: str
    path: str
    query: bytes
    headers: dict[str, str]
    body: bytes | None


class Response(NamedTuple):
    """An answer. `headers` are written as given; content-length is added unless among them."""

    status: int
    body: bytes = b""
    content_type: bytes = JSON
    headers: tuple[tuple[bytes, bytes], ...] | list[tuple[bytes, bytes]] = ()


Handler = Callable[[Request], Response]


@dataclass(frozen=True)
class Limits:
    max_body_bytes: int = 16 << 20
    max_header_bytes: int = 64 << 10
    request_timeout_s: float = 30.0
    keep_alive_s: float = 30.0


def _error(status: int, message: str) -> Response:
    return Response(status, b'{"error":"' + message.encode("ascii") + b'"}')


def _encode(response: Response, keep_alive: bool) -> bytes:
    status = response.status
    parts = [
        b"HTTP/1.1 %d %s\r\ncontent-type: " % (status, _REASONS.get(status, "").encode("ascii")),
        response.content_type,
        b"\r\n",
    ]
    has_length = False
    for name, value in response.headers:
        parts += (name, b": ", value, b"\r\n")
        has_length = has_length or name == b"content-length"
    if not has_length:
        parts.append(b"content-length: %d\r\n" % len(response.body))
    if not keep_alive:
        parts.append(b"connection: close\r\n")
    parts += (b"\r\n", response.body)
    return b"".join(parts)


class _Connection(asyncio.Protocol):
    """One client connection: llhttp calls the `on_*` methods as it parses what arrives."""

    transport: asyncio.Transport  # set by connection_made, before any data arrives

    def __init__(self, server: "_Server") -> None:
        self.server = server
        self.parser = httptools.HttpRequestParser(self)
        self.closing = False
        self.in_request = False
        self.started = self.last = time.monotonic()
        self._reset()

    def _reset(self) -> None:
        self.answered = False
        self.url = b""
        self.headers: dict[str, str] = {}
        self.header_bytes = 0
        self.body: list[bytes] = []
        self.body_bytes = 0

    # -- asyncio ---------------------------------------------------------------------------
    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is one without the subclass
        self.server.opened(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closing = True
        self.server.closed(self)

    def data_received(self, data: bytes) -> None:
        if self.closing:
            return
        self.last = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:  # after its request was answered, if it was complete
            if self.in_request:
                self.fail(400, "protocol upgrades are not served here")
            else:
                self._close()
        except httptools.HttpParserError:
            if not self.closing:  # a limit already answered and stopped the parser's callbacks
                self.fail(400, "malformed HTTP request")

    def pause_writing(self) -> None:
        self.transport.pause_reading()

    def resume_writing(self) -> None:
        if not self.closing:
            self.transport.resume_reading()

    # -- llhttp's callbacks ------------------------------------------------------------------
    def on_message_begin(self) -> None:
        self._reset()
        self.in_request, self.started = True, time.monotonic()

    def on_url(self, url: bytes) -> None:
        self.url += url
        self._count(len(url))

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._count(len(name) + len(value)):
            return
        key = name.decode("latin-1").lower()
        text = value.decode("latin-1")
        self.headers[key] = f"{self.headers[key]}, {text}" if key in self.headers else text

    def on_headers_complete(self) -> None:
        if self.closing:
            return
        if self.parser.get_method() != b"POST":  # only a POST's body is read (see Request)
            self._answer(b"")
            self.answered = True
            return
        declared = self.headers.get("content-length", "")
        if declared.isdigit() and int(declared) > self.server.limits.max_body_bytes:
            return self._answer(None)
        if self.headers.get("expect", "").lower() == "100-continue":
            self.transport.write(b"HTTP/1.1 100 Continue\r\n\r\n")

    def on_body(self, chunk: bytes) -> None:
        if self.closing or self.answered:
            return
        self.body_bytes += len(chunk)
        if self.body_bytes > self.server.limits.max_body_bytes:
            return self._answer(None)
        self.body.append(chunk)

    def on_message_complete(self) -> None:
        if not self.closing and not self.answered:
            self._answer(b"".join(self.body))

    # -- answering ---------------------------------------------------------------------------
    def _count(self, n: int) -> bool:
        """Adds n bytes of request line and headers; True once over the limit (answered 431)."""
        self.header_bytes += n
        if self.header_bytes <= self.server.limits.max_header_bytes or self.closing:
            return self.closing
        self.fail(431, "the request line and headers are over the limit")
        return True

    def _answer(self, body: bytes | None) -> None:
        target = self.url
        if not target.startswith(b"/") and target != b"*":  # absolute-form, as proxies send
            try:
                url = httptools.parse_url(target)
            except httptools.HttpParserInvalidURLError:
                return self.fail(400, "the request target is not a URL")
            target = (url.path or b"/") + (b"?" + url.query if url.query else b"")
        path, _, query = target.partition(b"?")
        method = self.parser.get_method().decode("ascii")
        request = Request(method, path.decode("latin-1"), query, self.headers, body)
        try:
            response = self.server.handler(request)
        except Exception:  # one request's failure is its own 500, never the connection's or the process's
            log.exception("the service failed to answer %s %s", method, request.path)
            response = _error(500, "the service failed to answer; see its log")
        keep_alive = (
            body is not None
            and self.parser.should_keep_alive()
            and not self.parser.should_upgrade()  # served as plain HTTP; what follows would not be
            and not self.server.stopping
        )
        self.in_request = False
        self.transport.write(_encode(response, keep_alive))
        if not keep_alive:
            self._close()

    def fail(self, status: int, message: str) -> None:
        """Answer an error the server itself found and close."""
        if self.closing:
            return
        self.transport.write(_encode(_error(status, message), keep_alive=False))
        self._close()

    def _close(self, abort: bool = False) -> None:
        self.closing = True
        if abort:
            self.transport.abort()
        else:
            self.transport.close()


@dataclass
class _Server:
    handler: Handler
    limits: Limits
    counts: memoryview | None = None  # connections per worker, shared between workers
    index: int = 0
    stopping: bool = False
    connections: set[_Connection] = field(default_factory=set)

    def count(self, change: int) -> None:
        """Connections this worker holds, counted from accept (before the transport exists, so
        a second connection arriving at once already sees the first) to close."""
        if self.counts is not None:
            self.counts[self.index] += change

    def opened(self, connection: _Connection) -> None:
        self.connections.add(connection)

    def closed(self, connection: _Connection) -> None:
        if connection in self.connections:
            self.connections.discard(connection)
            self.count(-1)

    def busier_than_a_sibling(self) -> bool:
        counts = self.counts
        if counts is None:
            return False
        mine = counts[self.index]
        return any(c < mine for i, c in enumerate(counts) if i != self.index)

    def sweep(self) -> None:
        """Close connections that were idle too long or sent a request too slowly; one whose
        answers went unread that long is dropped with them (a close would wait for them)."""
        now = time.monotonic()
        for c in list(self.connections):
            if c.closing:
                continue
            slow = c.in_request and now - c.started > self.limits.request_timeout_s
            if not slow and (c.in_request or now - c.last <= self.limits.keep_alive_s):
                continue
            if c.transport.get_write_buffer_size() > 0:
                c._close(abort=True)
            elif slow:
                c.fail(408, "the request was not complete in time")
            else:
                c._close()


class _Acceptor:
    """Accepts on the shared listening socket; see the module's note on sharing connections."""

    def __init__(self, loop: asyncio.AbstractEventLoop, sock: socket.socket, server: _Server) -> None:
        self.loop, self.sock, self.server = loop, sock, server
        self.yielding_since: float | None = None
        self.listening = False

    def listen(self) -> None:
        if not self.listening and not self.server.stopping:
            self.loop.add_reader(self.sock.fileno(), self._ready)
            self.listening = True

    def stop(self) -> None:
        if self.listening:
            self.loop.remove_reader(self.sock.fileno())
            self.listening = False

    def _ready(self) -> None:
        for _ in range(64):
            if self._yield():
                return
            try:
                conn, _ = self.sock.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # out of file descriptors: the next readiness tries again
                log.warning("cannot accept a connection: %s", exc)
                return
            self.yielding_since = None
            self.server.count(+1)
            self.loop.create_task(self._connect(conn))

    async def _connect(self, conn: socket.socket) -> None:
        try:
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            await self.loop.connect_accepted_socket(lambda: _Connection(self.server), conn)
        except OSError as exc:  # the client left before its transport was made
            self.server.count(-1)
            conn.close()
            log.debug("a connection closed before it opened: %s", exc)

    def _yield(self) -> bool:
        if not self.server.busier_than_a_sibling():
            return False
        now = time.monotonic()
        if self.yielding_since is None:
            self.yielding_since = now
        elif now - self.yielding_since > _YIELD_AT_MOST_S:
            return False
        self.stop()
        self.loop.call_later(_YIELD_S, self.listen)
        return True


def bind(host: str, port: int, backlog: int = 1024) -> socket.socket:
    """The listening socket (IPv4 or IPv6, as `host` resolves)."""
    family, kind, proto, _, address = socket.getaddrinfo(
        host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
    )[0]
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(address)
    sock.listen(backlog)
    sock.setblocking(False)
    return sock


def _new_loop() -> asyncio.AbstractEventLoop:
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


class Serving:
    """One process's server; `run()` blocks, `stop_soon()` may be called from any thread."""

    def __init__(
        self,
        sock: socket.socket,
        handler: Handler,
        limits: Limits = Limits(),
        *,
        counts: memoryview | None = None,
        index: int = 0,
    ) -> None:
        self.sock = sock
        self.server = _Server(handler, limits, counts, index)
        self.loop = _new_loop()

    def stop_soon(self) -> None:
        self.loop.call_soon_threadsafe(self._stop)

    def _stop(self) -> None:
        self.server.stopping = True
        self.loop.stop()

    def _sweep(self) -> None:
        self.server.sweep()
        self.loop.call_later(1.0, self._sweep)

    def run(self, on_stop: Callable[[], None] | None = None, signals: bool = True) -> None:
        loop, acceptor = self.loop, _Acceptor(self.loop, self.sock, self.server)
        asyncio.set_event_loop(loop)
        if signals and hasattr(signal, "SIGTERM"):
            for sig in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(sig, self._stop)
        try:
            acceptor.listen()
            loop.call_later(1.0, self._sweep)
            loop.run_forever()
        finally:
            acceptor.stop()
            for c in list(self.server.connections):
                if not c.closing:
                    c._close()
            loop.run_until_complete(asyncio.sleep(0))  # let the transports close
            for task in asyncio.all_tasks(loop):
                task.cancel()
            loop.close()
            asyncio.set_event_loop(None)
            if on_stop is not None:
                on_stop()


def serve_workers(
    sock: socket.socket,
    workers: int,
    start_worker: Callable[[int], tuple[Handler, Callable[[], None]]],
    limits: Limits = Limits(),
) -> int:
    """Fork `workers` processes serving `sock`; each calls `start_worker(index)` for its handler
    and its on-stop. Returns the exit status: 0 after SIGTERM/SIGINT, else the first dead worker's."""
    shared = mmap.mmap(-1, 8 * workers)
    counts = memoryview(shared).cast("q")
    children: dict[int, int] = {}
    for index in range(workers):
        pid = os.fork()
        if pid == 0:  # the worker
            code = 1
            try:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                signal.signal(signal.SIGINT, signal.SIG_DFL)
                handler, on_stop = start_worker(index)
                Serving(sock, handler, limits, counts=counts, index=index).run(on_stop=on_stop)
                code = 0
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:
                log.exception("worker %d failed", index)
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)
        children[pid] = index
    sock.close()
    stopping = False

    def forward(signum: int, frame: object) -> None:
        nonlocal stopping
        stopping = True
        for pid in children:
            try:
                os.kill(pid, signal.SIGTERM)
            except ProcessLookupError:
                pass

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    status = 0
    try:
        while children:
            try:
                pid, raw = os.wait()
            except ChildProcessError:
                break
            children.pop(pid, None)
            code = os.waitstatus_to_exitcode(raw)
            if not stopping:  # a worker died on its own: stop the others, report its status
                status = code if code > 0 else 1
                log.error("a worker exited with status %d; stopping the service", code)
                forward(signal.SIGTERM, None)
    finally:
        for signum, before in previous.items():
            signal.signal(signum, before)
    return status
