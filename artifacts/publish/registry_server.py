"""`routeopt registry serve`: a small read-only HTTP server over a registry folder.

Gateways poll `channels/<name>.json` with If-None-Match, so an unchanged channel costs a 304 and
no body. Version files are immutable (their folder name is their digest) and are served with a
long cache lifetime. Only plain registry keys are served: no dotfiles, no '..', no listing of the
file system beyond the registry's own keys (`_keys.json`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import urllib.parse
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from routeopt.artifacts.serving.backends import LISTING_KEY, LocalBackend, NotFound, RegistryError, etag_of

log = logging.getLogger("routeopt.registry.server")


def _handler(backend: LocalBackend) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        server_version = "routeopt-registry/1"

        def log_message(self, fmt: str, *args: object) -> None:
            log.debug("%s " + fmt, self.address_string(), *args)

        def _body(self, key: str) -> tuple[bytes, str]:
            if key == LISTING_KEY:
                data = json.dumps(backend.list("")).encode()
                return data, etag_of(data)
            return backend.get(key)

        def _respond(self, send_body: bool) -> None:
            key = urllib.parse.unquote(urllib.parse.urlsplit(self.path).path).lstrip("/")
            try:
                data, etag = self._body(key)
            except NotFound:
                return self._error(HTTPStatus.NOT_FOUND, f"{key}: not found")
            except RegistryError as exc:  # unsafe key: traversal, dotfile, odd characters
                return self._error(HTTPStatus.BAD_REQUEST, str(exc))
            immutable = key.startswith("versions/")
            if etag in [t.strip() for t in self.headers.get("If-None-Match", "").split(",")]:
                self.send_response(HTTPStatus.NOT_MODIFIED)
                self.send_header("ETag", etag)
                self.end_headers()
                return None
            self.send_response(HTTPStatus.OK)
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(data)))
            self.send_header(
                "Content-Type", "application/json" if key.endswith(".json") else "application/octet-stream"
            )
            self.send_header(
                "Cache-Control", "public, max-age=31536000, immutable" if immutable else "no-cache"
            )
            self.end_headers()
            if send_body:
                self.wfile.write(data)
            return None

        def _error(self, status: HTTPStatus, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # client went away
                self._respond(True)

        def do_HEAD(self) -> None:  # noqa: N802
            with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                self._respond(False)

    return Handler


def make_server(registry: Path, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    """A bound server (port 0 picks a free port: read it from `server.server_address`)."""
    if not registry.is_dir():
        raise RegistryError(f"{registry}: no such registry folder")
    server = ThreadingHTTPServer((host, port), _handler(LocalBackend(registry)))
    server.daemon_threads = True
    return server


def serve_in_thread(
    registry: Path, host: str = "127.0.0.1", port: int = 0
) -> tuple[ThreadingHTTPServer, str]:
    """Start serving in a daemon thread; returns the server (call `.shutdown()`) and its base URL."""
    server = make_server(registry, host, port)
    threading.Thread(target=server.serve_forever, name="routeopt-registry", daemon=True).start()
    h, p = server.server_address[:2]
    return server, f"http://{h}:{p}/"


def serve_forever(registry: Path, host: str, port: int) -> None:
    server = make_server(registry, host, port)
    h, p = server.server_address[:2]
    print(f"serving {registry} at http://{h}:{p}/ (Ctrl-C to stop)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
