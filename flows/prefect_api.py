"""The Prefect API that `routeopt run`, `eval` and `drift --alert` report to, started so that
nothing outlives the command.

With an API configured (`PREFECT_API_URL`: a `prefect server start`, Prefect Cloud, a worker's
environment) routeopt starts nothing. Without one, Prefect would start a temporary server as a
child process on first use; killed with SIGKILL (the OOM killer, a scheduler's timeout), the CLI
left that child behind, re-parented to init with ~200 MB and a port, one more per crash. So the
CLI starts that server itself (`launch`):

- tied to this process: the child asks the kernel for SIGKILL when its parent dies
  (PR_SET_PDEATHSIG, Linux), and a thread in it also exits when its parent pid changes (every
  platform, and a parent that died before the request);
- on a socket this process binds to port 0 and hands over, so concurrent runs never race for a
  port (Prefect picks one at random in 8000-8999), and one start at a time per Prefect home, so
  concurrent runs never migrate its database at once;
- in a session of its own, so a Ctrl-C in a terminal (SIGINT to the whole foreground group)
  leaves it up while the CLI reports the run's final state, then stops it;
- as soon as the config is valid, so its start (imports, database migrations: seconds) overlaps
  the CLI's own start-up instead of preceding the flow.

Run as a script (`python -P prefect_api.py PARENT_PID FD KERNEL`), this file is the child.
"""

from __future__ import annotations

import atexit
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

# What Prefect's own temporary server sets: no UI, the services of an ephemeral server only.
_SERVER_ENV = {"PREFECT_UI_ENABLED": "0", "PREFECT__SERVER_EPHEMERAL": "1", "PREFECT__SERVER_FINAL": "1"}
_PR_SET_PDEATHSIG = 1
STOP_TIMEOUT_S = 5.0
MIN_STARTUP_TIMEOUT_S = 90.0


class ServerError(RuntimeError):
    """The temporary server could not be started; the message says what to do."""


class LocalServer:
    """A temporary Prefect server in a child process that dies with this one."""

    def __init__(self, proc: subprocess.Popen[bytes], port: int, start_lock: int | None = None):
        self.proc = proc
        self.port = port
        self._start_lock = start_lock  # held until the server answers (see `_lock_start`)

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def wait_ready(self, timeout_s: float) -> None:
        """Block until the server answers its health check; a clear error if it never does."""
        try:
            self._wait(timeout_s)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        if self._start_lock is not None:
            os.close(self._start_lock)  # closing the file releases the lock
            self._start_lock = None

    def _wait(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            if self.proc.poll() is not None:
                raise ServerError(
                    f"the temporary Prefect server exited with status {self.proc.returncode} "
                    "before answering (its errors are printed above); set PREFECT_API_URL to "
                    "use a running server instead"
                )
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as resp:
                    if resp.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise ServerError(
                    f"the temporary Prefect server did not answer within {timeout_s:.0f} s; raise "
                    "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS or set PREFECT_API_URL to "
                    "a running server"
                )
            time.sleep(0.05)

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; safe to call twice (atexit calls it)."""
        self._unlock()
        if self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def api_configured() -> bool:
    """True when Prefect will report to a configured API (or may not start a local one)."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_ALLOW_EPHEMERAL_MODE

    return bool(PREFECT_API_URL.value()) or not PREFECT_SERVER_ALLOW_EPHEMERAL_MODE.value()


def startup_timeout_s() -> float:
    """Prefect's setting, but at least MIN_STARTUP_TIMEOUT_S: its 20 s default fails nightlies
    on a busy machine, where the start has been seen to take 18 s."""
    from prefect.settings import PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS

    return max(float(PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS.value()), MIN_STARTUP_TIMEOUT_S)


def _lock_start() -> int:
    """Wait for, then hold, the right to start a server on this Prefect home. Each start
    migrates the home's database, and two runs migrating it at once break it (concurrent cron
    jobs on a fresh home did). The kernel drops the lock if this process dies."""
    import fcntl

    from prefect.settings import PREFECT_HOME

    home = Path(PREFECT_HOME.value()).expanduser()
    home.mkdir(parents=True, exist_ok=True)
    fd = os.open(home / "routeopt-server-start.lock", os.O_RDWR | os.O_CREAT, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def launch() -> LocalServer | None:
    """Start the temporary server (without waiting for it); None when an API is configured or
    the platform cannot tie a child to its parent (then Prefect starts its own, as before)."""
    if api_configured() or os.name != "posix":
        return None
    from prefect.settings import get_current_settings

    env = {**os.environ, **get_current_settings().to_environment_variables(exclude_unset=True), **_SERVER_ENV}
    # The kernel's parent-death signal follows the thread that started the child: ask for it
    # only from the main thread, which lives as long as the process.
    kernel = threading.current_thread() is threading.main_thread()
    start_lock = _lock_start()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(128)
        # This file as a script, with -P: nothing on the path from the working directory (a
        # user's own `flows/` folder, say); the child imports only the standard library,
        # uvicorn and prefect.
        proc = subprocess.Popen(
            [sys.executable, "-P", __file__, str(os.getpid()), str(sock.fileno()), str(int(kernel))],
            env=env,
            pass_fds=(sock.fileno(),),
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        server = LocalServer(proc, sock.getsockname()[1], start_lock)
    # Registered before Prefect's log and event workers register their drains, so (atexit runs
    # last-in first-out) the server stops only after they have delivered what they hold.
    atexit.register(server.stop)
    return server


@contextmanager
def serving(server: LocalServer | None) -> Iterator[str | None]:
    """Point this process's Prefect client at `server` once it answers; as is without one."""
    if server is None:
        yield None
        return
    from prefect.settings import PREFECT_API_URL, PREFECT_UI_URL, temporary_settings

    server.wait_ready(startup_timeout_s())
    # No UI is served: an empty UI URL keeps Prefect from logging dead "View at" links.
    with temporary_settings(updates={PREFECT_API_URL: server.api_url, PREFECT_UI_URL: ""}):
        yield server.api_url


# --- the child ---------------------------------------------------------------------------------


def _tie_to(parent: int, kernel: bool) -> None:
    """Die with `parent`, however it ends: the kernel's word on Linux, a watcher everywhere."""
    if kernel and sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != parent:  # it died before the request above
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="routeopt-parent-watch", daemon=True).start()


def _serve(parent: int, fd: int, kernel: bool) -> None:
    """Serve Prefect's API app on the listening socket `fd` until told to stop."""
    _tie_to(parent, kernel)
    import uvicorn

    sock = socket.socket(fileno=fd)
    config = uvicorn.Config(
        "prefect.server.api.server:create_app", factory=True, log_level="error", lifespan="on"
    )
    uvicorn.Server(config).run(sockets=[sock])


if __name__ == "__main__":
    _serve(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1")
