"""`routeopt report | export parquet | drift | deploy`: operating the nightly pipeline."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from routeopt.flows.commands import CONFIG_OPTION, DB_OPTION, load_config_or_exit, open_store, resolve_db


def _open_store(config_path: Path | None, given: Path | None) -> Any:
    return open_store(resolve_db(config_path, given), read_only=True)


def latest_run(store: Any) -> str:
    frame = store.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
    if frame.empty:
        raise click.ClickException(f"{store.path}: has no runs yet")
    return str(frame.run_id.iloc[0])


@click.group("export")
def export_group() -> None:
    """Export stored outcomes for other tools."""


@export_group.command("parquet")
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--out",
    "out_dir",
    type=click.Path(file_okay=False, path_type=Path),
    required=True,
    help="Folder of the Hive-partitioned dataset (run_date=.../suite=.../RUN.parquet).",
)
@click.option("--run", "run_ids", multiple=True, help="Only these runs (repeatable; default: all).")
@click.option("--since", default=None, help="Only runs started on or after this date (YYYY-MM-DD).")
@click.option("--no-text", is_flag=True, help="Leave out model responses and error messages.")
def export_parquet_cmd(
    config_path: Path | None,
    db_path: Path | None,
    out_dir: Path,
    run_ids: tuple[str, ...],
    since: str | None,
    no_text: bool,
) -> None:
    """Write outcomes to Parquet, partitioned by run date and suite.

    Re-exporting a run rewrites its files in place, so the command is safe to repeat nightly.
    """
    from routeopt.evals.storage.export import export_parquet

    with _open_store(config_path, db_path) as store:
        try:
            result = export_parquet(
                store, out_dir, list(run_ids) or None, since=since, include_text=not no_text
            )
        except KeyError as exc:
            raise click.ClickException(str(exc.args[0])) from None
    click.echo(
        f"wrote {result.rows} outcomes of {len(result.runs)} runs in {len(result.files)} files "
        f"under {out_dir}"
    )


@click.command("drift")
@CONFIG_OPTION
@DB_OPTION
@click.argument("run_id", required=False)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--alert", is_flag=True, help="Also emit the Prefect events and post the webhook.")
@click.option("--fail-on-regression", is_flag=True, help="Exit with status 3 if anything regressed.")
@click.option(
    "--fail-on-shift",
    is_flag=True,
    help="Exit with status 4 if the champion's logged traffic has shifted away from the requests "
    "it was certified on, or its promise is broken on it.",
)
def drift_cmd(
    config_path: Path | None,
    db_path: Path | None,
    run_id: str | None,
    as_json: bool,
    alert: bool,
    fail_on_regression: bool,
    fail_on_shift: bool,
) -> None:
    """Compare a run (default: the latest) with the runs before it and list what drifted; check
    the champion's logged traffic against the requests it was certified on."""
    from routeopt.evals.storage.drift import detect_drift, summary_line
    from routeopt.flows.review import trusted_public_keys, traffic_review
    from routeopt.reports.alerts import send_alerts, send_traffic_alerts

    cfg = load_config_or_exit(config_path)
    with _open_store(config_path, db_path) as store:
        run_id = run_id or latest_run(store)
        try:
            report = detect_drift(store, run_id, cfg.alerts)
        except KeyError as exc:
            raise click.ClickException(str(exc.args[0])) from None
        traffic = traffic_review(cfg, store, trusted_public_keys(cfg))
    if as_json:
        click.echo(
            json.dumps({**report.to_dict(), "traffic": traffic.to_dict() if traffic else None}, indent=2)
        )
    else:
        click.echo(summary_line(report))
        for f in report.findings:
            click.echo(f"  [{f.severity}] {f.message}")
        click.echo(
            traffic.summary_line()
            if traffic is not None
            else "traffic: no champion, or no logged decisions in the window"
        )
    if alert:
        from routeopt.flows import prefect_api

        with prefect_api.serving(prefect_api.launch()):  # a server of its own dies with it
            click.echo(f"alerts: {send_alerts(report, cfg.alerts)}", err=True)
            if traffic is not None:
                click.echo(f"traffic alerts: {send_traffic_alerts(traffic, cfg.alerts)}", err=True)
    if fail_on_regression and report.regressions:
        sys.exit(3)
    if fail_on_shift and traffic is not None and traffic.alert:
        sys.exit(4)


