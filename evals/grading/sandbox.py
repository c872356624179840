"""Run a model's program against unit tests in a separate, limited process (for the `code` grader).

Isolation, from the outside in: a new session (so the whole process group can be killed); rlimits
on memory, CPU seconds, file size, open files and processes, set by `prlimit` so that no Python
runs between fork and exec in a threaded runner; a new network namespace with only a downed
loopback (`unshare --net`); a new PID namespace (`--pid --fork --kill-child`: when the sandbox
dies, every process it forked dies with it); and, when started as root, `setpriv` to `nobody`
before the interpreter starts, so RLIMIT_NPROC caps fork bombs and the program cannot write the
repository. A wall-clock timeout kills the process group. An item that hangs or forks is killed,
never the run. Where the network cannot be isolated the grader says why instead of running
unisolated, unless the suite sets `network: allow`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any


NOBODY = 65534
_OUTPUT_CAP = 64 * 1024

HARNESS = r'''
import json, os, sys
nonce = os.environ.pop("ROUTEOPT_NONCE")
out = os.fdopen(os.dup(1), "w")
harness_pid = os.getpid()
def emit(obj):
    if os.getpid() == harness_pid:
        out.write("\n" + nonce + json.dumps(obj) + "\n"); out.flush()
    os._exit(0)
def why(exc):
    return (type(exc).__name__ + (": " + str(exc) if str(exc) else ""))[:300]
with open("../solution.py") as fh:
    src = fh.read()
with open("../tests.json") as fh:
    tests = json.load(fh)
ns = {"__name__": "solution"}
try:
    exec(compile(src, "solution.py", "exec"), ns)
except BaseException as exc:
    emit({"solution_error": why(exc), "results": []})
results = []
for i, test in enumerate(tests):
    try:
        exec(compile(test, "test_%d" % i, "exec"), ns)
        results.append([True, None])
    except BaseException as exc:
        results.append([False, why(exc)])
emit({"solution_error": None, "results": results})
'''


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be had on this machine; the message says why."""


@dataclass
class RunResult:
    returncode: int | None
    timed_out: bool
    stdout: str
    stderr: str
    wall_s: float


@dataclass(frozen=True)
class Isolation:
    """How programs run here: command prefix, interpreter, and whether they run as `nobody`."""

    prefix: tuple[str, ...]
    python: str
    unprivileged: bool


_PROBE = "import json, unittest, urllib.request, collections, math"


def _try(cmd: list[str]) -> str | None:
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=30, text=True)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]


def _pythons() -> list[str]:
    system = [p for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)]
    found = [sys.executable, *system]
    return list(dict.fromkeys(found))


def _prefixes(network: bool) -> list[list[str]]:
    ns = ["--pid", "--fork", "--kill-child"] if network else ["--net", "--pid", "--fork", "--kill-child"]
    out = [["unshare", *ns], ["unshare", "--map-root-user", *ns]] if shutil.which("unshare") else []
    return out + ([[]] if network else [])


