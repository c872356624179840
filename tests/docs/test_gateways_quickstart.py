"""docs/gateways.md's quickstart, run as written in an empty folder on the packaged demo.

The page marks what a reader runs: `<!-- test: run -->` before a shell block (the blocks run in
order, in one bash session, so a gateway started in the background by one block is still there
for the next) and `<!-- test: file NAME -->` before a block the reader saves as NAME. The
JavaScript package is made importable as the page's JavaScript section installs it.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from pathlib import Path

import pytest

from tests import REPO, documented_ports_lock

PAGE = REPO / "docs" / "gateways.md"
_MARKED = re.compile(r"^<!-- test: (run|file ([\w.\-]+)) -->\n```(\w+)\n(.*?)^```$", re.S | re.M)


def marked_blocks(text: str) -> list[tuple[str, str | None, str]]:
    """(kind, file name or None, code) of every marked block, in page order."""
    return [(m.group(1).split()[0], m.group(2), m.group(4)) for m in _MARKED.finditer(text)]


def quickstart_script(text: str) -> tuple[dict[str, str], str]:
    """The files to save and the bash script made of the run blocks, in order."""
    files, runs = {}, []
    for kind, name, code in marked_blocks(text):
        if kind == "file":
            files[name] = code
        else:
            runs.append(code)
    script = "set -euo pipefail\ntrap 'kill $(jobs -p) 2>/dev/null || true' EXIT\n" + "\n".join(runs)
    return files, script


def test_the_quickstart_marks_every_runtime_and_the_channel_moves() -> None:
    files, script = quickstart_script(PAGE.read_text(encoding="utf-8"))
    assert set(files) == {"gateway.py", "gateway.mjs"}
    for command in (
        "routeopt run",
        "routeopt gateway serve",
        "routeopt registry serve",
        "routeopt train",
        "routeopt policies promote 2",
        "python gateway.py 2",
        "node gateway.mjs 2",
    ):
        assert command in script, command
    assert script.index("routeopt train") < script.index("promote 2") < script.index("gateway.py 2")


@pytest.mark.slow
def test_the_quickstart_runs_as_written(tmp_path: Path, prefect_api: str) -> None:
    from tests.gateways.node import package

    js = package()  # skips where node is missing; builds dist/ once
    project = tmp_path / "project"
    (project / "node_modules" / "@routeopt").mkdir(parents=True)
    (project / "node_modules" / "@routeopt" / "gateway").symlink_to(js)
    files, script = quickstart_script(PAGE.read_text(encoding="utf-8"))
    for name, code in files.items():
        (project / name).write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "ROUTEOPT_"))}
    env |= {
        "PREFECT_HOME": str(tmp_path / "prefect"),
        # the run reports to the session's Prefect server: the CLI's own temporary server is
        # the wheel test's and the CLI lifecycle tests' business, and costs seconds of CPU
        "PREFECT_API_URL": prefect_api,
        "PYTHONPATH": str(REPO),
        "PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS": "180",
        "ROUTEOPT_STATE_DIR": str(tmp_path / "state"),
        "COLUMNS": "120",
    }
    guard = documented_ports_lock()  # the page's commands listen on 8600 and 8700
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=project,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        out, _ = proc.communicate(timeout=1200)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"the quickstart did not finish in 20 minutes:\n{out[-4000:]}")
    finally:
        guard.close()
    assert proc.returncode == 0, out[-6000:]
    for line in (
        "python: version 1 routes to",
        "js: version 1 routes to",
        "published version 2",
        "champion -> version 2",
        "python: version 2 routes to",
        "js: version 2 routes to",
    ):
        assert line in out, f"{line!r} not in the quickstart's output:\n{out[-4000:]}"
    versions = re.findall(r'"ready":true,"version":(\d+)', out)
    assert versions == ["1", "1", "2"], (versions, out[-4000:])
    assert re.search(r'\{"model":"zoo-[\w-]+".*"policy_version":2', out), out[-2000:]
