"""`routeopt eval` as cron or Kubernetes runs it, in a real subprocess against the wire-protocol
fake LLM server: killed with SIGKILL mid-evaluation it leaves no process behind and the run
resumes with every item once; SIGTERM and a terminal's Ctrl-C stop it promptly and cleanly.

"Left behind" is checked two ways, by /proc and never by process name: every descendant of the
CLI seen while it ran (pid and start time, so a reused pid is not mistaken for it), and every
process that carries this test's marker in its environment (which catches a child that was
re-parented or double-forked before the snapshot).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import duckdb
import pytest

from tests import REPO
from tests.fake_llm import FakeLLM, write_arithmetic_suite, write_two_model_config

pytestmark = pytest.mark.slow
ITEMS = 200
CANDIDATES = ("strong", "weak")
MARK = "ROUTEOPT_TEST_MARK"


# --- processes, read from /proc ----------------------------------------------------------------


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, start time in clock ticks) of a live process, None when it is gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except (FileNotFoundError, ProcessLookupError):
        return None
    fields = raw[raw.rindex(")") + 2 :].split()  # after "pid (comm) "
    if fields[0] == "Z":  # a zombie has ended; only its entry waits to be reaped
        return None
    return int(fields[1]), int(fields[19])


def descendants(root: int) -> set[tuple[int, int]]:
    """(pid, start time) of every live process below `root`."""
    children: dict[int, list[tuple[int, int]]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (st := _stat(int(entry))) is not None:
            children.setdefault(st[0], []).append((int(entry), st[1]))
    found, todo = set(), [root]
    while todo:
        for kid in children.get(todo.pop(), []):
            found.add(kid)
            todo.append(kid[0])
    return found


def alive(procs: set[tuple[int, int]]) -> set[tuple[int, int]]:
    return {(pid, start) for pid, start in procs if (st := _stat(pid)) and st[1] == start}


def marked(mark: str) -> set[int]:
    """Live processes whose environment carries `mark`."""
    needle = f"{MARK}={mark}".encode()
    out = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            env = Path(f"/proc/{entry}/environ").read_bytes()
        except OSError:
            continue
        if needle in env.split(b"\0") and _stat(int(entry)) is not None:
            out.add(int(entry))
    return out


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "?"


def assert_nothing_left(seen: set[tuple[int, int]], mark: str, within_s: float = 5.0) -> None:
    deadline = time.monotonic() + within_s
    while (left := alive(seen)) or marked(mark):
        if time.monotonic() > deadline:
            pids = sorted({pid for pid, _ in left} | marked(mark))
            report = "; ".join(f"{pid}: {_cmdline(pid)}" for pid in pids)
            for pid in pids:  # leave the machine clean for the next test, then fail
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            pytest.fail(f"left behind: {report}")
        time.sleep(0.1)


# --- the CLI -------------------------------------------------------------------------------------


@pytest.fixture
def mark() -> str:
    """This test's environment marker; whatever still carries it afterwards is killed, so a
    failing test does not leave its processes to the next."""
    value = uuid.uuid4().hex
    yield value
    for pid in marked(value):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


@pytest.fixture
def project(tmp_path: Path):
    """A config with two API candidates on one slow fake server, and a 200-item suite."""
    with FakeLLM(first_token_delay_s=0.25) as server:
        write_arithmetic_suite(tmp_path / "suites", ITEMS)
        config = write_two_model_config(
            tmp_path / "routeopt.yaml", server, server, key_envs=("LC_STRONG_KEY", "LC_WEAK_KEY")
        )
        yield server, config, tmp_path / "out" / "routeopt.duckdb"


def start_cli(
    config: Path,
    run_id: str,
    mark: str,
    env: dict[str, str] | None = None,
    resume: bool = False,
    **popen: Any,
) -> subprocess.Popen:
    env = {**{k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}, **(env or {})}
    env.update(
        PYTHONPATH=str(REPO),
        LC_STRONG_KEY="sk-lc-strong",
        LC_WEAK_KEY="sk-lc-weak",
        PREFECT_LOGGING_LEVEL="WARNING",
        **{MARK: mark},
    )
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "routeopt.flows.cli",
            "eval",
            "--config",
            str(config),
            "--resume" if resume else "--run-id",
            run_id,
            "--no-progress",
        ],
        cwd=REPO,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **popen,
    )


def mid_evaluation(proc: subprocess.Popen, server: FakeLLM, calls: int = 60) -> set[tuple[int, int]]:
    """Wait until the CLI has made `calls` model calls; return its process tree at that moment."""
    deadline = time.monotonic() + 240
    while len(server.requests) < calls:
        if proc.poll() is not None or time.monotonic() > deadline:
            out = proc.communicate(timeout=30)[0] if proc.poll() is not None else ""
            pytest.fail(f"the CLI never got to evaluating (status {proc.poll()}):\n{out[-3000:]}")
        time.sleep(0.05)
    tree = descendants(proc.pid)
    assert tree, "the CLI started no process: nothing here tests the Prefect server's lifetime"
    return tree


def stored(db: Path, run_id: str) -> list[tuple[str, str]]:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute("SELECT candidate, item_id FROM outcomes WHERE run_id = ?", [run_id]).fetchall()


def prompts_of(rows, db: Path) -> set[str]:
    """The user messages of stored items, to match against what the fake server was sent."""
    items = {item for _, item in rows}
    with duckdb.connect(str(db), read_only=True) as con:
        return {p for i, p in con.execute("SELECT item_id, prompt FROM items").fetchall() if i in items}


# --- the tests -----------------------------------------------------------------------------------


def test_sigkill_mid_evaluation_leaves_nothing_and_the_run_resumes(project, mark):
    server, config, db = project
    run_id = "run-killed"
    proc = start_cli(config, run_id, mark)
    tree = mid_evaluation(proc, server)
    proc.kill()
    proc.wait(30)
    assert_nothing_left(tree, mark)

    before = stored(db, run_id)
    assert 0 < len(before) < ITEMS * len(CANDIDATES), "the kill did not land mid-evaluation"
    done_prompts = prompts_of(before, db)
    mark_sent = len(server.requests)

    resumed = start_cli(config, run_id, mark, resume=True)
    out = resumed.communicate(timeout=600)[0]
    assert resumed.returncode == 0, out[-4000:]
    assert_nothing_left(set(), mark)  # and a run that ends normally stops its server too

    rows = stored(db, run_id)
    assert len(rows) == len(set(rows)) == ITEMS * len(CANDIDATES), "an item is missing or doubled"
    assert {c for c, _ in rows} == set(CANDIDATES)
    again = [
        r
        for r in server.requests[mark_sent:]
        if any(p in str(r.body["messages"][-1]["content"]) for p in done_prompts)
    ]
    assert not again, f"the resumed run called {len(again)} items that were already stored"


@pytest.mark.parametrize("how", ["sigterm", "ctrl-c"])
def test_sigterm_or_ctrl_c_stops_promptly_and_cleanly(project, mark, how):
    from routeopt.flows.commands.pipeline import SHUTDOWN_GRACE_S

    server, config, db = project
    run_id = f"run-{how}"
    # A terminal's Ctrl-C signals the whole foreground process group: the CLI leads its own.
    proc = start_cli(config, run_id, mark, start_new_session=True)
    tree = mid_evaluation(proc, server)
    sent = time.monotonic()
    if how == "sigterm":
        proc.send_signal(signal.SIGTERM)
    else:
        os.killpg(proc.pid, signal.SIGINT)
    out = proc.communicate(timeout=SHUTDOWN_GRACE_S + 60)[0]
    took = time.monotonic() - sent
    signum = signal.SIGTERM if how == "sigterm" else signal.SIGINT
    assert proc.returncode == 128 + signum, out[-4000:]
    assert took < SHUTDOWN_GRACE_S + 10, f"took {took:.1f} s to stop"
    assert f"Resume with: routeopt eval --resume {run_id} --config {config.resolve()}\n" in out, out[-4000:]
    assert "Traceback" not in out, out[-4000:]
    assert_nothing_left(tree, mark)
    with duckdb.connect(str(db), read_only=True) as con:
        status = con.execute("SELECT status FROM runs WHERE run_id = ?", [run_id]).fetchone()
    assert status == ("interrupted",)
    assert 0 < len(stored(db, run_id)) < ITEMS * len(CANDIDATES)


def test_two_runs_at_once_on_a_fresh_prefect_home_both_finish(tmp_path: Path, mark):
    """Concurrent cron jobs: each starts its own server (ports from the kernel), and the second
    waits for the first to migrate the shared Prefect database instead of breaking it."""
    home = tmp_path / "prefect-home"
    with FakeLLM() as server:
        runs = []
        for n in range(2):
            write_arithmetic_suite(tmp_path / f"p{n}" / "suites", 20)
            config = write_two_model_config(
                tmp_path / f"p{n}" / "routeopt.yaml",
                server,
                server,
                key_envs=("LC_STRONG_KEY", "LC_WEAK_KEY"),
            )
            runs.append(start_cli(config, f"run-{n}", mark, env={"PREFECT_HOME": str(home)}))
        outs = [proc.communicate(timeout=600)[0] for proc in runs]
    assert [proc.returncode for proc in runs] == [0, 0], "\n".join(o[-3000:] for o in outs)
    for n in range(2):
        assert len(stored(tmp_path / f"p{n}" / "out" / "routeopt.duckdb", f"run-{n}")) == 40
    assert_nothing_left(set(), mark)
