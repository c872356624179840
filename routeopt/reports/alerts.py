"""Alerts: drift findings and traffic checks (live requests unlike the certified ones, the promise
broken on live traffic: `routeopt.router_training.live.shift_monitor.TrafficCheck`) go out as Prefect events
(automations page or block on them) and, when the config names one, as JSON to a webhook
(Slack-style `text` line), retried with backoff. Delivery never fails a run: an unreachable
receiver is logged and reported as not delivered."""

from __future__ import annotations

import logging
import os
import random
import time
from dataclasses import asdict, dataclass
from typing import Any, Callable

from routeopt.common.io import jsonable
from routeopt.evals.config import AlertSettings
from routeopt.evals.storage.drift import DriftReport, summary_line

log = logging.getLogger(__name__)


def emit_drift_events(report: DriftReport) -> list[Any]:
    """One Prefect event per finding plus a summary, so automations can page or block on them."""
    from prefect.events import emit_event

    run = {"prefect.resource.id": f"routeopt.run.{report.run_id}", "prefect.resource.role": "run"}
    events = []
    for f in report.findings:
        ev = emit_event(
            event=f"routeopt.drift.{f.severity}",
            resource={
                "prefect.resource.id": f"routeopt.candidate.{f.candidate}",
                "prefect.resource.name": f.candidate,
                "routeopt.suite": f.suite,
                "routeopt.metric": f.metric,
            },
            related=[run],
            payload=jsonable(asdict(f)),
        )
        events.append(ev)
    events.append(
        emit_event(
            event="routeopt.drift.checked",
            resource={"prefect.resource.id": f"routeopt.drift-check.{report.run_id}"},
            related=[run],
            payload={
                "regressions": len(report.regressions),
                "findings": len(report.findings),
                "baseline_runs": report.baseline_runs,
                "compared_pairs": report.compared_pairs,
            },
        )
    )
    return events


def webhook_url(settings: AlertSettings) -> str | None:
    """The webhook to post to: the env var named in the config wins over a literal URL."""
    if settings.webhook_url_env and os.environ.get(settings.webhook_url_env):
        return os.environ[settings.webhook_url_env]
    return settings.webhook_url


@dataclass(frozen=True)
class RetryBackoff:
    """Exponential backoff with full jitter, at least a (bounded) Retry-After, at most `max_s`."""

    base_s: float = 1.0
    max_s: float = 30.0

    def delay(self, attempt: int, retry_after_s: float | None = None) -> float:
        jittered = random.uniform(0.0, min(self.max_s, self.base_s * 2 ** (attempt - 1)))
        return min(self.max_s, max(jittered, retry_after_s or 0.0))


def _retry_after(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the exponential backoff alone decides


def post_webhook(
    report: DriftReport,
    url: str,
    timeout_s: float = 10.0,
    attempts: int = 4,
    backoff: RetryBackoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """POST the report as JSON (with a Slack-style `text` line), retrying 5xx, 429 and network
    errors with backoff. Never raises: an unreachable receiver must not fail the nightly run;
    it is logged and reported as False."""
    body = {"text": summary_line(report), **report.to_dict()}
    return post_json(body, url, f"the report of run {report.run_id}", timeout_s, attempts, backoff, sleep)


def post_json(
    body: dict,
    url: str,
    what: str,
    timeout_s: float = 10.0,
    attempts: int = 4,
    backoff: RetryBackoff | None = None,
    sleep: Callable[[float], None] = time.sleep,
) -> bool:
    """POST `body`, retrying 5xx, 429 and network errors with backoff; False (logged) when it
    could not be delivered."""
    import httpx

    backoff = backoff or RetryBackoff()
    for attempt in range(1, attempts + 1):
        retry_after = None
        try:
            resp = httpx.post(url, json=body, timeout=timeout_s)
            if resp.status_code < 300:
                return True
            if resp.status_code < 500 and resp.status_code != 429:
                break
            retry_after = _retry_after(resp.headers.get("retry-after"))
            log.warning("webhook attempt %d: HTTP %d", attempt, resp.status_code)
        except httpx.HTTPError as exc:
            log.warning("webhook attempt %d failed: %s", attempt, type(exc).__name__)
        if attempt < attempts:
            sleep(backoff.delay(attempt, retry_after))
    log.error("webhook: could not deliver %s", what)
    return False


def send_alerts(report: DriftReport, settings: AlertSettings, *, events: bool = True) -> dict[str, Any]:
    """Emit the events and post the webhook (when configured); say what was delivered."""
    sent = {"events": 0, "webhook": None}
    if events:
        sent["events"] = sum(1 for e in emit_drift_events(report) if e is not None)
    url = webhook_url(settings)
    if url and (report.findings or report.compared_pairs):
        sent["webhook"] = post_webhook(report, url, settings.webhook_timeout_s)
    return sent


def emit_traffic_events(check: Any) -> list[Any]:
    """Prefect events of a traffic check: `routeopt.traffic.shift` naming each feature that moved,
    `routeopt.traffic.promise-broken` when live traffic refutes the promise, and
    `routeopt.traffic.checked` with the summary."""
    from prefect.events import emit_event

    policy = {"prefect.resource.id": f"routeopt.policy.{check.version}", "prefect.resource.role": "policy"}
    events = []
    if check.shift is not None:
        for f in check.shift.moved():
            events.append(
                emit_event(
                    event="routeopt.traffic.shift",
                    resource={
                        "prefect.resource.id": f"routeopt.feature.{f.feature}",
                        "routeopt.feature": f.feature,
                    },
                    related=[policy],
                    payload=jsonable(asdict(f)),
                )
            )
    if (check.promise or {}).get("broken"):
        events.append(
            emit_event(
                event="routeopt.traffic.promise-broken",
                resource={"prefect.resource.id": f"routeopt.promise.{check.version}"},
                related=[policy],
                payload=jsonable(check.promise),
            )
        )
    events.append(
        emit_event(
            event="routeopt.traffic.checked",
            resource={"prefect.resource.id": f"routeopt.traffic-check.{check.version}"},
            related=[policy],
            payload=jsonable(check.to_dict()),
        )
    )
    return events


def send_traffic_alerts(check: Any, settings: AlertSettings, *, events: bool = True) -> dict[str, Any]:
    """Emit the traffic check's events and, when it alerts, post it to the webhook."""
    sent = {"events": 0, "webhook": None}
    if events:
        sent["events"] = sum(1 for e in emit_traffic_events(check) if e is not None)
    url = webhook_url(settings)
    if url and check.alert:
        body = {"text": f"routeopt: {check.summary_line()}", "kind": "traffic", **jsonable(check.to_dict())}
        sent["webhook"] = post_json(
            body, url, f"the traffic check of policy version {check.version}", settings.webhook_timeout_s
        )
    return sent
