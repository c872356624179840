"""After a nightly run's evaluation: drift, alerts, the HTML report and the Prefect artifacts.

One call for the flow, between training and publishing, so that a policy relying on a
regressed candidate can be held back: `review_run(...).blocking` lists what should block it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from evals.config import Config
from evals.storage.drift import DriftFinding, DriftReport, blocking_regressions, detect_drift
from evals.storage.store import Store
from reports.alerts import send_alerts
from reports.dashboard import build_report, publish_prefect_artifacts


@dataclass
class RunReview:
    drift: DriftReport
    blocking: list[DriftFinding] = field(default_factory=list)
    alerts: dict[str, Any] = field(default_factory=dict)
    report_path: Path | None = None
    artifacts: list[Any] = field(default_factory=list)


def default_report_path(cfg: Config, run_id: str) -> Path:
    """Reports live beside the outcome database: `<db dir>/reports/<run_id>.html`."""
    return cfg.db_path.parent / "reports" / f"{run_id}.html"


def review_run(
    cfg: Config,
    store: Store,
    run_id: str,
    *,
    metrics: dict | None = None,
    policy_candidates: Iterable[str] = (),
    report_path: str | Path | None = None,
    send: bool = True,
    artifacts: bool = True,
) -> RunReview:
    """Detect drift, alert (events + webhook), write the report, publish Prefect artifacts.

    `policy_candidates`: the candidates the new policy routes to; regressions among them land in
    `blocking`. `metrics`: the router's training metrics (for the report's cost-quality chart).
    """
    drift = detect_drift(store, run_id, cfg.alerts)
    review = RunReview(drift, blocking_regressions(drift, policy_candidates))
    if send:
        review.alerts = send_alerts(drift, cfg.alerts)
    path = Path(report_path) if report_path else default_report_path(cfg, run_id)
    review.report_path = build_report(store, run_id, path, drift=drift, metrics=metrics,
                                      registry=None if metrics else cfg.registry_dir)
    if artifacts:
        review.artifacts = publish_prefect_artifacts(store, run_id, drift=drift, metrics=metrics,
                                                     report_path=review.report_path)
    return review
