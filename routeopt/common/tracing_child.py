"""The export process's main: it reads the gateway's spans from stdin, builds and exports them.

Started by `routeopt.common.tracing_export.ExportProcess`; imports the SDK, so only that
process loads it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import threading
import time

from routeopt.common import tracing
from routeopt.common.tracing_export import NICE, _frames, _write
from routeopt.common.tracing_spans import SpanBuilder


def serve(reply_fd: int, config_json: str) -> None:
    """The export process: build and export the spans read from stdin until it closes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the gateway's to handle; it closes our stdin
    with contextlib.suppress(
        OSError, AttributeError
    ):  # background work: the gateway's processes go first for a core
        os.nice(NICE)
    config = json.loads(config_json)
    exporter, name, endpoint = tracing._env_exporter()
    state = tracing._build(
        exporter,
        name,
        endpoint,
        batch=True,
        max_queue_size=config["queue"],
        service=config["service"],
        decisions=False,
    )
    build, counts, limit = (
        SpanBuilder(state.provider.resource, tracing.DECISION_SPAN),
        state.counts,
        config["queue"],
    )
    received, out = 0, os.fdopen(reply_fd, "wb")

    def reply(token: int, flushed: bool = False) -> None:
        nonlocal out
        if out is None:
            return
        try:
            _write(
                out,
                (
                    "counts",
                    token,
                    received,
                    counts.ended,
                    counts.exported,
                    counts.failed,
                    counts.dropped,
                    counts.last_error,
                    flushed,
                ),
            )
        except OSError:  # the gateway is gone: export what is held all the same, and tell no one
            with contextlib.suppress(OSError):
                out.close()
            out = None

    for frame in _frames(sys.stdin.buffer):
        if frame[0] == "spans":
            for item in frame[1]:
                received += 1
                while counts.ended - counts.exported - counts.failed >= limit:
                    time.sleep(
                        0.002
                    )  # the exporter is behind: stop reading, so the pipe and then the gateway's queue hold the rest
                try:
                    state.processor.on_end(build(item))
                except Exception as exc:  # one bad span is dropped, not the process
                    counts.dropped, counts.last_error = counts.dropped + 1, repr(exc)
            reply(0)
        elif frame[0] == "flush":
            done: list[bool] = []
            worker = threading.Thread(
                target=lambda: done.append(bool(state.provider.force_flush(frame[2]))),  # noqa: B023 (joined below)
                daemon=True,
            )
            worker.start()
            worker.join(frame[2] / 1000)
            reply(frame[1], bool(done and done[0]))
    tracing._shutdown(state)
    reply(0)
    if out is not None:
        with contextlib.suppress(OSError):
            out.close()
