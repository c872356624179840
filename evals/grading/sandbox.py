"""Run a model's program against unit tests, isolated, with a verdict the program cannot forge.

Each item runs as two processes that each get their own bubblewrap sandbox (`bwrap`, Debian's
`bubblewrap`): the *program* (the model's code, answering calls) and the *checker* (the unit tests,
calling the program through proxies and comparing its answers itself); `routeopt.evals.grading.harness`
is the code of both. They share one socket; the checker alone holds the file the verdict is
written to, and the program's sandbox cannot see the checker's process, files or descriptors.

Every sandbox gets: new user, PID, IPC, UTS and network namespaces (the network one has only its own
loopback, unless the suite sets `network: allow`); a read-only /usr and interpreter and nothing else
of the host's file system (not the repository, $HOME, the DuckDB file, the registry or keys); a
fresh size-limited tmpfs at /tmp as the only writable place (no host /tmp, no /dev/shm), gone when
the sandbox ends; uid 65534 inside with no capabilities and no further user namespaces; rlimits
on address space, CPU seconds, processes, file size (so output too) and open files; a wall-clock
timeout after which both process trees are killed. A root runner drops to uid 65534 before
starting bwrap, so the guarantees are those of an unprivileged runner in both cases.
"""

from __future__ import annotations

import functools
import json
import math
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

NOBODY = 65534
OUTPUT_LIMIT = 16 * 1024 * 1024  # RLIMIT_FSIZE: the program's output and any file it writes
SCRATCH_LIMIT = 64 * 1024 * 1024  # the size of the sandbox's /tmp
_TAIL = 64 * 1024
_CHECKER_PROCS = 16
HARNESS = Path(__file__).with_name("harness.py")
OPT_OUT = "or set `sandbox: none` on the code grader to run programs unisolated (only programs you trust)"


class SandboxUnavailable(RuntimeError):
    """The requested isolation cannot be had on this machine; the message says why and what to do."""


@dataclass(frozen=True)
class Isolation:
    """How programs run here: the interpreter, and the bubblewrap profile (None: unisolated)."""

    python: str
    bwrap: tuple[str, ...] | None
    run_as: int | None  # the uid a root runner drops to before starting bwrap
    description: str


def _interpreters() -> list[tuple[str, str | None]]:
    """(interpreter, prefix to bind read-only or None when it lies under /usr), best first: the
    runner's own Python, then the system's."""
    own = os.path.realpath(sys.executable)
    prefix = os.path.realpath(sys.base_prefix)
    found = [(own, None if prefix == "/usr" or prefix.startswith("/usr/") else prefix)]
    found += [(p, None) for p in ("/usr/bin/python3", "/usr/local/bin/python3") if os.path.exists(p)]
    return list(dict.fromkeys(found))


def _profile(prefix: str | None, network: bool, nested_userns: bool) -> list[str]:
    args = [
        shutil.which("bwrap") or "bwrap",
        "--unshare-user",
        "--unshare-pid",
        "--unshare-ipc",
        "--unshare-uts",
        "--unshare-cgroup-try",
        *([] if network else ["--unshare-net"]),
        *([] if nested_userns else ["--disable-userns"]),
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--hostname",
        "sandbox",
        "--ro-bind",
        "/usr",
        "/usr",
    ]
    for top in ("bin", "lib", "lib32", "lib64", "sbin"):
        host = f"/{top}"
        if os.path.islink(host):
            args += ["--symlink", os.readlink(host), host]
        elif os.path.isdir(host):
            args += ["--ro-bind", host, host]
    if prefix:
        args += ["--ro-bind", prefix, prefix]
    for etc in ("/etc/ld.so.cache", "/etc/localtime"):
        args += ["--ro-bind-try", etc, etc]
    args += [
        "--proc",
        "/proc",
        "--dev",
        "/dev",
        "--size",
        str(SCRATCH_LIMIT),
        "--tmpfs",
        "/tmp",
        "--remount-ro",
        "/dev",
        "--remount-ro",
        "/",
        "--chdir",
        "/tmp",
    ]
    for key, value in _env("/tmp").items():
        args += ["--setenv", key, value]
    return args + ["--"]


def _env(home: str) -> dict[str, str]:
    return {
        "PATH": "/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "PYTHONHASHSEED": "0",
        "PYTHONDONTWRITEBYTECODE": "1",
        "HOME": home,
        "TMPDIR": home,
    }


def _try(cmd: list[str], run_as: int | None) -> str | None:
    """None when `cmd` runs, else the last line it printed (why it did not)."""
    try:
        proc = subprocess.run(cmd, capture_output=True, timeout=30, text=True, cwd="/", **_drop(run_as))
    except (OSError, subprocess.TimeoutExpired) as exc:
        return str(exc)
    if proc.returncode == 0:
        return None
    return (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]


