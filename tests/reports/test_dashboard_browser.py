"""The dashboard in a real headless Chromium: it renders its charts and tables, its script runs
without console errors or exceptions, sorting works, and a screenshot is not blank.

Chromium is driven over the DevTools protocol (a websocket), so console messages and uncaught
exceptions are collected as structured events rather than scraped from logs.
"""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any, Iterator

import pytest

from routeopt.evals.storage.drift import detect_drift
from routeopt.evals.storage.store import Store
from routeopt.reports.dashboard import build_report, candidate_stats
from tests.ops_history import Regression, make_history

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install -y chromium)"),
]


class DevTools:
    """A minimal DevTools-protocol client for one page target."""

    def __init__(self, ws_url: str):
        from websockets.sync.client import connect

        self.ws = connect(ws_url, max_size=64 * 2**20, open_timeout=30)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []

    def call(self, method: str, timeout: float = 30.0, **params: Any) -> dict[str, Any]:
        msg_id = next(self.ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def wait_for(self, method: str, timeout: float = 30.0) -> dict[str, Any]:
        for ev in self.events:
            if ev.get("method") == method:
                return ev
        deadline = time.monotonic() + timeout
        while True:
            msg = json.loads(self.ws.recv(timeout=max(0.1, deadline - time.monotonic())))
            self.events.append(msg)
            if msg.get("method") == method:
                return msg

    def evaluate(self, expression: str) -> Any:
        got = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        if "exceptionDetails" in got:
            raise RuntimeError(f"{expression}: {got['exceptionDetails']}")
        return got["result"].get("value")

    def close(self) -> None:
        self.ws.close()


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    profile = tmp_path / "profile"
    proc = subprocess.Popen(
        [
            str(CHROMIUM),
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--disable-extensions",
            f"--user-data-dir={profile}",
            "--remote-debugging-port=0",
            "--window-size=1280,2000",
            "about:blank",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not (port_file.exists() and port_file.read_text().strip()):
            if proc.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"chromium did not start (exit code {proc.poll()})")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            pages = [t for t in json.load(resp) if t["type"] == "page"]
        tools = DevTools(pages[0]["webSocketDebuggerUrl"])
        try:
            yield tools
        finally:
            tools.close()
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _problems(events: list[dict[str, Any]]) -> list[str]:
    """Console errors/warnings, uncaught exceptions and failed loads the page produced."""
    out = []
    for ev in events:
        method, params = ev.get("method"), ev.get("params", {})
        if method == "Runtime.exceptionThrown":
            out.append(f"exception: {params['exceptionDetails'].get('text')}")
        elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "warning", "assert"):
            out.append(f"console.{params['type']}: {[a.get('value') for a in params.get('args', [])]}")
        elif method == "Log.entryAdded" and params["entry"].get("level") in ("error", "warning"):
            out.append(f"log {params['entry']['level']}: {params['entry'].get('text')}")
        elif method == "Network.loadingFailed":
            out.append(f"load failed: {params.get('errorText')}")
    return out


def test_dashboard_renders_in_headless_chromium(browser: DevTools, tmp_path: Path):
    db = tmp_path / "db.duckdb"
    make_history(db, runs=4, items=40, regressions=[Regression("mid", "arith", pass_rate=0.2)])
    with Store(db, read_only=True) as store:
        drift = detect_drift(store, "run-03")
        report = build_report(store, "run-03", tmp_path / "report.html", drift=drift)
    assert drift.regressions
    for domain in ("Runtime", "Log", "Page", "Network"):
        browser.call(f"{domain}.enable")
    requests: list[str] = []
    browser.call("Page.navigate", url=report.as_uri())
    browser.wait_for("Page.loadEventFired")
    rendered = json.loads(browser.evaluate("document.body.getAttribute('data-rendered')") or "null")
    assert rendered is not None, "the page's script did not run to its end"
    assert rendered["charts"] == 4 and rendered["marks"] > 30
    assert rendered["tables"] == 4  # candidates, two suites, drift (no router table: no metrics)
    assert rendered["rows"] == 3 + 6 + len(drift.findings)
    assert browser.evaluate("document.querySelectorAll('#drift tr.sev-regression').length") == len(
        drift.regressions
    )
    sizes = browser.evaluate(
        "Array.from(document.querySelectorAll('svg.chart')).map(s => s.getBoundingClientRect().width)"
    )
    assert all(w > 200 for w in sizes)  # laid out, not collapsed
    # clicking the pass-rate header sorts ascending, clicking again descending
    order = "Array.from(document.querySelectorAll('#candidates tbody tr')).map(r => r.cells[0].textContent)"
    click = (
        "Array.from(document.querySelectorAll('#candidates th'))"
        ".find(th => th.textContent === 'pass rate').click()"
    )
    browser.evaluate(click)
    asc = browser.evaluate(order)
    browser.evaluate(click)
    desc = browser.evaluate(order)
    with Store(db, read_only=True) as store:
        by_rate = [
            r["candidate"] for r in sorted(candidate_stats(store, "run-03"), key=lambda r: r["pass_rate"])
        ]
    assert asc == by_rate and desc == by_rate[::-1]
    shot = base64.b64decode(
        browser.call("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
    )
    (tmp_path / "report.png").write_bytes(shot)
    assert shot[:8] == b"\x89PNG\r\n\x1a\n" and len(shot) > 30_000  # a blank page compresses to ~5 kB
    time.sleep(0.3)  # let late console events arrive
    browser.call("Runtime.evaluate", expression="1")
    for ev in browser.events:
        if ev.get("method") == "Network.requestWillBeSent":
            requests.append(ev["params"]["request"]["url"])
    assert [u for u in requests if not u.startswith("file://")] == []  # nothing fetched from anywhere
    assert _problems(browser.events) == []


def test_the_check_catches_a_broken_page(browser: DevTools, tmp_path: Path):
    """The same checks must fail on a page whose script throws (the test can fail)."""
    page = tmp_path / "broken.html"
    page.write_text("<html><body><script>console.error('boom'); undefinedFunction();</script></body></html>")
    for domain in ("Runtime", "Log", "Page"):
        browser.call(f"{domain}.enable")
    browser.call("Page.navigate", url=page.as_uri())
    browser.wait_for("Page.loadEventFired")
    browser.call("Runtime.evaluate", expression="1")
    problems = _problems(browser.events)
    assert any("boom" in p for p in problems) and any(p.startswith("exception") for p in problems)
    assert browser.evaluate("document.body.getAttribute('data-rendered')") is None