@click.command("report")
@CONFIG_OPTION
@DB_OPTION
@click.argument("run_id", required=False)
@click.option(
    "--out",
    "out_path",
    type=click.Path(dir_okay=False, path_type=Path),
    default=Path("report.html"),
    show_default=True,
    help="Where to write the HTML file.",
)
@click.option(
    "--trend-runs",
    default=14,
    show_default=True,
    type=click.IntRange(1, 365),
    help="How many runs the trend charts cover.",
)
@click.option("--no-drift", is_flag=True, help="Leave out the drift comparison.")
def report_cmd(
    config_path: Path | None,
    db_path: Path | None,
    run_id: str | None,
    out_path: Path,
    trend_runs: int,
    no_drift: bool,
) -> None:
    """Write a self-contained HTML dashboard of a run (default: the latest).

    Per candidate quality, cost per passing answer, tokens, TTFT and latency percentiles; the
    router's cost-quality trade-off beside single models (from the published policy trained on
    the run, when there is one); per-suite tables; trends; drift alerts. Opens offline.
    """
    from routeopt.evals.storage.drift import detect_drift
    from routeopt.reports.dashboard import REPORT_PERMISSIONS, build_report

    cfg = load_config_or_exit(config_path) if (db_path is None or config_path is not None) else None
    registry = cfg.registry_dir if cfg is not None else None
    with _open_store(config_path, db_path) as store:
        run_id = run_id or latest_run(store)
        try:
            drift = None if no_drift else detect_drift(store, run_id, cfg.alerts if cfg else None)
            path = build_report(
                store,
                run_id,
                out_path,
                drift=drift,
                registry=registry,
                permissions=cfg.reports.permissions if cfg else REPORT_PERMISSIONS,
                trend_runs=trend_runs,
            )
        except KeyError as exc:
            raise click.ClickException(str(exc.args[0])) from None
    click.echo(f"report of run {run_id}: {path}")


@click.command("deploy")
@CONFIG_OPTION
@click.option("--name", default="nightly", show_default=True, help="Deployment name.")
@click.option("--pool", "work_pool", default="routeopt", show_default=True, help="Work pool to run on.")
@click.option(
    "--pool-type",
    default="process",
    show_default=True,
    help="Type of the pool if it must be created (process, kubernetes, docker, ...).",
)
@click.option("--cron", default="0 2 * * *", show_default=True, help="Schedule ('' for none).")
@click.option("--timezone", default="UTC", show_default=True)
@click.option("--suite", "suites", multiple=True, help="Only these suites (repeatable).")
@click.option("--candidate", "candidates", multiple=True, help="Only these candidates (repeatable).")
@click.option("--source", default=None, help="Code location: a folder (default: this checkout) or a git URL.")
@click.option("--branch", default=None, help="Git branch, with a git URL --source.")
@click.option("--paused", is_flag=True, help="Create the schedule paused.")
def deploy_cmd(
    config_path: Path | None,
    name: str,
    work_pool: str,
    pool_type: str,
    cron: str,
    timezone: str,
    suites: tuple[str, ...],
    candidates: tuple[str, ...],
    source: str | None,
    branch: str | None,
    paused: bool,
) -> None:
    """Deploy the nightly flow to the Prefect server at $PREFECT_API_URL.

    Creates the work pool if missing, schedules the flow with --cron, and passes the config
    path, suites and candidates as parameters. Then start a worker on the pool:
    `prefect worker start --pool routeopt`.
    """
    from routeopt.flows.deploy import REPO_ROOT, DeploySpec, deploy_nightly

    cfg = load_config_or_exit(config_path)  # fail here, not at 2 a.m., if the config is broken
    for cand in candidates:
        if cand not in {c.name for c in cfg.candidates}:
            raise click.ClickException(f"--candidate {cand!r}: not in {cfg.source_path}")
    spec = DeploySpec(
        config_path=str(cfg.source_path),
        name=name,
        work_pool=work_pool,
        pool_type=pool_type,
        cron=cron or None,
        timezone=timezone,
        suites=list(suites) or None,
        candidates=list(candidates) or None,
        source=source or str(REPO_ROOT),
        branch=branch,
        paused=paused,
    )
    try:
        deployment_id = deploy_nightly(spec)
    except (ValueError, FileNotFoundError) as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"deployed routeopt-nightly/{name} ({deployment_id}) on pool {work_pool!r}, "
        f"schedule: {cron or 'none'} {timezone if cron else ''}".rstrip()
    )
    click.echo(f"start a worker:  prefect worker start --pool {work_pool}")
    click.echo(f"run it now:      prefect deployment run routeopt-nightly/{name}")
