"""After a nightly run's evaluation: drift and its alerts, then (once the policy is published and
the gate has spoken) the HTML report and the Prefect artifacts.

Two calls from the flow. `review_run`, between training and publishing, so that a policy relying
on a regressed candidate can be held back: `review_run(...).blocking` lists what should block it.
`report_run`, after the promotion gate, so the dashboard shows the version the run published and
whether it became the champion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from evals.config import Config
from evals.storage.drift import DriftFinding, DriftReport, blocking_regressions, detect_drift
from evals.storage.store import Store
from reports.alerts import send_alerts
from reports.dashboard import gather, publish_prefect_artifacts, render_html, write_report


@dataclass
class RunReview:
    drift: DriftReport
    blocking: list[DriftFinding] = field(default_factory=list)
    alerts: dict[str, Any] = field(default_factory=dict)


def default_report_path(cfg: Config, run_id: str) -> Path:
    """Reports live beside the outcome database: `<db dir>/reports/<run_id>.html`."""
    return cfg.db_path.parent / "reports" / f"{run_id}.html"


def review_run(cfg: Config, store: Store, run_id: str, *, policy_candidates: Iterable[str] = (),
               send: bool = True) -> RunReview:
    """Detect drift and alert (events + webhook). `policy_candidates`: the candidates the new
    policy routes to; regressions among them land in `blocking`."""
    drift = detect_drift(store, run_id, cfg.alerts)
    review = RunReview(drift, blocking_regressions(drift, policy_candidates))
    if send:
        review.alerts = send_alerts(drift, cfg.alerts)
    return review


def report_run(cfg: Config, store: Store, run_id: str, *, drift: DriftReport | None,
               metrics: dict | None = None, policy: dict[str, Any] | None = None,
               report_path: str | Path | None = None, artifacts: bool = True) -> tuple[Path, list[Any]]:
    """Write the dashboard and publish the Prefect artifacts; returns (path, artifact ids).

    `metrics`: the router's training metrics (the knob's held-out figures); `policy`: what the
    run published (`version`, `promoted`, `reason`). Without metrics the registry is searched
    for a policy trained on this run."""
    data = gather(store, run_id, drift=drift, metrics=metrics, policy=policy,
                  registry=None if metrics else cfg.registry_dir)
    path = write_report(render_html(data), report_path or default_report_path(cfg, run_id),
                        cfg.reports.permissions)
    return path, publish_prefect_artifacts(data, path) if artifacts else []
