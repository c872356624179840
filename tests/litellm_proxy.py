"""A real LiteLLM proxy (`litellm --config`) for tests, run from a virtualenv of its own.

LiteLLM's `proxy` extra pins versions of rich, websockets and huggingface_hub that differ from
the ones Prefect and transformers need here, so the proxy never shares the project's
environment: it lives in a virtualenv built on first use under `$ROUTEOPT_TEST_CACHE` (default
`~/.cache/routeopt`) and reused after. Building it fetches from the package index once (about a
minute); where that fails, the tests that need it skip and say why.

    with LiteLLMProxy({"model_list": [...]}) as proxy:
        OpenAI(base_url=proxy.base_url, api_key="sk-anything")...
"""

from __future__ import annotations

import fcntl
import os
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.installer import install, make_venv

LITELLM_VERSION = "1.108.7"  # the newest whose `proxy` extra resolves from PyPI alone (2026-12)
STARTUP_TIMEOUT_S = 240.0  # importing the proxy takes ~15 s on an idle core; CI cores are shared


def cache_dir() -> Path:
    return Path(os.environ.get("ROUTEOPT_TEST_CACHE", Path.home() / ".cache" / "routeopt"))


def proxy_venv() -> Path:
    """The virtualenv with `litellm[proxy]==LITELLM_VERSION`, built once (under a file lock, so
    concurrent test sessions wait for one build). Skips the calling test if it cannot be built."""
    venv = cache_dir() / f"litellm-proxy-{LITELLM_VERSION}"
    ready = venv / ".ready"
    if ready.exists():
        return venv
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".litellm-proxy-{LITELLM_VERSION}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if ready.exists():
            return venv
        make_venv(venv)
        done = install(venv, f"litellm[proxy]=={LITELLM_VERSION}", timeout=900)
        if done.returncode != 0:
            pytest.skip(
                f"cannot build the LiteLLM proxy's virtualenv: {(done.stderr or done.stdout).strip()[-400:]}"
            )
        ready.write_text(LITELLM_VERSION)
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiteLLMProxy:
    """`litellm --config` on a free loopback port, from `proxy_venv()`, stopped on exit.

    `config` is the proxy's YAML as a dict (model_list, litellm_settings, general_settings...).
    The proxy refuses to start without a master key, so one is set unless the config has one:
    clients authenticate with `master_key`. `config` may instead be a file, started as it is
    (its master key then comes from `env`'s LITELLM_MASTER_KEY). `env` adds to the proxy's environment (API keys the
    config reads with `os.environ/NAME`). `python` runs the proxy with another interpreter: one
    of a virtualenv layered on `proxy_venv()` with more packages installed
    (`tests.gateway_venv.build_gateway_venv(..., base=proxy_venv())`).
    """

    def __init__(
        self,
        config: dict[str, Any] | Path,
        *,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
        python: Path | None = None,
    ) -> None:
        self.config_file = config if isinstance(config, Path) else None  # started as it is
        if self.config_file is not None:
            self.config, self.master_key = {}, (env or {}).get("LITELLM_MASTER_KEY", "")
        else:
            general = dict(config.get("general_settings") or {})
            general.setdefault("master_key", "sk-routeopt-test-master")
            self.config = {**config, "general_settings": general}
            self.master_key = general["master_key"]
        self.extra_env, self.cwd, self.python = env or {}, cwd, python
        self.port = free_port()
        self.proc: subprocess.Popen | None = None
        self._dir = tempfile.TemporaryDirectory(prefix="litellm-proxy-")
        self.log_path = Path(self._dir.name) / "proxy.log"

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def base_url(self) -> str:
        """The OpenAI-compatible base URL (what an `openai` candidate's `base_url` is)."""
        return f"{self.url}/v1"

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def __enter__(self) -> "LiteLLMProxy":
        venv = proxy_venv()
        cfg = self.config_file or Path(self._dir.name) / "config.yaml"
        if self.config_file is None:
            cfg.write_text(yaml.safe_dump(self.config, sort_keys=False))
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        env.update(
            {
                "LITELLM_LOCAL_MODEL_COST_MAP": "True",  # no price-map fetch: offline, and ~7 s
                "LITELLM_LOG": "ERROR",
                "DISABLE_ADMIN_UI": "True",
                "LITELLM_TELEMETRY": "False",
                "PATH": f"{venv / 'bin'}:{env.get('PATH', '')}",
                **self.extra_env,
            }
        )
        log = self.log_path.open("wb")
        launcher = [str(self.python)] if self.python else []  # e.g. a virtualenv layered on venv
        self.proc = subprocess.Popen(
            [
                *launcher,
                str(venv / "bin" / "litellm"),
                "--config",
                str(cfg),
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--num_workers",
                "1",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.cwd or self._dir.name,
        )
        self._wait_ready()
        return self

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(
                    f"the LiteLLM proxy exited with {self.proc.returncode}:\n{self.log()[-3000:]}"
                )
            try:
                with urllib.request.urlopen(f"{self.url}/health/liveliness", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.25)
        self.__exit__(None, None, None)
        raise RuntimeError(
            f"the LiteLLM proxy did not answer within {STARTUP_TIMEOUT_S:.0f} s:\n{self.log()[-3000:]}"
        )

    def __exit__(self, *exc: Any) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._dir.cleanup()
