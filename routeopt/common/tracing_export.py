"""The export process: spans built, encoded and exported off the gateway's (or the nightly's) core.

A decision span costs about 8 us to build and 10 to 20 us more to encode as OTLP and send. In
the gateway's own process that work takes the GIL and the caches from the decisions, even on a
thread of its own: with it there, tracing added 22 to 44 us to the bare router's p50
(benchmarks/tracing_overhead.py). So when the environment turns tracing on, the gateway's
tracing thread only hands batches of finished decisions (ids, times, attributes: about 150 bytes
each) to a child process over a pipe; the child builds the spans and exports them with the
exporter the same environment names (`ROUTEOPT_TRACING_EXPORT=thread` keeps it all in-process).
The nightly's spans (common/tracing_spans.py's `RecordedSpan`) take the same way, with their
name, kind, events, links and status: the SDK's span cost the runner 345 us of CPU a call span,
215 of it to encode and send.

Frames on both pipes are a 4-byte little-endian length and a `marshal`led tuple. Both ends are
this interpreter, one started by the other, and nothing else reads these bytes: marshal is the
fastest codec for plain values, and it cannot run code.

- to the child (its stdin): `("spans", [item, ...])` or `("flush", token, timeout_ms)`;
- back (a pipe passed by number): `("counts", token, received, ended, exported, failed,
  dropped, last_error, flushed)`, after every frame and once more before it exits.

The child ends when its stdin closes (the gateway shut tracing down or exited, however it
died), after exporting what it holds within `ROUTEOPT_TRACING_EXIT_TIMEOUT_S`; a gateway's exit
does not wait for it longer than its own exit timeout. If it dies, the spans it held
are counted as dropped and the next batch starts a new one, at most one start per 10 s; a
gateway's decisions never wait for any of this.
"""

from __future__ import annotations

import json
import logging
import marshal
import os
import struct
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, Iterator

log = logging.getLogger("routeopt.tracing")
_LENGTH = struct.Struct("<I")
RESTART_S = 10.0
NICE = 10  # the export process's niceness, added to the gateway's


@dataclass(frozen=True)
class RemoteCounts:
    """What the export processes did with the spans they were sent; `dropped` includes the
    spans a process held when it died."""

    ended: int = 0
    exported: int = 0
    failed: int = 0
    dropped: int = 0
    queued: int = 0
    last_error: str | None = None


def _write(stream: BinaryIO, frame: tuple) -> None:
    data = marshal.dumps(frame)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _frames(stream: BinaryIO) -> Iterator[tuple]:
    while True:
        head = stream.read(4)
        if len(head) < 4:
            return
        (n,) = _LENGTH.unpack(head)
        body = stream.read(n)
        if len(body) < n:
            return
        yield marshal.loads(body)


def _plain(value: Any) -> Any:
    """An attribute value as a plain type marshal takes: numpy scalars become Python ones,
    mappings and sequences are taken apart, and any other object becomes its `str`, as the SDK
    itself does with a type it does not know."""
    if hasattr(value, "item") and not isinstance(value, (str, bytes, list, tuple, dict)):
        value = value.item()
    for kind in (bool, int, float, str, bytes):  # bool before int: it is one
        if isinstance(value, kind):
            return kind(value)
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    return None if value is None else str(value)


_PLAIN = frozenset((str, int, float, bool, type(None)))


def _clean(attrs: Any) -> dict:
    """The attributes as a dict of plain values. Checked every time: marshal writes any object
    with a buffer (a numpy scalar) as bytes without complaint."""
    if type(attrs) is dict and all(
        type(v) in _PLAIN or (type(v) is list and all(type(x) in _PLAIN for x in v)) for v in attrs.values()
    ):
        return attrs
    return {str(k): _plain(v) for k, v in dict(attrs).items()}


def _item(item: tuple) -> tuple:
    """A queued span with every attribute map plain: its own, its events' and its links'."""
    if len(item) == 6:  # a decision
        return (*item[:5], _clean(item[5]))
    parent, trace_id, span_id, start, end, attrs, name, kind, events, status, links = item
    return (
        parent,
        trace_id,
        span_id,
        start,
        end,
        _clean(attrs),
        name,
        kind,
        [(n, t, _clean(a)) for n, t, a in events],
        status,
        [(*link[:5], _clean(link[5])) for link in links],
    )


def _encode(batch: list) -> bytes:
    return marshal.dumps(("spans", [_item(item) for item in batch]))


