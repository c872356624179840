"""Shared test setup: an isolated Prefect home (one per pytest-xdist worker), one temporary Prefect
server for the whole run, the repo's paths, and the tier markers every test gets from what it
uses (tests/tiers.py)."""

from __future__ import annotations

import atexit
import gc
import os
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import hypothesis
import pytest

from tests import tiers
from tests.litellm_proxy import free_port

# Python's bytecode cache, whatever the machine's environment says (PYTHONDONTWRITEBYTECODE): without
# it every pytest-xdist worker, and every Python process a test starts, compiles the same modules
# again (rewriting and compiling the test modules alone is ~8 s of CPU per worker on a fresh clone).
sys.dont_write_bytecode = False
os.environ.pop("PYTHONDONTWRITEBYTECODE", None)

# Prefect reads its settings at import: point it at a throwaway home before anything imports it.
# Each pytest-xdist worker gets a folder of its own under it: `routeopt run` serialises server
# starts per home, and each worker's session starts its own test server.
if "PREFECT_HOME" not in os.environ:
    os.environ["PREFECT_HOME"] = tempfile.mkdtemp(prefix="routeopt-prefect-")
    atexit.register(shutil.rmtree, os.environ["PREFECT_HOME"], True)  # a session leaves no home behind
if _WORKER := os.environ.get("PYTEST_XDIST_WORKER"):
    os.environ["PREFECT_HOME"] = os.path.join(os.environ["PREFECT_HOME"], _WORKER)
    os.makedirs(os.environ["PREFECT_HOME"], exist_ok=True)
os.environ.setdefault("PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS", "180")
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
# Router training's small logistic fits spend 20 s instead of 0.3 s in BLAS threads that spin
# against each other on a busy 2-core machine; one thread each is what these tests need.
os.environ.setdefault("OMP_NUM_THREADS", "1")

REPO = Path(__file__).resolve().parents[1]
SHARED = REPO.parent / "shared"
WORKERS_PER_CORE = 1.5  # 3 on this project's 2-core machines (tests/README.md)

# No test may depend on how fast the machine is: CI cores are shared, and several workers share them.
hypothesis.settings.register_profile("routeopt", deadline=None)
hypothesis.settings.load_profile("routeopt")


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with the tiers it uses (and `slow` with any), group tests that share
    something onto one xdist worker (tests/tiers.py: xdist_group), and, when distributing, hand
    out the longest kinds first (virtualenv builds, then other slow tests) so none starts last."""
    rank = {}
    for item in items:
        found = tiers.tiers(item)
        for name in sorted(found):
            item.add_marker(name)
        if found:
            item.add_marker("slow")
        rank[item.nodeid] = 0 if "venv" in found else 1 if item.get_closest_marker("slow") else 2
        if (group := tiers.xdist_group(item, found)) is not None:
            item.add_marker(pytest.mark.xdist_group(group))
    if os.environ.get("PYTEST_XDIST_WORKER"):
        items.sort(key=lambda item: rank[item.nodeid])  # stable: files stay in order


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze what collection left (the test modules and everything they import: about 570,000
    objects) into the permanent generation, which no later full collection walks. Tests that
    need a heap of their own take `unfrozen_heap`."""
    gc.collect()
    gc.freeze()


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    """After each test, collect what it left and freeze what survives (module fixtures, caches,
    imports): a full collection, the test's own or the collector's, then walks only what the
    running test made, not everything a worker's earlier tests kept."""
    yield
    gc.collect()
    gc.freeze()


@pytest.fixture
def unfrozen_heap():
    """The heap as a program has it, nothing frozen; what collection froze is frozen again after
    (less this test's garbage)."""
    gc.unfreeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()
        gc.freeze()


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int | None:
    """`-n auto` (the default addopts): WORKERS_PER_CORE workers per core, since many tests wait
    on servers and subprocesses; none (run in this process) when the command names only files
    or single tests, where starting and collecting in each worker costs more than it saves.
    PYTEST_XDIST_AUTO_NUM_WORKERS overrides it."""
    if os.environ.get("PYTEST_XDIST_AUTO_NUM_WORKERS"):
        return None  # pytest-xdist's own hook reads it
    named = [str(arg).split("::")[0] for arg in config.args]
    if named and all(name.endswith(".py") for name in named):
        return 0
    return max(1, int(WORKERS_PER_CORE * len(os.sched_getaffinity(0)) + 0.5))


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


