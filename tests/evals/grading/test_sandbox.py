"""The code grader's sandbox, tested by attacking it: forged verdicts, secrets, writes outside,
network, fork bombs, memory and output hogs, leftovers; as root and as an unprivileged runner."""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path

import pytest

from routeopt.evals.grading import build_grader, sandbox
from routeopt.evals.grading.code import extract_code
from routeopt.evals.grading.sandbox import SandboxUnavailable, isolation
from tests import REPO

needs_isolation = pytest.mark.skipif(
    isinstance(isolation(False), str), reason=f"no sandbox isolation here: {isolation(False)}"
)
ITEM = {"tests": ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(2, 2) == 4"]}
# No program can pass more than one of these: an honest program scores at most 1/3.
IMPOSSIBLE = {"tests": ["assert add(1, 2) == 3", "assert add(1, 2) == 4", "assert len(str(add(1, 2))) == 99"]}
FAKE_REPORTS = (  # the old harness's report line and the new checker's, as a forger would write them
    '\'{"solution_error": null, "results": [[true, null], [true, null], [true, null]]}\\n\''
    " + ''.join('{\"test\": %d, \"ok\": true}\\n' % i for i in range(3)) + '{\"done\": true}\\n'"
)
FORGERIES = {
    # the attack: call the harness's own reporting function
    "call_the_reporter": "import __main__\n__main__.emit({'solution_error': None, 'results': [[True, None]] * 3})",
    "print_a_report_with_the_nonce": (
        "import __main__, os\n"
        f"print(getattr(__main__, 'nonce', '') + {FAKE_REPORTS}, flush=True)\nos._exit(0)"
    ),
    "write_a_report_to_every_fd": (
        "import __main__, os\n"
        f"fake = ('\\n' + getattr(__main__, 'nonce', '') + {FAKE_REPORTS}).encode()\n"
        "for fd in os.listdir('/proc/self/fd'):\n"
        "    try:\n        os.write(int(fd), fake)\n    except OSError:\n        pass\n"
        "os._exit(0)"
    ),
    "write_a_report_to_other_processes_fds": (
        "import os\n"
        f"fake = {FAKE_REPORTS}\n"
        "for pid in [p for p in os.listdir('/proc') if p.isdigit()]:\n"
        "    for fd in range(3, 12):\n"
        "        try:\n            open(f'/proc/{pid}/fd/{fd}', 'w').write(fake)\n        except OSError:\n            pass\n"
        "def add(a, b):\n    return a + b"
    ),
    "equal_to_everything": (
        "class Anything:\n    def __eq__(self, other):\n        return True\n    __hash__ = object.__hash__\n"
        "    def __len__(self):\n        return 99\n    def __str__(self):\n        return 'x' * 99\n"
        "def add(a, b):\n    return Anything()"
    ),
    "int_subclass_equal_to_everything": (
        "class Sly(int):\n    def __eq__(self, other):\n        return True\n    __hash__ = int.__hash__\n"
        "def add(a, b):\n    return Sly(a + b)"
    ),
    "patch_exec_and_compile": (
        "import builtins\nbuiltins.exec = lambda *a, **k: None\nbuiltins.compile = lambda *a, **k: None\n"
        "def add(a, b):\n    return a + b"
    ),
    "shadow_the_tests_builtins": "def add(a, b):\n    return a + b\ndef len(x):\n    return 99",
    "edit_the_tests": "import __main__\n__main__.tests[:] = ['pass'] * 3\ndef add(a, b):\n    return a + b",
    "exit_0_before_the_tests": "import os\nos._exit(0)",
    "raise_system_exit_0": "raise SystemExit(0)",
    "patch_the_exits": (
        "import os, sys\nos._exit = sys.exit = lambda *a: None\ndef add(a, b):\n    return a + b"
    ),
    "kill_the_parent": "import os\nos.kill(os.getppid(), 9)\ndef add(a, b):\n    return a + b",
    "kill_everything": "import os\nos.kill(-1, 9)\ndef add(a, b):\n    return a + b",
    "a_child_prints_a_report_later": (
        "import os, time\n"
        "if os.fork() == 0:\n"
        f"    time.sleep(0.3)\n    print({FAKE_REPORTS}, flush=True)\n"
        "    for fd in range(3, 12):\n"
        '        try:\n            os.write(fd, b\'{"test": 1, "ok": true}\\n\')\n        except OSError:\n            pass\n'
        "    os._exit(0)\n"
        "def add(a, b):\n    return a + b"
    ),
}


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


def _stat(pid: int) -> tuple[str, int] | None:
    """(state, parent pid) of `pid`, or None once it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return state, int(ppid)


def descendants_alive(marker: str) -> list[int]:
    """Live (not zombie) descendants of this process whose command line carries `marker`.

    Sandbox processes of tests running at the same time on other workers are not ours; with
    this process a child subreaper (`adopt_orphans`), a process that escaped its sandbox's
    kill still descends from us rather than from init."""
    me, found = os.getpid(), []
    for pid in alive(marker):
        seen, cur = set(), pid
        while cur != me and cur > 1 and cur not in seen and (st := _stat(cur)) is not None:
            seen.add(cur)
            cur = st[1]
        if cur == me and (st := _stat(pid)) is not None and st[0] != "Z":
            found.append(pid)
    return found


@pytest.fixture
def adopt_orphans():
    """Make this process a child subreaper for the test, then reap the orphans it adopted."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    pr_set_child_subreaper = 36
    assert libc.prctl(pr_set_child_subreaper, 1, 0, 0, 0) == 0, os.strerror(ctypes.get_errno())
    yield
    libc.prctl(pr_set_child_subreaper, 0, 0, 0, 0)
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (st := _stat(int(d.name))) is not None and st == ("Z", os.getpid()):
            try:
                os.waitpid(int(d.name), os.WNOHANG)
            except ChildProcessError:
                pass


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


@needs_isolation
async def test_an_honest_program_scores_one_third_on_the_impossible_tests() -> None:
    honest = await grader().grade("def add(a, b):\n    return a + b", IMPOSSIBLE)
    assert honest.score == pytest.approx(1 / 3)


@needs_isolation
@pytest.mark.parametrize("attack", sorted(FORGERIES))
async def test_a_program_cannot_forge_a_pass(attack: str) -> None:
    g = await grader().grade(FORGERIES[attack], IMPOSSIBLE)
    assert not g.passed and g.score <= 1 / 3 + 1e-9, g.reason


@needs_isolation
async def test_an_object_equal_to_everything_is_named_in_the_reason() -> None:
    g = await grader().grade(FORGERIES["equal_to_everything"], ITEM)
    assert g.score == 0.0
    assert "the program gave a Anything object where the test compared it with a int" in g.reason


@needs_isolation
async def test_tests_get_the_real_builtins_and_stdlib_modules() -> None:
    """Names the tests take from the program's namespace could answer for the tests' own helpers."""
    item = {
        "tests": ["assert math.isclose(area(1), 3.14159, rel_tol=1e-5)", "assert round(area(1), 2) == 3.14"]
    }
    fake = (
        "class math:\n    @staticmethod\n    def isclose(*a, **k):\n        return True\n"
        "def round(*a, **k):\n    return 3.14\n"
        "def area(r):\n    return 0\n"
    )
    g = await grader().grade(fake, item)
    assert g.score == 0.0, g.reason
    honest = await grader().grade("import math\ndef area(r):\n    return math.pi * r * r", item)
    assert honest.passed, honest.reason


@pytest.fixture
def project() -> Path:
    """A project folder as a runner leaves it: world-readable, with a DuckDB file, a registry and
    a signing key, outside any sandbox."""
    import duckdb

    root = Path(tempfile.mkdtemp(prefix="routeopt-secret-"))
    root.chmod(0o755)
    (root / ".routeopt" / "registry").mkdir(parents=True)
    with duckdb.connect(str(root / ".routeopt" / "routeopt.duckdb")) as db:
        db.execute("create table t as select 'db-secret-8c1f' as s")
    (root / ".routeopt" / "registry" / "champion.json").write_text('{"secret": "registry-secret-93ab"}')
    key = root / "signing.key"
    key.write_text("-----BEGIN PRIVATE KEY-----\nkey-secret-51d2\n")
    key.chmod(0o600)
    for p in (root / ".routeopt", root / ".routeopt" / "registry"):
        p.chmod(0o755)
    yield root
    shutil.rmtree(root, ignore_errors=True)


def _leak_program(paths: list[Path]) -> str:
    return (
        "import os\n"
        f"PATHS = {[str(p) for p in paths]!r}\n"
        "def leak(i):\n"
        "    return open(PATHS[i], 'rb').read(4096)\n"
        "found = []\n"
        "for p in PATHS:\n"
        "    try:\n        found.append(open(p, 'rb').read(4096))\n    except OSError as e:\n        found.append(type(e).__name__)\n"
        "raise RuntimeError(repr(found))\n"
    )


@needs_isolation
async def test_program_cannot_read_planted_secrets(project: Path) -> None:
    paths = [
        project / "signing.key",
        project / ".routeopt" / "routeopt.duckdb",
        project / ".routeopt" / "registry" / "champion.json",
        REPO / "README.md",
        Path.home() / ".bashrc",
    ]
    readable = [p for p in paths if p.exists()]
    g = await grader().grade(_leak_program(readable), {"tests": ["pass"]})
    assert not g.passed
    assert g.reason.count("FileNotFoundError") == len(readable), g.reason
    for secret in ("key-secret", "db-secret", "registry-secret", "DUCK", "routeopt"):
        assert secret not in g.reason
    tests = [f"assert leak({i}) == {p.read_bytes()[:4096]!r}" for i, p in enumerate(readable)]
    code = _leak_program(readable).replace("raise RuntimeError(repr(found))\n", "")
    g = await grader().grade(code, {"tests": tests})
    assert g.score == 0.0 and "FileNotFoundError" in g.reason, g.reason


@needs_isolation
async def test_program_cannot_write_outside_the_sandbox() -> None:
    shared = Path(tempfile.mkdtemp(prefix="routeopt-shared-"))
    shared.chmod(0o777)  # writable by anyone, so only the sandbox stands in the way
    targets = [
        shared / "owned",
        REPO / f"owned-{uuid.uuid4().hex}",
        Path(tempfile.gettempdir()) / f"routeopt-owned-{uuid.uuid4().hex}",
    ]  # its own /tmp: allowed
    code = (
        f"TARGETS = {[str(t) for t in targets]!r}\n"
        "def write(i):\n"
        "    open(TARGETS[i], 'w').write('x')\n"
        "    return 'written'\n"
    )
    try:
        g = await grader().grade(
            code, {"tests": [f"assert write({i}) == 'written'" for i in range(len(targets))]}
        )
        assert g.score == pytest.approx(1 / 3) and g.reason.count("FileNotFoundError") == 2, g.reason
        assert not any(t.exists() for t in targets)
    finally:
        shutil.rmtree(shared, ignore_errors=True)
        for t in targets[1:]:
            t.unlink(missing_ok=True)


@needs_isolation
async def test_temp_dirs_are_private_and_nothing_is_left_behind() -> None:
    marker = f"routeopt-left-{uuid.uuid4().hex}"
    planted = Path(tempfile.gettempdir()) / f"{marker}-host"
    planted.write_text("host-tmp-secret")
    planted.chmod(0o644)
    leftovers = [Path("/tmp") / marker, Path("/dev/shm") / marker]
    code = (
        "import os\n"
        f"for d in ('/tmp', '/dev/shm'):\n"
        f"    try:\n        open(os.path.join(d, {marker!r}), 'w').write('left')\n    except OSError:\n        pass\n"
        f"def host_file():\n    return open({str(planted)!r}).read()\n"
        f"def scratch():\n    return open('/tmp/{marker}').read()\n"
    )
    try:
        g = await grader().grade(
            code, {"tests": ["assert scratch() == 'left'", "assert host_file() == 'host-tmp-secret'"]}
        )
        assert g.score == 0.5 and "FileNotFoundError" in g.reason, g.reason  # its own /tmp works
        assert [p for p in leftovers if p.exists()] == []
    finally:
        planted.unlink()
        for p in leftovers:
            p.unlink(missing_ok=True)


@needs_isolation
async def test_scratch_space_is_capped() -> None:
    code = (
        "import os\nfor i in range(100):\n    open(f'chunk{i}', 'wb').write(b'x' * (2 * 1024 * 1024))\n"
        "def add(a, b):\n    return a + b"
    )
    g = await grader().grade(code, ITEM)
    assert not g.passed and "No space left on device" in g.reason, g.reason


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
async def test_a_timeout_keeps_the_tests_that_passed() -> None:
    code = "import time\ndef add(a, b):\n    if a == 2:\n        time.sleep(60)\n    return a + b"
    g = await grader(timeout_s=1.5).grade(code, ITEM)
    assert g.score == pytest.approx(2 / 3) and not g.passed
    assert g.reason == "timed out after 1.5s; the process group was killed (2/3 tests had passed)"


@needs_isolation
@pytest.mark.parametrize("where", ["at load", "in a call"])
async def test_fork_bomb_is_contained(where: str, adopt_orphans: None) -> None:
    bomb = "import os\nwhile True:\n    os.fork()\n"
    code = (
        bomb
        if where == "at load"
        else "import os\ndef add(a, b):\n" + "".join("    " + line + "\n" for line in bomb.splitlines())
    )
    started = time.monotonic()
    g = await grader(timeout_s=3).grade(code, ITEM)
    assert not g.passed and ("BlockingIOError" in g.reason or "timed out" in g.reason), g.reason
    assert time.monotonic() - started < 15
    for _ in range(50):
        if not descendants_alive("class ProgramGone"):
            break
        time.sleep(0.05)
    assert descendants_alive("class ProgramGone") == [], "a sandbox process outlived its item"


@needs_isolation
async def test_memory_limit() -> None:
    g = await grader(memory_mb=256).grade("x = bytearray(1024 ** 3)\ndef add(a, b):\n    return a + b", ITEM)
    assert not g.passed and "MemoryError" in g.reason
    ok = await grader(memory_mb=256).grade(
        "x = bytearray(64 * 1024 ** 2)\ndef add(a, b):\n    return a + b", ITEM
    )
    assert ok.passed, ok.reason


@needs_isolation
async def test_huge_output_is_capped() -> None:
    code = "import sys\nwhile True:\n    sys.stdout.write('x' * 65536)\n"
    started = time.monotonic()
    run = await asyncio.to_thread(sandbox.run_tests, code, ITEM["tests"], timeout_s=5)
    assert run.score == 0.0 and "File too large" in run.reason(), run.reason()
    assert time.monotonic() - started < 5 and len(run.program_output) <= 64 * 1024
    g = await grader().grade("def add(a, b):\n    print('y' * (32 * 1024 * 1024))\n    return a + b", ITEM)
    assert g.score == 0.0 and "File too large" in g.reason


@needs_isolation
async def test_cpu_limit_or_timeout_stops_a_busy_loop() -> None:
    g = await grader(timeout_s=1).grade("while True:\n    pass", ITEM)
    assert not g.passed and ("timed out" in g.reason or "CPU" in g.reason)


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


# -- the same attacks with an unprivileged runner --------------------------------------------

_DRIVER = r"""
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sandbox", sys.argv[1])
sb = importlib.util.module_from_spec(spec)
sys.modules["sandbox"] = sb
spec.loader.exec_module(sb)
iso = sb.isolation(False)
out = {"isolation": iso if isinstance(iso, str) else iso.description, "runs": {}}
if not isinstance(iso, str):
    for name, (code, tests) in json.loads(sys.argv[2]).items():
        run = sb.run_tests(code, tests, timeout_s=3, memory_mb=256)
        out["runs"][name] = [run.score, run.reason()]
print(json.dumps(out))
"""


def _as_nobody(folder: Path, attacks: dict[str, tuple[str, list[str]]], wrap: list[str] = ()) -> dict:
    """Run the sandbox as uid 65534 with the system Python (it needs nothing but the stdlib)."""
    for name in ("sandbox.py", "harness.py"):
        shutil.copy(REPO / "evals" / "grading" / name, folder / name)
    proc = subprocess.run(
        [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            *wrap,
            "/usr/bin/python3",
            "-I",
            "-c",
            _DRIVER,
            str(folder / "sandbox.py"),
            json.dumps(attacks),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        cwd="/",
        env={"PATH": "/usr/bin:/bin"},
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.splitlines()[-1])


needs_root = pytest.mark.skipif(
    os.geteuid() != 0 or not Path("/usr/bin/python3").exists() or not shutil.which("setpriv"),
    reason="switching to an unprivileged runner needs root, setpriv and /usr/bin/python3",
)


@needs_isolation
@needs_root
def test_the_attacks_fail_for_an_unprivileged_runner_too() -> None:
    """The runner is uid 65534 here and owns its secrets (0600): only the sandbox protects them."""
    home = Path(tempfile.mkdtemp(prefix="routeopt-runner-"))
    try:
        (home / "signing.key").write_text("key-secret-77e0")
        (home / "signing.key").chmod(0o600)
        for p in (home, home / "signing.key"):
            os.chown(p, 65534, 65534)
        listener, marker = _Listener(), f"routeopt-left-{uuid.uuid4().hex}"
        net = f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=2)"
        attacks = {
            "forge": (FORGERIES["call_the_reporter"], IMPOSSIBLE["tests"]),
            "equal": (FORGERIES["equal_to_everything"], IMPOSSIBLE["tests"]),
            "read": (_leak_program([home / "signing.key"]), ["pass"]),
            "write": (f"open({str(home / 'owned')!r}, 'w').write('x')", ["pass"]),
            "tmp": (
                f"open('/tmp/{marker}', 'w').write('x')\nopen('/dev/shm/{marker}', 'w').write('x')",
                ["pass"],
            ),
            "network": (net, ["pass"]),
            "fork": ("import os\nwhile True:\n    os.fork()", ["pass"]),
            "memory": ("x = bytearray(1024 ** 3)", ["pass"]),
            "output": ("import sys\nwhile True:\n    sys.stdout.write('x' * 65536)", ["pass"]),
            "disk": ("for i in range(100):\n    open(f'c{i}', 'wb').write(b'x' * 2 ** 21)", ["pass"]),
            "honest": ("def add(a, b):\n    return a + b", ITEM["tests"]),
        }
        try:
            out = _as_nobody(home, attacks)
        finally:
            listener.close()
        assert out["isolation"].startswith("bubblewrap as uid 65534,"), out["isolation"]
        runs = out["runs"]
        assert runs["honest"] == [1.0, None]
        assert runs["forge"][0] == 0.0 and runs["equal"][0] <= 1 / 3 + 1e-9
        assert "FileNotFoundError" in runs["read"][1] and "key-secret" not in runs["read"][1]
        assert runs["write"][0] == 0.0 and not (home / "owned").exists()
        assert not Path(f"/tmp/{marker}").exists() and not Path(f"/dev/shm/{marker}").exists()
        assert "Connection refused" in runs["network"][1] and listener.accepted == 0
        assert "BlockingIOError" in runs["fork"][1] or "timed out" in runs["fork"][1]
        assert "MemoryError" in runs["memory"][1]
        assert "File too large" in runs["output"][1] and "No space left" in runs["disk"][1]
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_isolation
@needs_root
def test_disabled_user_namespaces_are_a_clear_error() -> None:
    """A runner that may not create user namespaces (here: inside a sandbox that forbids them)."""
    folder = Path(tempfile.mkdtemp(prefix="routeopt-nouserns-"))
    folder.chmod(0o755)
    try:
        wrap = ["bwrap", "--unshare-user", "--disable-userns", "--dev-bind", "/", "/", "--"]
        out = _as_nobody(folder, {}, wrap)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    why = out["isolation"]
    assert why.startswith("bubblewrap cannot start a sandbox as uid 65534 (bwrap: ")
    assert "user.max_user_namespaces" in why and "`sandbox: none`" in why


# -- no isolation: a clear error at suite load, unless the suite opts out ----------------------

SUITE = """name: code-suite
dataset: {path: d.jsonl, id_field: id}
prompt: {template: "{{ task }}"}
grader:
  type: code
"""


@pytest.fixture
def no_bwrap(monkeypatch: pytest.MonkeyPatch):
    real = shutil.which
    monkeypatch.setattr(sandbox.shutil, "which", lambda name: None if name == "bwrap" else real(name))
    sandbox.isolation.cache_clear()
    yield
    sandbox.isolation.cache_clear()


def test_no_bubblewrap_is_a_clear_error_at_suite_load(tmp_path: Path, no_bwrap: None) -> None:
    from click.testing import CliRunner

    from routeopt.evals.suite.spec import SuiteError, load_suite
    from routeopt.flows.commands.suites import suites

    (tmp_path / "d.jsonl").write_text('{"id": "a", "task": "t", "tests": ["assert True"]}\n')
    path = tmp_path / "code-suite.yaml"
    path.write_text(SUITE)
    with pytest.raises(SuiteError) as err:
        load_suite(path)
    message = str(err.value)
    assert (
        str(path) in message and "grader: the code grader cannot isolate programs on this machine" in message
    )
    assert "`apt-get install bubblewrap`" in message and "`sandbox: none`" in message
    (tmp_path / "routeopt.yaml").write_text(
        "candidates:\n  - {name: m, provider: openai, model: m, base_url: 'http://127.0.0.1:9/v1', input_price_per_mtok: 1, output_price_per_mtok: 1}\n"
    )
    res = CliRunner().invoke(suites, ["validate", str(path), "--config", str(tmp_path / "routeopt.yaml")])
    assert res.exit_code == 1 and f"{path}:4: grader: the code grader cannot isolate" in res.output
    path.write_text(SUITE + "  sandbox: none\n")
    assert load_suite(path).grader.sandbox == "none"


async def test_sandbox_none_runs_unisolated_and_still_judges_in_the_checker(no_bwrap: None) -> None:
    with pytest.raises(SandboxUnavailable, match="not installed"):
        sandbox.run_tests("x = 1", ["pass"])
    g = grader(sandbox="none")
    assert (await g.grade("def add(a, b):\n    return a + b", ITEM)).passed
    for attack in ("call_the_reporter", "equal_to_everything", "patch_exec_and_compile"):
        forged = await g.grade(FORGERIES[attack], IMPOSSIBLE)
        assert forged.score <= 1 / 3 + 1e-9, (attack, forged.reason)


async def test_item_without_tests_is_an_error() -> None:
    with pytest.raises(ValueError, match="'tests' must be a test string"):
        await grader(sandbox="none").grade("x = 1", {"question": "no tests"})


@needs_isolation
async def test_prelude_and_single_test_string() -> None:
    g = await grader(prelude="import math", tests_field="check").grade(
        "def area(r):\n    return math.pi * r * r", {"check": "assert round(area(1), 2) == 3.14"}
    )
    assert g.passed, g.reason


@needs_isolation
async def test_parallel_grading_is_independent() -> None:
    g = grader(max_parallel=2)
    right = "def add(a, b):\n    return a + b"
    wrong = "def add(a, b):\n    return None"
    grades = await asyncio.gather(*(g.grade(right if i % 2 else wrong, ITEM) for i in range(6)))
    assert [x.passed for x in grades] == [i % 2 == 1 for i in range(6)]