class ExportProcess:
    """The gateway's side: starts the child on the first batch, sends batches, reads back what
    the child did. `send` is called by the tracing thread only; `flush` and `close` by anyone."""

    def __init__(self, counts: Any, *, service: str | None, queue: int) -> None:
        self.local = counts  # this process's counters: a batch that could not be sent is its drop
        self.config = json.dumps({"service": service, "queue": queue})
        self.proc: subprocess.Popen | None = None
        self.lock = threading.Lock()  # frames from the tracing thread and from flush() never interleave
        self.changed = threading.Condition()
        self.sent = 0  # spans written to the running child
        self.reply: tuple = (0, 0, 0, 0, 0, None)  # its received, ended, exported, failed, dropped, error
        self.before = RemoteCounts()  # what earlier children did
        self.acks: dict[int, bool] = {}
        self.token = 0
        self.started = -RESTART_S
        self.closed = False

    # -- the gateway's side ------------------------------------------------------------------

    def send(self, batch: list) -> None:
        try:
            payload = _encode(batch)
        except Exception as exc:  # an attribute no codec takes: that batch is dropped, counted
            self.local.dropped += len(batch)
            self.local.last_error = f"decision spans could not be encoded for the export process: {exc!r}"
            return
        with self.lock:
            proc = self._running()
            if proc is None:
                self.local.dropped += len(batch)
                return
            try:  # blocks while the child is behind: the tracing queue then fills, and drops
                proc.stdin.write(_LENGTH.pack(len(payload)) + payload)  # type: ignore[union-attr]
                proc.stdin.flush()  # type: ignore[union-attr]
                self.sent += len(batch)
            except (OSError, ValueError) as exc:  # it died: the reply thread counts what it held
                self.local.dropped += len(batch)
                self.local.last_error = f"the tracing export process stopped taking spans ({exc})"

    def flush(self, timeout_s: float) -> bool:
        """True once the child has exported everything sent before this call."""
        deadline = time.monotonic() + timeout_s
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            return False
        try:
            proc = self.proc
            if proc is None:
                return True  # nothing outstanding: whatever was sent was exported or counted
            self.token += 1
            token = self.token
            try:
                _write(proc.stdin, ("flush", token, int(max(0.0, deadline - time.monotonic()) * 1000)))  # type: ignore[arg-type]
            except (OSError, ValueError):
                return False
        finally:
            self.lock.release()
        with self.changed:
            self.changed.wait_for(
                lambda: token in self.acks or self.proc is not proc, max(0.0, deadline - time.monotonic())
            )
            return self.acks.pop(token, False)

    def close(self, timeout_s: float) -> None:
        """Close the child's input and wait up to `timeout_s` for it to end. It is never killed:
        with its input closed it builds and exports what it holds, gives its exporter
        `ROUTEOPT_TRACING_EXIT_TIMEOUT_S`, and ends by itself, after this process if need be."""
        self.closed = True
        if not self.lock.acquire(timeout=max(0.0, timeout_s)):
            return
        try:
            proc = self.proc
            if proc is None:
                return
            try:
                proc.stdin.close()  # type: ignore[union-attr]
            except OSError:
                pass
        finally:
            self.lock.release()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            return
        with self.changed:
            self.changed.wait_for(lambda: self.proc is not proc, 1.0)

    def counts(self) -> RemoteCounts:
        with self.changed:
            received, ended, exported, failed, dropped, error = self.reply
            b = self.before
            queued = (self.sent - received) + max(0, ended - exported - failed) if self.proc else 0
            return RemoteCounts(
                b.ended + ended,
                b.exported + exported,
                b.failed + failed,
                b.dropped + dropped,
                queued,
                error or b.last_error,
            )

    def _running(self) -> subprocess.Popen | None:
        if self.proc is not None or self.closed or time.monotonic() - self.started < RESTART_S:
            return self.proc
        self.started = time.monotonic()
        try:
            self.proc = self._start()
        except OSError as exc:
            self.local.last_error = f"the tracing export process did not start: {exc}"
            log.warning(self.local.last_error)
        return self.proc

    def _start(self) -> subprocess.Popen:
        read, write = os.pipe()
        try:
            root = str(Path(__file__).resolve().parents[2])  # the folder that holds routeopt/
            env = {
                **os.environ,
                "ROUTEOPT_TRACING_EXPORT": "thread",
                "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p),
            }
            proc = subprocess.Popen(
                [
                    sys.executable,
                    "-c",
                    "import sys; from routeopt.common.tracing_child import serve; "
                    "serve(int(sys.argv[1]), sys.argv[2])",
                    str(write),
                    self.config,
                ],
                stdin=subprocess.PIPE,
                pass_fds=(write,),
                env=env,
            )
        except BaseException:
            os.close(read)
            raise
        finally:
            os.close(write)
        try:  # room for a second of decisions while the child starts
            import fcntl

            fcntl.fcntl(proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, 1 << 20)  # type: ignore[union-attr, attr-defined]
        except (ImportError, AttributeError, OSError):
            pass
        self.sent, self.reply = 0, (0, 0, 0, 0, 0, None)
        threading.Thread(
            target=self._replies,
            args=(proc, os.fdopen(read, "rb")),
            name="routeopt-tracing-replies",
            daemon=True,
        ).start()
        return proc

    def _replies(self, proc: subprocess.Popen, stream: BinaryIO) -> None:
        with stream:
            for frame in _frames(stream):
                _, token, *counts, flushed = frame
                with self.changed:
                    self.reply = tuple(counts)
                    if token:
                        self.acks[token] = bool(flushed)
                    self.changed.notify_all()
        code = proc.wait()
        with self.changed:  # what the child held and did not export is lost: count it dropped
            received, ended, exported, failed, dropped, error = self.reply
            lost = (self.sent - received) + max(0, ended - exported - failed)
            if code != 0 and not self.closed:
                error = f"the tracing export process exited with code {code}; {lost} spans lost"
                log.warning(error)
            b = self.before
            self.before = RemoteCounts(
                b.ended + exported + failed,
                b.exported + exported,
                b.failed + failed,
                b.dropped + dropped + lost,
                0,
                error or b.last_error,
            )
            self.proc, self.sent, self.reply = None, 0, (0, 0, 0, 0, 0, None)
            self.changed.notify_all()
