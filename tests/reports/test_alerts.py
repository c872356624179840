"""Alerts: drift findings as Prefect events and as a webhook with retries and backoff."""

from __future__ import annotations

from pathlib import Path

import pytest

from routeopt.evals.config import AlertSettings
from routeopt.evals.storage.drift import detect_drift
from routeopt.evals.storage.store import Store
from routeopt.reports.alerts import RetryBackoff, emit_drift_events, post_webhook, send_alerts
from tests.ops_history import Regression, make_history
from tests.ops_receiver import receiver  # noqa: F401 (a fixture)


@pytest.fixture(scope="module")
def regressed(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("drift") / "db.duckdb"
    make_history(
        db,
        runs=4,
        items=120,
        regressions=[
            Regression("mid", "arith", pass_rate=0.45),
            Regression("big", "facts", latency_factor=2.0),
            Regression("small", "arith", price_factor=1.0),
            Regression("big", "arith", price_factor=1.5),
        ],
    )
    return db


def test_webhook_retries_back_off_with_jitter_and_a_bound(regressed: Path, receiver):  # noqa: F811
    url, handler = receiver
    handler.statuses = [503, 503, 503, 503]
    slept: list[float] = []
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03")
    backoff = RetryBackoff(base_s=1.0, max_s=3.0)
    assert post_webhook(report, url, attempts=4, backoff=backoff, sleep=slept.append) is False
    assert len(handler.received) == 4 and len(slept) == 3  # no sleep after the last attempt
    assert all(0 <= d <= bound for d, bound in zip(slept, (1.0, 2.0, 3.0)))
    delays = [backoff.delay(3) for _ in range(200)]
    assert max(delays) <= 3.0 and len(set(delays)) > 100  # capped, and jittered
    assert backoff.delay(1, retry_after_s=2.5) >= 2.5 and backoff.delay(1, retry_after_s=99) == 3.0


def test_webhook_receives_the_report_and_retries_a_5xx(regressed: Path, receiver, monkeypatch):  # noqa: F811
    url, handler = receiver
    handler.statuses = [503]
    monkeypatch.setenv("ROUTEOPT_TEST_HOOK", url)
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03")
    sent = send_alerts(report, AlertSettings(webhook_url_env="ROUTEOPT_TEST_HOOK"), events=False)
    assert sent == {"events": 0, "webhook": True}
    assert len(handler.received) == 2  # the 503, then the retry that landed
    got = handler.received[-1]
    assert got["path"] == "/hooks/routeopt" and got["ctype"] == "application/json"
    assert got["body"]["run_id"] == "run-03" and "regressions" in got["body"]["text"]
    metrics = {
        (f["candidate"], f["metric"]) for f in got["body"]["findings"] if f["severity"] == "regression"
    }
    assert ("mid", "pass_rate") in metrics


def test_webhook_failure_is_reported_not_raised(regressed: Path, receiver):  # noqa: F811
    url, handler = receiver
    handler.statuses = [400]
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03")
    assert post_webhook(report, url) is False and len(handler.received) == 1  # 4xx: no retry
    assert post_webhook(report, "http://127.0.0.1:9/unreachable", timeout_s=1, attempts=1) is False


@pytest.mark.slow
def test_drift_goes_out_as_prefect_events(regressed: Path, prefect_harness):
    """Emitted to a real (temporary) Prefect server and read back through its events API."""
    import time

    from prefect.client.orchestration import get_client
    from prefect.events.filters import EventFilter, EventIDFilter, EventNameFilter, EventRelatedFilter
    from prefect.events.worker import EventsWorker

    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03")
    emitted = emit_drift_events(report)
    assert all(e is not None for e in emitted)
    EventsWorker.drain_all()
    wanted = EventFilter(  # these events, found as a subscriber would look for them
        event=EventNameFilter(prefix=["routeopt.drift."]),
        related=EventRelatedFilter(id=["routeopt.run.run-03"]),
        id=EventIDFilter(id=[e.id for e in emitted]),  # other tests emit events about their own 'run-03'
    )
    deadline, got = time.monotonic() + 30, []
    with get_client(sync_client=True) as client:
        while time.monotonic() < deadline and len(got) < len(report.findings) + 1:
            time.sleep(0.5)
            got = client.read_events(filter=wanted, limit=50).events
    assert len(got) == len(report.findings) + 1
    names = sorted(e.event for e in got)
    assert "routeopt.drift.regression" in names and "routeopt.drift.checked" in names
    drop = next(
        e for e in got if e.payload.get("metric") == "pass_rate" and e.resource.id == "routeopt.candidate.mid"
    )
    assert drop.resource["routeopt.suite"] == "arith" and drop.payload["severity"] == "regression"
    checked = next(e for e in got if e.event == "routeopt.drift.checked")
    assert checked.payload["regressions"] == len(report.regressions)