def _drop(run_as: int | None) -> dict:
    return {} if run_as is None else {"user": run_as, "group": run_as, "extra_groups": []}


@functools.lru_cache(maxsize=None)
def isolation(network: bool = False) -> Isolation | str:
    """The bubblewrap sandbox this machine allows, or one sentence saying why there is none and
    what to do (probed once per process, by starting it)."""
    if shutil.which("bwrap") is None:
        return (
            "bubblewrap (`bwrap`) is not installed: install it (`apt-get install bubblewrap` on "
            f"Debian/Ubuntu, `dnf install bubblewrap` on Fedora), {OPT_OUT}"
        )
    run_as = NOBODY if os.geteuid() == 0 else None
    who = f"uid {run_as} (dropped from root)" if run_as is not None else f"uid {os.geteuid()}"
    reasons: list[str] = []
    for nested in (False, True):  # bwrap < 0.8 lacks --disable-userns
        for python, prefix in _interpreters():
            profile = _profile(prefix, network, nested)
            why = _try([*profile, python, "-I", "-c", _harness_source(), "probe"], run_as)
            if why is None:
                net = "host network" if network else "no network"
                return Isolation(python, tuple(profile), run_as, f"bubblewrap as {who}, {python}, {net}")
            reasons.append(why)
    return (
        f"bubblewrap cannot start a sandbox as {who} ({reasons[0]}); if user namespaces are "
        "disabled for this user, enable them (sysctls kernel.unprivileged_userns_clone, "
        f"user.max_user_namespaces, kernel.apparmor_restrict_unprivileged_userns), {OPT_OUT}"
    )


def unisolated() -> Isolation:
    """`sandbox: none`: plain child processes with the same rlimits and protocol, nothing more."""
    return Isolation(sys.executable, None, None, f"unisolated, {sys.executable}")


@dataclass
class Verdict:
    """What the checker reported, and how the processes ended."""

    tests: list[str]
    results: dict[int, tuple[bool, str | None]] = field(default_factory=dict)
    load_error: str | None = None
    done: bool = False
    timed_out: bool = False
    timeout_s: float = 0.0
    program_ended: str | None = None  # how the program ended by itself, before the checker did
    checker_output: str = ""
    program_output: str = ""

    def lost_program(self) -> bool:
        """Whether the checker lost the program (it exited, was killed or broke the protocol)."""
        whys = [self.load_error or ""] + [why or "" for _, why in self.results.values()]
        return any(w.startswith("the program") for w in whys)

    @property
    def score(self) -> float:
        return 0.0 if self.load_error else sum(ok for ok, _ in self.results.values()) / len(self.tests)

    @property
    def passed(self) -> bool:
        complete = self.done and not self.load_error and len(self.results) == len(self.tests)
        return complete and self.score == 1.0

    def reason(self) -> str | None:
        """Why it did not pass, in one line for the `reason` column (None when it passed)."""
        if self.passed:
            return None
        ended = f"; the program {self.program_ended}" if self.program_ended else ""
        if self.timed_out:
            done = sum(ok for ok, _ in self.results.values())
            return f"timed out after {self.timeout_s:g}s; the process group was killed" + (
                f" ({done}/{len(self.tests)} tests had passed)" if done else ""
            )
        if self.load_error and self.program_ended and self.load_error.startswith("the program exited"):
            said = self.program_output.strip().splitlines()[-1:]
            return f"the program {self.program_ended} before it finished loading" + "".join(
                f": {line[:200]}" for line in said
            )
        if self.load_error:
            return self.load_error + ended
        if not self.done and not self.results:
            tail = self.checker_output.strip().splitlines()[-1:] or ["no output"]
            return f"no test report: {tail[0][:300]}{ended}"
        failed = [
            f"test {i} `{_short(t)}`: {self.results.get(i, (False, 'no result'))[1]}"
            for i, t in enumerate(self.tests)
            if not self.results.get(i, (False,))[0]
        ]
        return (f"{len(failed)}/{len(self.tests)} tests failed: " + "; ".join(failed))[:500] + ended


def _short(test: str) -> str:
    line = " ".join(test.split())
    return line if len(line) <= 60 else line[:57] + "..."