# Where the pytest-xdist controller writes the URL of the run's one Prefect server once it answers
# (an empty file: it could not start one, and each worker starts its own).
_SHARED_PREFECT = "ROUTEOPT_TEST_PREFECT_API_FILE"
_PREFECT_STARTUP_S = 180


def pytest_configure(config: pytest.Config) -> None:
    """In the pytest-xdist controller of a run that selects Prefect tests: start one temporary
    Prefect server (on a thread, while the workers collect) for every worker to share. A server
    is seconds of CPU to start and keeps using some while it idles; one per worker was about a
    minute of CPU per run of the suite."""
    if os.environ.get("PYTEST_XDIST_WORKER") or not _distributes(config) or not _selects_prefect(config):
        return
    folder = Path(tempfile.mkdtemp(prefix="routeopt-prefect-server-"))
    target = folder / "api_url"
    os.environ[_SHARED_PREFECT] = str(target)  # the workers inherit it
    servers: list = []

    def start() -> None:
        url = ""
        try:
            from prefect.server.api.server import SubprocessASGIServer
            from prefect.settings import PREFECT_SERVER_DATABASE_CONNECTION_URL, temporary_settings

            db = f"sqlite+aiosqlite:///{folder / 'prefect.db'}"
            with temporary_settings(updates={PREFECT_SERVER_DATABASE_CONNECTION_URL: db}):
                server = SubprocessASGIServer(port=free_port())  # another, should it be taken
                servers.append(server)
                server.start(timeout=_PREFECT_STARTUP_S)
            url = server.api_url
        finally:
            (folder / "api_url.tmp").write_text(url)
            (folder / "api_url.tmp").rename(target)

    thread = threading.Thread(target=start, name="routeopt-prefect-server", daemon=True)
    thread.start()

    def stop() -> None:
        thread.join(_PREFECT_STARTUP_S)
        for server in servers:
            server.stop()
        shutil.rmtree(folder, ignore_errors=True)

    config.add_cleanup(stop)


def _distributes(config: pytest.Config) -> bool:
    return bool(getattr(config.option, "numprocesses", 0)) and getattr(config.option, "dist", "no") != "no"


def _selects_prefect(config: pytest.Config) -> bool:
    """Whether the -m expression keeps tests that run flows on a Prefect server (marked
    `prefect`, and so `slow`): the fast tier starts none."""
    expression = config.getoption("markexpr", "")
    if not expression:
        return True
    from _pytest.mark.expression import Expression

    return Expression.compile(expression).evaluate(lambda name, **kwargs: name in ("prefect", "slow"))


def _shared_prefect_api() -> str | None:
    """The URL of the run's shared Prefect server, waiting for it to answer; None where there is
    none (the tests run in one process, or the controller could not start it)."""
    path = os.environ.get(_SHARED_PREFECT)
    if not path:
        return None
    deadline = time.monotonic() + _PREFECT_STARTUP_S + 30
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return None
        time.sleep(0.2)
    return Path(path).read_text().strip() or None


@pytest.fixture(scope="session")
def prefect_harness():
    """One temporary Prefect server for the whole run (it is slow to start): the one the
    pytest-xdist controller started for all workers, or this process's own."""
    from prefect.testing.utilities import prefect_test_harness

    url = _shared_prefect_api()
    if url is None:
        with prefect_test_harness(server_startup_timeout=_PREFECT_STARTUP_S):
            yield
        return
    import prefect.context
    from prefect.events.worker import EventsWorker
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings(updates={PREFECT_API_URL: url}):
        # as prefect_test_harness does: code running in a context copied earlier sees it too
        with prefect.context._temporary_global_settings_context(prefect.context.get_settings_context()):
            yield
            APILogWorker.drain_all()  # this worker's logs and events reach the server before it stops
            EventsWorker.drain_all()


@pytest.fixture(scope="session")
def prefect_api(prefect_harness) -> str:
    """The session's Prefect server, for `routeopt` commands a test runs in a subprocess where the
    CLI's own temporary server is not what is tested: each would start one (seconds of CPU)."""
    from prefect.settings import PREFECT_API_URL

    return str(PREFECT_API_URL.value())


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
