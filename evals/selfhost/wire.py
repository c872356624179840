"""A lean streaming client for load generation: HTTP/1.1 keep-alive on asyncio streams.

The replay must not be its own bottleneck: at hundreds of requests a second on two cores, the
vendor SDKs' per-request cost would be measured instead of the server (vLLM's benchmark sends
with a bare HTTP client for the same reason). This speaks just enough: a POST with a JSON body,
a response framed by Content-Length or chunked encoding, read line by line (server-sent events),
over plain TCP or TLS. Timing marks are taken here: `sent` when the request bytes are handed to
the socket, then each content chunk.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.parse
from collections import deque
from typing import Any, AsyncIterator

from routeopt.evals.providers.base import ProviderError


class _Conn:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer


class Endpoint:
    """One base URL: a pool of idle keep-alive connections (opened as needed, never capped:
    an open-loop replay must not queue behind its own connection limit)."""

    def __init__(self, base_url: str, headers: dict[str, str]) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"{base_url!r} is not an http(s) URL")
        self.base_url = base_url
        self.host, self.tls = url.hostname, url.scheme == "https"
        self.port = url.port or (443 if self.tls else 80)
        self.prefix = url.path.rstrip("/")
        host = self.host if url.port is None else f"{self.host}:{url.port}"
        self.head = "".join(f"{k}: {v}\r\n" for k, v in {"Host": host, **headers}.items())
        self._idle: deque[_Conn] = deque()
        self._ssl = ssl.create_default_context() if self.tls else None

    async def _conn(self) -> _Conn:
        while self._idle:
            conn = self._idle.pop()
            if not conn.reader.at_eof() and not conn.writer.is_closing():
                return conn
            conn.writer.close()
        try:
            reader, writer = await asyncio.open_connection(self.host, self.port, ssl=self._ssl, limit=1 << 20)
        except OSError as exc:
            raise ProviderError("connection", f"{self.base_url}: {exc}") from None
        return _Conn(reader, writer)

    def _request(self, path: str, payload: dict[str, Any]) -> bytes:
        body = json.dumps(payload, separators=(",", ":")).encode()
        return (
            f"POST {self.prefix}{path} HTTP/1.1\r\n{self.head}Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode() + body

    def send_now(self, path: str, payload: dict[str, Any], marks: dict[str, float]) -> _Conn | None:
        """Write the request at once on an idle keep-alive connection (no trip through the event
        loop between the moment it is due and the send); None when none is idle."""
        while self._idle:
            conn = self._idle.pop()
            if conn.reader.at_eof() or conn.writer.is_closing():
                conn.writer.close()
                continue
            request = self._request(path, payload)
            marks["sent"] = time.perf_counter()
            conn.writer.write(request)
            return conn
        return None

    async def stream(
        self, path: str, payload: dict[str, Any], marks: dict[str, float], written: _Conn | None = None
    ) -> AsyncIterator[bytes]:
        """POST `payload` (already written on `written`, by `send_now`) and yield the body's
        lines; `marks['sent']` is set when it goes out. A non-200 status raises ProviderError
        of the kind the runner would record."""
        conn = written or await self._conn()
        ok = False
        try:
            if written is None:
                request = self._request(path, payload)
                marks["sent"] = time.perf_counter()
                conn.writer.write(request)
            status, headers = await _head(conn.reader)
            lines = _lines(conn.reader, headers)
            if status != 200:
                text = b"".join([line async for line in lines]).decode("utf-8", "replace")
                raise _status(status, text[:300], headers)
            async for line in lines:
                yield line
            ok = headers.get("connection", "").lower() != "close"
        except (ConnectionError, asyncio.IncompleteReadError) as exc:
            raise ProviderError("connection", f"{self.base_url}: {type(exc).__name__}: {exc}") from None
        finally:
            if ok:
                self._idle.append(conn)
            else:
                conn.writer.close()

    def close(self) -> None:
        while self._idle:
            self._idle.pop().writer.close()


async def _head(reader: asyncio.StreamReader) -> tuple[int, dict[str, str]]:
    raw = await reader.readuntil(b"\r\n\r\n")
    first, *rest = raw.decode("latin-1").split("\r\n")
    parts = first.split(" ", 2)
    if len(parts) < 2 or not parts[1].isdigit():
        raise ProviderError("bad_response", f"not an HTTP response: {first[:80]!r}")
    headers = {}
    for line in rest:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _lines(reader: asyncio.StreamReader, headers: dict[str, str]) -> AsyncIterator[bytes]:
    """The body's non-empty lines, whatever its framing."""
    if headers.get("transfer-encoding", "").lower() == "chunked":
        buffer = b""
        while True:
            size = int((await reader.readuntil(b"\r\n")).split(b";")[0].strip() or b"0", 16)
            if size == 0:
                await reader.readuntil(b"\r\n")
                break
            buffer += (await reader.readexactly(size + 2))[:-2]
            *complete, buffer = buffer.split(b"\n")
            for line in complete:
                if line.strip():
                    yield line.rstrip(b"\r")
        if buffer.strip():
            yield buffer
        return
    length = headers.get("content-length")
    data = await (reader.readexactly(int(length)) if length is not None else reader.read())
    for line in data.split(b"\n"):
        if line.strip():
            yield line.rstrip(b"\r")


def _status(status: int, text: str, headers: dict[str, str]) -> ProviderError:
    from routeopt.evals.providers.sdk import retry_after

    message = f"HTTP {status}: {text}"
    if status == 429:
        return ProviderError("rate_limited", message, retry_after(headers))
    if status in (401, 403):
        return ProviderError("auth", message)
    if status == 404:
        return ProviderError("config", message)
    if status >= 500:
        return ProviderError("server_error", message)
    return ProviderError("client_error", message)
