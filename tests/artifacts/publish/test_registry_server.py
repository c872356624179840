"""`registry serve`: ETags and 304s for cheap polling, safe keys only, gateways loading over HTTP."""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request

import pytest

from routeopt.artifacts.serving.loader import load
from routeopt.artifacts.publish.registry_server import serve_in_thread


@pytest.fixture()
def server(registry, policies, publish_to):
    publish_to(policies[0])
    srv, url = serve_in_thread(registry)
    yield url
    srv.shutdown()
    srv.server_close()


def _get(url: str, etag: str | None = None) -> tuple[int, bytes, dict]:
    req = urllib.request.Request(url, headers={"If-None-Match": etag} if etag else {})
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, resp.read(), dict(resp.headers)
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read(), dict(exc.headers)


def test_etag_and_not_modified(server, policies, publish_to) -> None:
    status, body, headers = _get(server + "channels/latest.json")
    assert status == 200 and json.loads(body)["payload"]["version"] == 1
    etag = headers["ETag"]
    assert headers["Cache-Control"] == "no-cache"
    status, body, _ = _get(server + "channels/latest.json", etag)
    assert (status, body) == (304, b"")
    publish_to(policies[1])
    status, body, headers = _get(server + "channels/latest.json", etag)
    assert status == 200 and headers["ETag"] != etag and json.loads(body)["payload"]["version"] == 2


def test_version_files_are_immutable_and_listed(server) -> None:
    status, body, _ = _get(server + "_keys.json")
    keys = json.loads(body)
    manifest = next(k for k in keys if k.endswith("manifest.json"))
    assert ".lock" not in keys and "channels/latest.json" in keys
    status, _, headers = _get(server + manifest)
    assert status == 200 and "immutable" in headers["Cache-Control"]


def _raw_status(url: str, path: str) -> int:
    """Send the path exactly as written (urllib would normalise '..')."""
    host, port = url.removeprefix("http://").rstrip("/").split(":")
    with socket.create_connection((host, int(port)), timeout=5) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(4096):
            data += chunk
        return int(data.split()[1])


@pytest.mark.parametrize(
    "path",
    [
        "/../../etc/passwd",
        "/channels/../../secret",
        "/.lock",
        "/%2e%2e/%2e%2e/etc/passwd",
        "/versions//x",
        "/a\\b",
    ],
)
def test_unsafe_paths_are_refused(server, path: str) -> None:
    assert _raw_status(server, path) == 400


def test_missing_key_is_404(server) -> None:
    assert _get(server + "channels/nope.json")[0] == 404


def test_gateway_loads_and_refreshes_over_http(server, registry, policies, publish_to, keypair) -> None:
    router = load(server, keypair[1])
    assert router.version == 1 and router.refresh() is False
    v2 = publish_to(policies[1])
    assert router.refresh() is True and router.version == 2
    pinned = load(server + v2.path + "/", keypair[1])
    assert pinned.version == 2 and pinned.status().channel is None
