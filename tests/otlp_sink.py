"""A minimal OTLP/HTTP trace receiver for benchmarks: it takes `POST /v1/traces` (protobuf),
decodes each request and counts its spans, so a benchmark pays the real export path (protobuf
encoding, HTTP) and can check that nothing was lost. `GET /count` answers {"spans", "requests"}.

    python -m tests.otlp_sink          # prints `PORT <n>`, serves until killed
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path


class _Handler(BaseHTTPRequestHandler):
    counts = {"spans": 0, "requests": 0}
    lock = threading.Lock()

    def do_POST(self) -> None:  # noqa: N802 - the http.server API
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        req = ExportTraceServiceRequest.FromString(body)
        n = sum(len(s.spans) for r in req.resource_spans for s in r.scope_spans)
        with self.lock:
            self.counts["spans"] += n
            self.counts["requests"] += 1
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:  # noqa: N802
        with self.lock:
            data = json.dumps(self.counts).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


class OtlpSink:
    """The receiver in its own process (it must not share the measured process's GIL)."""

    def __enter__(self) -> "OtlpSink":
        repo = Path(__file__).resolve().parents[1]
        env = {**os.environ, "PYTHONPATH": str(repo)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.otlp_sink"], stdout=subprocess.PIPE, text=True, cwd=repo, env=env
        )
        line = self.proc.stdout.readline()  # type: ignore[union-attr]
        if not line.startswith("PORT "):
            raise RuntimeError(f"the OTLP sink did not start: {line!r}")
        self.url = f"http://127.0.0.1:{int(line.split()[1])}"
        return self

    def count(self) -> dict:
        import urllib.request

        with urllib.request.urlopen(self.url + "/count", timeout=10) as resp:
            return json.load(resp)

    def __exit__(self, *exc: object) -> None:
        self.proc.terminate()
        self.proc.wait(10)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    print(f"PORT {server.server_address[1]}", flush=True)
    server.serve_forever()