@functools.lru_cache(maxsize=None)
def isolation(network: bool = False) -> Isolation | str:
    """The strongest isolation this machine allows, or why there is none (probed once).

    Prefers new network (unless allowed) and PID namespaces, then `setpriv` to `nobody` with
    an interpreter that `nobody` can run, so RLIMIT_NPROC binds and files stay out of reach.
    """
    reasons = [] if shutil.which("unshare") else ["`unshare` (util-linux) is not installed"]
    for prefix in _prefixes(network):
        drops: list[list[str]] = [[]]
        if os.geteuid() == 0 and "--map-root-user" not in prefix and shutil.which("setpriv"):
            drops.insert(0, ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--"])
        for drop in drops:
            for py in _pythons():
                why = _try(prefix + drop + [py, "-I", "-c", _PROBE])
                if why is None:
                    return Isolation(tuple(prefix + drop), py, bool(drop) or os.geteuid() != 0)
                reasons.append(f"`{' '.join(prefix + drop + [py])}`: {why}")
    return "no way to start an isolated interpreter: " + "; ".join(reasons[:4])


_FSIZE = 16 * 1024 * 1024


def _limit_values(memory_mb: int, cpu_s: int, max_procs: int) -> dict[int, int]:
    return {
        resource.RLIMIT_NPROC: max_procs, resource.RLIMIT_AS: memory_mb * 1024 * 1024,
        resource.RLIMIT_CPU: cpu_s, resource.RLIMIT_FSIZE: _FSIZE, resource.RLIMIT_CORE: 0,
        resource.RLIMIT_NOFILE: 256,
    }


def _limits(memory_mb: int, cpu_s: int, max_procs: int) -> None:
    """preexec_fn fallback where `prlimit` is missing (preexec_fn is unsafe with threads)."""
    for which, value in _limit_values(memory_mb, cpu_s, max_procs).items():
        resource.setrlimit(which, (value, value))


def _prlimit(memory_mb: int, cpu_s: int, max_procs: int) -> list[str] | None:
    """`prlimit` sets the rlimits then execs the sandbox: no Python runs between fork and exec."""
    if shutil.which("prlimit") is None:
        return None
    v = _limit_values(memory_mb, cpu_s, max_procs)
    return [
        "prlimit", f"--nproc={v[resource.RLIMIT_NPROC]}", f"--as={v[resource.RLIMIT_AS]}",
        f"--cpu={cpu_s}", f"--fsize={_FSIZE}", "--core=0", f"--nofile={v[resource.RLIMIT_NOFILE]}", "--",
    ]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _tail(path: Path) -> str:
    with path.open("rb") as fh:
        return fh.read(_OUTPUT_CAP).decode("utf-8", "replace")


def run_python_tests(
    code: str,
    tests: list[str],
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    network: bool = False,
    max_procs: int = 64,
) -> tuple[RunResult, dict[str, Any] | None]:
    """Run `code` then each test in a fresh sandboxed interpreter; (process result, report)."""
    iso = isolation(network)
    if isinstance(iso, str):
        how = "" if network else "; set `network: allow` to run without network isolation"
        raise SandboxUnavailable(iso + how)
    nonce = secrets.token_hex(16)
    tmp = Path(tempfile.mkdtemp(prefix="routeopt-sandbox-"))
    try:
        work = tmp / "work"
        work.mkdir()
        (tmp / "solution.py").write_text(code)
        (tmp / "tests.json").write_text(json.dumps(tests))
        (tmp / "harness.py").write_text(HARNESS)
        for p in (tmp, tmp / "solution.py", tmp / "tests.json", tmp / "harness.py"):
            p.chmod(0o755 if p.is_dir() else 0o644)
        work.chmod(0o777)
        env = {
            "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "PYTHONHASHSEED": "0",
            "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(work), "ROUTEOPT_NONCE": nonce,
        }
        cmd = [*iso.prefix, iso.python, "-I", str(tmp / "harness.py")]
        result = _run(cmd, work, env, tmp, timeout_s, memory_mb, max_procs)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    report = None
    for line in reversed(result.stdout.splitlines()):
        if line.startswith(nonce):
            report = json.loads(line[len(nonce):])
            break
    return result, report


def _run(
    cmd: list[str], cwd: Path, env: dict[str, str], tmp: Path, timeout_s: float, memory_mb: int,
    max_procs: int,
) -> RunResult:
    out_path, err_path = tmp / "stdout", tmp / "stderr"
    cpu_s = math.ceil(timeout_s) + 1
    limit = _prlimit(memory_mb, cpu_s, max_procs)
    preexec = None if limit else functools.partial(_limits, memory_mb, cpu_s, max_procs)
    started = time.monotonic()
    with out_path.open("wb") as out, err_path.open("wb") as err:
        proc = subprocess.Popen(
            (limit or []) + cmd, cwd=cwd, env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, preexec_fn=preexec,
        )
        timed_out = False
        try:
            proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
        _kill_group(proc)
        proc.wait()
    return RunResult(proc.returncode, timed_out, _tail(out_path), _tail(err_path), time.monotonic() - started)