def run_tests(
    code: str,
    tests: list[str],
    *,
    timeout_s: float = 10.0,
    memory_mb: int = 512,
    network: bool = False,
    sandbox: bool = True,
    max_procs: int = 16,
) -> Verdict:
    """Run `code` in one sandbox and `tests` against it in another; the checker's verdict."""
    iso = isolation(network) if sandbox else unisolated()
    if isinstance(iso, str):
        raise SandboxUnavailable(iso)
    cpu_s = math.ceil(timeout_s) + 1
    run = Verdict(list(tests), timeout_s=timeout_s)
    with ExitStack() as stack:
        spec, report, checker_out, program_out = (
            stack.enter_context(tempfile.TemporaryFile()) for _ in range(4)
        )
        checker_limits = {
            "memory_mb": max(memory_mb, 512),
            "cpu_s": cpu_s,
            "max_procs": _CHECKER_PROCS,
            "fsize": OUTPUT_LIMIT,
        }
        spec.write(json.dumps({"code": code, "tests": tests, "limits": checker_limits}).encode())
        spec.seek(0)
        scratch = None if iso.bwrap else stack.enter_context(tempfile.TemporaryDirectory(prefix="routeopt-"))
        procs = _start(
            iso, scratch, spec, report, checker_out, program_out, [memory_mb, cpu_s, max_procs, OUTPUT_LIMIT]
        )
        try:
            run.timed_out = not _wait(procs[0], timeout_s)
        finally:
            _read_report(run, report)
            if not run.timed_out and run.lost_program():
                run.program_ended = _how_it_ended(procs[1], iso)
            for proc in procs:
                _kill_group(proc)
                proc.wait()
        run.checker_output, run.program_output = _tail(checker_out), _tail(program_out)
    return run


def _start(
    iso: Isolation,
    scratch: str | None,
    spec: IO[bytes],
    report: IO[bytes],
    checker_out: IO[bytes],
    program_out: IO[bytes],
    limits: list[int],
) -> list[subprocess.Popen]:
    """Start the checker and the program, joined by a socket pair only they hold."""
    ours, theirs = socket.socketpair()
    source = _harness_source()
    try:
        checker = _spawn(
            iso,
            scratch,
            [source, "checker", str(ours.fileno()), str(report.fileno())],
            spec,
            checker_out,
            (ours.fileno(), report.fileno()),
        )
        try:
            program = _spawn(
                iso,
                scratch,
                [source, "program", str(theirs.fileno()), *map(str, limits)],
                subprocess.DEVNULL,
                program_out,
                (theirs.fileno(),),
            )
        except BaseException:
            _kill_group(checker)
            checker.wait()
            raise
    finally:
        ours.close()  # the children hold their ends; the grader holds none, so EOF reaches them
        theirs.close()
    return [checker, program]


@functools.lru_cache(maxsize=1)
def _harness_source() -> str:
    return HARNESS.read_text()


def _spawn(
    iso: Isolation,
    scratch: str | None,
    harness_args: list[str],
    stdin: IO[bytes] | int,
    out: IO[bytes],
    fds: tuple[int, ...],
) -> subprocess.Popen:
    python = [iso.python, "-I", "-c", *harness_args]
    if iso.bwrap:
        return subprocess.Popen(
            [*iso.bwrap, *python],
            stdin=stdin,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=fds,
            start_new_session=True,
            cwd="/",
            env={},
            **_drop(iso.run_as),
        )
    return subprocess.Popen(
        python,
        stdin=stdin,
        stdout=out,
        stderr=subprocess.STDOUT,
        pass_fds=fds,
        start_new_session=True,
        cwd=scratch,
        env=_env(scratch or "/tmp"),
    )


_SIGNALS = {signal.SIGXCPU: "CPU time limit", signal.SIGXFSZ: f"output or file over {OUTPUT_LIMIT >> 20} MiB"}


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether `proc` ended within `timeout_s`; waits on a pidfd (Popen.wait with a timeout polls
    with sleeps of up to 50 ms, a large share of a 30 ms item)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):
        try:
            proc.wait(timeout=timeout_s)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    return proc.poll() is not None


def _how_it_ended(program: subprocess.Popen, iso: Isolation) -> str | None:
    """How the program ended, once the checker found it gone (it may still be exiting)."""
    if not _wait(program, 1.0):
        return None  # it closed the socket but lives on
    code = program.returncode
    sig = -code if code < 0 else (code - 128 if iso.bwrap and code > 128 else 0)
    if sig:
        name = signal.Signals(sig).name if sig in signal.valid_signals() else str(sig)
        return f"was killed by {name}" + (f" ({_SIGNALS[sig]})" if sig in _SIGNALS else "")
    return f"exited with code {code}"


def _read_report(run: Verdict, report: IO[bytes]) -> None:
    report.seek(0)
    for line in report.read(4 * 1024 * 1024).splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if "load_error" in event:
            run.load_error = str(event["load_error"])
        elif "test" in event and 0 <= int(event["test"]) < len(run.tests):
            run.results[int(event["test"])] = (event["ok"] is True, event.get("why"))
        elif event.get("done") is True:
            run.done = True
    run.done = run.done or run.load_error is not None


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _tail(fh: IO[bytes]) -> str:
    size = fh.seek(0, os.SEEK_END)
    fh.seek(max(0, size - _TAIL))
    return fh.read().decode("utf-8", "replace")
