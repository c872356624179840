"""Shared test setup: an isolated Prefect home, and the repo's paths."""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import pytest

# Prefect reads its settings at import: point it at a throwaway home before anything imports it.
_PREFECT_HOME = tempfile.mkdtemp(prefix="routeopt-prefect-")
atexit.register(shutil.rmtree, _PREFECT_HOME, True)  # a test session leaves no home behind
os.environ.setdefault("PREFECT_HOME", _PREFECT_HOME)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Router training's small L-BFGS problems spend 20 s instead of 0.3 s in BLAS threads that spin
# against each other on a busy 2-core machine; one thread each is what these tests need.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def shared_dir() -> Path:
    if not SHARED.exists():
        pytest.skip("../shared is not present beside the repo")
    return SHARED


@pytest.fixture(autouse=True)
def _keys_and_gateway_state(tmp_path_factory, monkeypatch):
    """Gateways remember the newest policy they accepted (routeopt.artifacts.serving.state): each test
    gets its own state folder, never the user's ~/.local/state. No test may create the signing
    key of the repository's own config (publishers create it on first use)."""
    monkeypatch.setenv("ROUTEOPT_STATE_DIR", str(tmp_path_factory.mktemp("gateway-state")))
    monkeypatch.delenv("ROUTEOPT_DEFAULT_MODEL", raising=False)
    repo_key = REPO / ".routeopt" / "keys" / "signing_key.pem"
    existed = repo_key.exists()
    yield
    assert existed or not repo_key.exists(), f"the test created {repo_key}; give it a key in tmp_path"


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole session (it is slow to start)."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=180):
        yield


# The wire-protocol fake LLM server's fixtures, for every test module.
from tests.fake_llm import fake_candidate, fake_llm, fake_llm_process  # noqa: E402,F401


@pytest.fixture
def memory():
    """Tracing on in this process, every span built and kept in memory as it ends."""
    pytest.importorskip("opentelemetry.sdk", reason="the tracing extra is not installed")
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from routeopt.common import tracing

    exporter = InMemorySpanExporter()
    tracing.configure(exporter, batch=False)
    yield exporter
    tracing.disable()
