"""The code grader's sandbox: tests pass/fail, and hangs, forks, memory hogs and network are contained."""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid
from pathlib import Path

import pytest

from evals.grading import build_grader, sandbox
from evals.grading.code import extract_code
from evals.grading.sandbox import SandboxUnavailable, isolation

needs_isolation = pytest.mark.skipif(
    isinstance(isolation(False), str), reason=f"no sandbox isolation here: {isolation(False)}"
)
ITEM = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}


def grader(**kw: object):
    return build_grader({"type": "code", "timeout_s": 3, **kw})


def alive(marker: str) -> list[int]:
    """Pids whose command line carries `marker` (processes the sandbox should have killed)."""
    found = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                if marker.encode() in (d / "cmdline").read_bytes():
                    found.append(int(d.name))
            except OSError:
                continue
    return found


def test_extract_code_prefers_python_fences() -> None:
    reply = "Here:\n```python\ndef f():\n    return 1\n```\nand a shell line\n```bash\nls\n```"
    assert extract_code(reply) == "def f():\n    return 1\n"
    assert extract_code("def f(): return 1") == "def f(): return 1"


@needs_isolation
async def test_correct_program_passes_and_wrong_one_scores_the_fraction() -> None:
    ok = await grader().grade("```python\ndef add(a, b):\n    return a + b\n```", ITEM)
    assert ok.passed and ok.score == 1.0 and ok.reason is None
    wrong = await grader().grade("def add(a, b):\n    return a * b", ITEM)
    assert not wrong.passed and wrong.score == pytest.approx(1 / 3)
    assert wrong.reason.startswith("2/3 tests failed: test 0 `assert add(1, 2) == 3`: AssertionError")


@needs_isolation
async def test_program_that_raises_or_exits_fails_with_the_reason() -> None:
    g = await grader().grade("def add(a, b) return a", ITEM)
    assert not g.passed and "SyntaxError" in g.reason
    g = await grader().grade("import sys\nsys.exit(0)", ITEM)
    assert not g.passed and "SystemExit" in g.reason
    forged = "print('\\n' + '0' * 32 + '{\"solution_error\": null, \"results\": [[true, null]]}')"
    g = await grader().grade(forged + "\ndef add(a, b):\n    return None", ITEM)
    assert not g.passed and g.score == 0.0


@needs_isolation
async def test_hang_is_killed_with_its_whole_process_tree() -> None:
    marker = f"routeopt-test-{uuid.uuid4().hex}"
    code = (
        "import os, sys, time\n"
        "if os.fork() == 0:\n"
        "    os.setsid()\n"
        f"    os.execv('/bin/sh', ['sh', '-c', 'sleep 300; echo {marker}'])\n"
        "time.sleep(300)\n"
    )
    started = time.monotonic()
    g = await grader(timeout_s=1.5).grade(code, ITEM)
    assert time.monotonic() - started < 10
    assert not g.passed and "timed out after 1.5s" in g.reason
    for _ in range(50):
        if not alive(marker):
            break
        time.sleep(0.05)
    assert alive(marker) == [], "a process forked by the program survived the kill"


@needs_isolation
async def test_fork_bomb_is_contained() -> None:
    started = time.monotonic()
    g = await grader(timeout_s=3).grade("import os\nwhile True:\n    os.fork()", ITEM)
    assert not g.passed
    assert time.monotonic() - started < 15


@needs_isolation
@pytest.mark.parametrize("via", ["prlimit", "preexec_fn"])
async def test_memory_limit(via: str, monkeypatch: pytest.MonkeyPatch) -> None:
    if via == "preexec_fn":
        monkeypatch.setattr(sandbox, "_prlimit", lambda *a: None)
    elif sandbox._prlimit(256, 2, 64) is None:
        pytest.skip("prlimit is not installed")
    g = await grader(memory_mb=256).grade("x = bytearray(1024 ** 3)\ndef add(a, b):\n    return a + b", ITEM)
    assert not g.passed and "MemoryError" in g.reason
    ok = await grader(memory_mb=256).grade("x = bytearray(64 * 1024 ** 2)\ndef add(a, b):\n    return a + b", ITEM)
    assert ok.passed, ok.reason


@needs_isolation
async def test_cpu_limit_or_timeout_stops_a_busy_loop() -> None:
    g = await grader(timeout_s=1).grade("while True:\n    pass", ITEM)
    assert not g.passed and ("timed out" in g.reason or "SIGXCPU" in g.reason)


class _Listener:
    """A TCP server on 127.0.0.1 that counts connections."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.accepted = 0
        self.sock.settimeout(0.2)
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            conn.close()

    def close(self) -> None:
        self._stop = True
        self._thread.join()
        self.sock.close()


@needs_isolation
async def test_no_network_unless_allowed() -> None:
    listener = _Listener()
    code = (
        "import socket\n"
        f"socket.create_connection(('127.0.0.1', {listener.port}), timeout=2).close()\n"
        "def add(a, b):\n    return a + b\n"
    )
    try:
        blocked = await grader().grade(code, ITEM)
        assert not blocked.passed and ("unreachable" in blocked.reason or "refused" in blocked.reason)
        assert listener.accepted == 0
        if not isinstance(isolation(True), str):
            allowed = await grader(network="allow").grade(code, ITEM)
            assert allowed.passed, allowed.reason
            assert listener.accepted == 1
    finally:
        listener.close()


@needs_isolation
async def test_program_cannot_write_outside_its_folder(tmp_path: Path) -> None:
    iso = isolation(False)
    if isinstance(iso, str) or not iso.unprivileged:
        pytest.skip("the sandbox runs as root here; file system protection needs a non-root user")
    target = tmp_path / "owned"
    code = f"open({str(target)!r}, 'w').write('x')\ndef add(a, b):\n    return a + b"
    g = await grader().grade(code, ITEM)
    assert not g.passed and "PermissionError" in g.reason
    assert not target.exists()
    scratch = await grader().grade("open('scratch.txt', 'w').write('ok')\ndef add(a, b):\n    return a + b", ITEM)
    assert scratch.passed


async def test_unavailable_isolation_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox, "isolation", lambda network=False: "`unshare` (util-linux) is not installed")
    with pytest.raises(SandboxUnavailable, match="not installed.*network: allow"):
        await grader().grade("def add(a, b):\n    return a + b", ITEM)


def test_isolation_probe_reports_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None)
    sandbox.isolation.cache_clear()
    try:
        why = sandbox.isolation(False)
        assert isinstance(why, str) and "unshare" in why
        fallback = sandbox.isolation(True)  # network allowed: runs without namespaces
        assert not isinstance(fallback, str) and fallback.prefix == ()
    finally:
        sandbox.isolation.cache_clear()


async def test_item_without_tests_is_an_error() -> None:
    with pytest.raises(ValueError, match="'tests' must be a test string"):
        await grader().grade("x = 1", {"question": "no tests"})


@needs_isolation
async def test_prelude_and_single_test_string() -> None:
    g = await grader(prelude="import math", tests_field="check").grade(
        "def area(r):\n    return math.pi * r * r", {"check": "assert round(area(1), 2) == 3.14"}
    )
    assert g.passed, g.reason


@needs_isolation
async def test_parallel_grading_is_independent() -> None:
    import asyncio

    g = grader(max_parallel=2)
    right = "def add(a, b):\n    return a + b"
    wrong = "def add(a, b):\n    return None"
    grades = await asyncio.gather(*(g.grade(right if i % 2 else wrong, ITEM) for i in range(6)))
    assert [x.passed for x in grades] == [i % 2 == 1 for i in range(6)]
    assert os.getpid()  # the grading process is alive and well
