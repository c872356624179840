"""After a nightly run's evaluation: drift, the serving policy's traffic check and their alerts,
then (once the policy is published and the gate has spoken) the HTML report and the Prefect
artifacts.

Two calls from the flow. `review_run`, between training and publishing, so that a policy relying
on a regressed candidate can be held back: `review_run(...).blocking` lists what should block it.
`report_run`, after the promotion gate, so the dashboard shows the version the run published and
whether it became the champion.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from routeopt.evals.config import Config
from routeopt.evals.storage.drift import DriftFinding, DriftReport, blocking_regressions, detect_drift
from routeopt.evals.storage.store import Store
from routeopt.reports.alerts import send_alerts, send_traffic_alerts
from routeopt.reports.dashboard import gather, publish_prefect_artifacts, render_html, write_report


@dataclass
class RunReview:
    drift: DriftReport
    blocking: list[DriftFinding] = field(default_factory=list)
    alerts: dict[str, Any] = field(default_factory=dict)
    traffic: Any = None  # routeopt.router_training.live.shift_monitor.TrafficCheck of the serving champion
    traffic_alerts: dict[str, Any] = field(default_factory=dict)


def traffic_review(cfg: Config, store: Store, public_keys: Any = None, *, until: str | None = None) -> Any:
    """The champion's traffic check on the decisions of the last `traffic.window_days`: the shift
    monitor (`routeopt.router_training.live.shift_monitor`) and, with feedback, its promise on live traffic. None
    without a verified champion or without logged decisions."""
    from datetime import datetime, timedelta, timezone

    from routeopt.artifacts.publish.promotion import champion_version
    from routeopt.evals.storage.traffic import load_traffic
    from routeopt.router_training.live.shift_monitor import check_traffic

    end = datetime.fromisoformat(until) if until else datetime.now(timezone.utc)
    frame = load_traffic(
        store,
        since=(end - timedelta(days=cfg.traffic.window_days)).isoformat(),
        until=end.isoformat(),
        source=cfg.traffic.feedback_source,
    )
    if frame.empty:
        return None
    try:
        champion, version, _ = champion_version(cfg.registry_dir, public_keys)
    except Exception:  # noqa: BLE001 - a champion that cannot be verified is the gate's business
        return None
    if champion is None:
        return None
    t = cfg.traffic
    return check_traffic(
        frame,
        champion,
        version,
        alpha=t.shift_alpha,
        min_effect=t.shift_min_effect,
        min_requests=t.shift_min_requests,
        min_feedback=t.min_feedback,
    )


def trusted_public_keys(cfg: Config) -> Any:
    """The public keys the champion is verified with: the config's (beside its signing key) and
    $ROUTEOPT_PUBLIC_KEY."""
    from routeopt.artifacts.serving.signatures import public_key_path, trusted_keys

    keys = [*(trusted_keys(None) or {}).values()]
    beside = public_key_path(cfg.signing_key_path())
    return [beside, *keys] if beside.exists() else (keys or None)


def default_report_path(cfg: Config, run_id: str) -> Path:
    """Reports live beside the outcome database: `<db dir>/reports/<run_id>.html`."""
    return cfg.db_path.parent / "reports" / f"{run_id}.html"


def review_run(
    cfg: Config, store: Store, run_id: str, *, policy_candidates: Iterable[str] = (), send: bool = True
) -> RunReview:
    """Detect drift, check the champion's logged traffic, and alert (events + webhook).
    `policy_candidates`: the candidates the new policy routes to; regressions among them land
    in `blocking`."""
    drift = detect_drift(store, run_id, cfg.alerts)
    review = RunReview(drift, blocking_regressions(drift, policy_candidates))
    review.traffic = traffic_review(cfg, store, trusted_public_keys(cfg))
    if send:
        review.alerts = send_alerts(drift, cfg.alerts)
        if review.traffic is not None:
            review.traffic_alerts = send_traffic_alerts(review.traffic, cfg.alerts)
    return review


def report_run(
    cfg: Config,
    store: Store,
    run_id: str,
    *,
    drift: DriftReport | None,
    metrics: dict | None = None,
    policy: dict[str, Any] | None = None,
    report_path: str | Path | None = None,
    artifacts: bool = True,
    traffic: dict | None = None,
) -> tuple[Path, list[Any]]:
    """Write the dashboard and publish the Prefect artifacts; returns (path, artifact ids).

    `metrics`: the router's training metrics (the knob's held-out figures); `policy`: what the
    run published (`version`, `promoted`, `reason`); `traffic`: the champion's traffic check.
    Without metrics the registry is searched for a policy trained on this run."""
    data = gather(
        store,
        run_id,
        drift=drift,
        metrics=metrics,
        policy=policy,
        registry=None if metrics else cfg.registry_dir,
        traffic=traffic,
    )
    path = write_report(
        render_html(data), report_path or default_report_path(cfg, run_id), cfg.reports.permissions
    )
    return path, publish_prefect_artifacts(data, path) if artifacts else []
