"""A real trace backend for tests: Arize Phoenix (`phoenix serve`), from a virtualenv of its own.

Phoenix pins many packages (SQLAlchemy, grpcio, pandas, starlette...) at versions that need not be
the project's, so, like the LiteLLM proxy (`tests/litellm_proxy.py`), it lives in a virtualenv
built on first use under `$ROUTEOPT_TEST_CACHE` (default `~/.cache/routeopt`) and reused after;
where that cannot be built the tests that need it skip and say why. It takes OTLP over HTTP
(`/v1/traces` on its web port) and gRPC, keeps spans in SQLite in a temporary folder, and
answers REST queries (`/v1/projects/default/spans?trace_id=...`) and its web UI on one port.

    with Phoenix() as phoenix:
        os.environ["OTEL_EXPORTER_OTLP_ENDPOINT"] = phoenix.url     # or phoenix.grpc_url
        ...
        phoenix.spans(trace_id)
"""

from __future__ import annotations

import fcntl
import json
import os
import subprocess
import tempfile
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.installer import install, make_venv
from tests.litellm_proxy import cache_dir, free_port

PHOENIX_VERSION = "20.26.1"
STARTUP_TIMEOUT_S = 240.0


def phoenix_venv() -> Path:
    """The virtualenv with `arize-phoenix==PHOENIX_VERSION`, built once under a file lock."""
    venv = cache_dir() / f"phoenix-{PHOENIX_VERSION}"
    ready = venv / ".ready"
    if ready.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".phoenix-{PHOENIX_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return venv
        if not (venv / "bin" / "phoenix").exists():
            make_venv(venv)
            done = install(venv, f"arize-phoenix=={PHOENIX_VERSION}", timeout=1500)
            if done.returncode != 0:
                pytest.skip(
                    f"cannot build Phoenix's virtualenv: {(done.stderr or done.stdout).strip()[-400:]}"
                )
        ready.write_text(PHOENIX_VERSION)
    return venv


class Phoenix:
    """`phoenix serve` on free loopback ports, its data in a temporary folder, stopped on exit."""

    def __init__(self) -> None:
        self.port, self.grpc_port = free_port(), free_port()
        self._dir = tempfile.TemporaryDirectory(prefix="phoenix-")
        self.log_path = Path(self._dir.name) / "phoenix.log"
        self.proc: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def grpc_url(self) -> str:
        return f"http://127.0.0.1:{self.grpc_port}"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "Phoenix":
        venv = phoenix_venv()
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "OTEL_"))}
        env.update(
            {
                "PHOENIX_PORT": str(self.port),
                "PHOENIX_GRPC_PORT": str(self.grpc_port),
                "PHOENIX_HOST": "127.0.0.1",
                "PHOENIX_WORKING_DIR": self._dir.name,
                "PHOENIX_TELEMETRY_ENABLED": "false",
                "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}",
            }
        )
        log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            [str(venv / "bin" / "phoenix"), "serve"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self._dir.name,
        )
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Phoenix exited with {self.proc.returncode}:\n{self.log()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{self.url}/healthz", timeout=2) as resp:
                    if resp.status == 200:
                        return self
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.5)
        self.__exit__()
        raise RuntimeError(f"Phoenix did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{self.log()[-3000:]}")

    def get(self, path: str, **query: Any) -> Any:
        qs = urllib.parse.urlencode(query, doseq=True)
        with urllib.request.urlopen(f"{self.url}{path}{'?' + qs if qs else ''}", timeout=30) as resp:
            return json.load(resp)

    def spans(self, trace_id: str, project: str = "default") -> list[dict]:
        """Every span of a trace, as Phoenix's REST API gives it."""
        out, cursor = [], None
        while True:
            query: dict[str, Any] = {"trace_id": trace_id, "limit": 1000}
            if cursor:
                query["cursor"] = cursor
            page = self.get(f"/v1/projects/{project}/spans", **query)
            out += page["data"]
            cursor = page.get("next_cursor")
            if not cursor:
                return out

    def wait_for(self, trace_id: str, n: int, timeout_s: float = 60.0) -> list[dict]:
        """The trace's spans once at least `n` arrived (Phoenix inserts them in batches)."""
        deadline = time.monotonic() + timeout_s
        while True:
            spans = self.spans(trace_id)
            if len(spans) >= n or time.monotonic() > deadline:
                return spans
            time.sleep(0.5)

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()
