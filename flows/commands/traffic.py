"""Production traffic: `routeopt import decisions|feedback|traffic`, `routeopt policies evaluate`
and `routeopt cost plan`. The commands join the `import`, `policies` and `cost` groups."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import click

from routeopt.flows.commands import (
    CONFIG_OPTION,
    DB_OPTION,
    load_config_or_exit,
    open_store,
    resolve_db,
    verification_keys,
)
from routeopt.flows.commands.artifacts import (
    ALLOW_UNSIGNED_LOAD,
    PUBLIC_KEY,
    REGISTRY,
    _default_registry,
    policies,
)
from routeopt.flows.commands.gpu import cost
from routeopt.flows.commands.router import import_group

LOG_ARG = click.argument("log", nargs=-1, type=click.Path(exists=True, path_type=Path))


def _logs(given: tuple[Path, ...], cfg: Any) -> list[Path]:
    """LOG files or folders, else the config's `traffic.log_dir`."""
    if given:
        return list(given)
    if cfg.traffic.log_dir is None:
        raise click.UsageError(
            f"give LOG (decision log files or folders), or set traffic.log_dir in {cfg.source_path}"
        )
    if not Path(cfg.traffic.log_dir).exists():
        raise click.ClickException(f"traffic.log_dir {cfg.traffic.log_dir} does not exist")
    return [Path(cfg.traffic.log_dir)]


def _champion(cfg: Any, registry: Any) -> Any:
    """The verified champion policy of the registry, or None (no registry, no champion, or one
    that cannot be verified: the caller asks for an explicit candidate instead)."""
    from routeopt.artifacts.publish.promotion import champion_policy
    from routeopt.artifacts.serving.signatures import public_key_path

    beside = public_key_path(cfg.signing_key_path())  # else $ROUTEOPT_PUBLIC_KEY
    try:
        policy, _ = champion_policy(registry, beside if beside.exists() else None)
    except Exception:  # noqa: BLE001 - any failure means "name the candidate yourself"
        return None
    return policy


@import_group.command("decisions")
@LOG_ARG
@CONFIG_OPTION
@DB_OPTION
def import_decisions_cmd(log: tuple[Path, ...], config_path: Path | None, db_path: Path | None) -> None:
    """Import gateway decision logs (JSONL files or folders; default: traffic.log_dir) into the
    store; safe to repeat."""
    from routeopt.evals.storage.traffic import TrafficImportError, import_decisions

    logs = log or _logs(log, load_config_or_exit(config_path))
    path = resolve_db(config_path, db_path)
    try:
        with open_store(path, read_only=False) as store:
            s = import_decisions(list(logs), store)
    except TrafficImportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{s.new} new decisions ({s.decisions} in {s.files} files, {s.duplicates} repeated "
        f"request ids); usage for {s.usage_matched} of {s.usage} usage records -> {path}"
    )
    if s.truncated:
        click.echo(
            f"skipped {len(s.truncated)} unfinished last line(s) (a gateway writing): "
            f"{', '.join(s.truncated[:3])}",
            err=True,
        )


@import_group.command("feedback")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--source",
    default="feedback",
    show_default=True,
    help="Where the outcomes come from (user ratings, a validator, a judge); a 'source' "
    "column overrides it per row.",
)
@click.option(
    "--pass-threshold",
    type=click.FloatRange(0, 1),
    default=0.5,
    show_default=True,
    help="A row with only a score passes at this score or above.",
)
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Import these decision logs first (repeatable).",
)
def import_feedback_cmd(
    file: Path,
    config_path: Path | None,
    db_path: Path | None,
    source: str,
    pass_threshold: float,
    logs: tuple[Path, ...],
) -> None:
    """Import production outcomes (request_id plus passed or score; optional source, time,
    cost_usd, input_tokens, output_tokens) from a .jsonl, .csv or .parquet FILE."""
    from routeopt.evals.storage.traffic import TrafficImportError, import_decisions, import_feedback

    path = resolve_db(config_path, db_path)
    try:
        with open_store(path, read_only=False) as store:
            if logs:
                import_decisions(list(logs), store)
            s = import_feedback(file, store, source=source, pass_threshold=pass_threshold)
    except TrafficImportError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{s.rows} feedback rows from {file} ({s.new} new, {s.updated} updated, {s.unchanged} "
        f"unchanged; sources {', '.join(s.sources)}) -> {path}"
    )
    waiting = s.rows - s.matched
    click.echo(
        f"{s.matched} match a logged decision"
        + (f"; {waiting} wait for their decisions to be imported" if waiting else "")
    )


@import_group.command("traffic")
@LOG_ARG
@click.option(
    "--sample",
    "n",
    type=click.IntRange(min=1),
    required=True,
    help="How many logged prompts to sample (stratified by suite and day).",
)
@CONFIG_OPTION
@click.option("--name", default="traffic", show_default=True, help="Suite name (prefix).")
@click.option("--judge", default=None, help="Judge candidate (default: traffic.judge).")
@click.option(
    "--reference",
    default=None,
    help="Grade against this candidate's answers, fetched now (default: judge with a "
    "rubric only). 'strongest' takes the champion policy's best single candidate.",
)
@REGISTRY
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--suites-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where the suite YAML goes (default: traffic.suites_dir, else suites_dir).",
)
@click.option(
    "--data-dir",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Where its JSONL goes (default: traffic.data_dir, else beside the suites).",
)
@click.option("--max-tokens", type=click.IntRange(min=1), default=512, show_default=True)
def import_traffic_cmd(
    log: tuple[Path, ...],
    n: int,
    config_path: Path | None,
    name: str,
    judge: str | None,
    reference: str | None,
    registry: str | None,
    seed: int,
    suites_dir: Path | None,
    data_dir: Path | None,
    max_tokens: int,
) -> None:
    """Turn logged prompts (where the redaction hook kept text) into eval suites for the nightly
    (LOG: decision log files or folders; default: traffic.log_dir)."""
    from routeopt.evals.storage.traffic import TrafficImportError, decisions_from_log
    from routeopt.evals.suite.traffic_suite import (
        TrafficSuiteError,
        build_traffic_suites,
        strongest_candidate,
    )

    cfg = load_config_or_exit(config_path)
    log = tuple(_logs(log, cfg))
    if reference == "strongest":
        reference = strongest_candidate(cfg, _champion(cfg, registry or cfg.registry_dir))
        if reference is None:
            raise click.ClickException(
                "--reference strongest: no champion policy whose best single "
                "candidate is in the config; name the candidate"
            )
    try:
        suites = build_traffic_suites(
            decisions_from_log(list(log)),
            n,
            cfg=cfg,
            name=name,
            judge=judge,
            reference=reference,
            seed=seed,
            suites_dir=suites_dir,
            data_dir=data_dir,
            max_tokens=max_tokens,
        )
    except (TrafficImportError, TrafficSuiteError) as exc:
        raise click.ClickException(str(exc)) from None
    for s in suites:
        click.echo(f"{s.name}: {s.items} items -> {s.suite_path} ({s.data_path})")
    click.echo("the nightly evaluates them across all candidates; check with `routeopt suites validate`")


# -- policies evaluate ------------------------------------------------------------------------


def _load_target(registry: str, spec: str, public_key: Any, allow_unsigned: bool) -> tuple[str, int, Any]:
    """(label, version, policy) for a version number or a channel name, verified."""
    from routeopt.artifacts.publish.registry import version_entry
    from routeopt.artifacts.serving.loader import load

    options = {"allow_unsigned": allow_unsigned, "default_model": "", "state_dir": False}
    if spec.isdigit():
        entry = version_entry(registry, int(spec))
        router = load(f"{registry.rstrip('/')}/{entry['path']}", public_key, **options)
        return f"version {spec}", router.version, router.policy
    router = load(registry, public_key, channel=spec, **options)
    return spec, router.version, router.policy


def _ci(e: Any, fmt: str) -> str:
    if e is None or not e.n or math.isnan(e.value):
        return "-"
    return f"{format(e.value, fmt)} [{format(e.low, fmt)}, {format(e.high, fmt)}]"


def _print_estimates(results: list[Any], diffs: list[tuple[str, Any]]) -> None:
    click.echo(
        f"{'policy':<16} {'version':>7} {'requests':>8} {'agree':>6} {'ESS':>7}  "
        f"{'pass rate DR [95% CI]':<26} {'IPS':>6} {'SNIPS':>6}  {'USD/request DR [95% CI]':<34}"
    )
    for r in results:
        p, c = r.pass_rate, r.cost
        click.echo(
            f"{r.label[:16]:<16} {r.version if r.version is not None else '-':>7} "
            f"{r.n_evaluated:>8} {r.agreement:>6.1%} {p['dr'].ess if p else 0:>7.1f}  "
            f"{_ci(p.get('dr'), '.3f'):<26} {_num(p.get('ips')):>6} {_num(p.get('snips')):>6}  "
            f"{_ci(c.get('dr'), '.3g'):<34}"
        )
    for label, d in diffs:
        click.echo(
            f"{label}: pass rate {_ci(d.pass_rate_diff, '+.3f')}, USD/request "
            f"{_ci(d.cost_diff, '+.3g')} on {d.pass_rate_diff.n} requests (paired, doubly robust)"
        )
    r = results[0]
    click.echo(
        f"{r.n_logged} logged requests, {r.n_feedback} with feedback; a policy's choice comes "
        "from its own records, shadow records, or the kept text"
    )
    for r in results:
        if r.n_unknown:
            click.echo(
                f"  {r.label}: {r.n_unknown} requests with feedback skipped (no kept text and "
                "neither served nor shadowed by it)"
            )


def _num(e: Any) -> str:
    return "-" if e is None or not e.n or math.isnan(e.value) else f"{e.value:.3f}"


@policies.command("evaluate")
@click.argument("targets", nargs=-1)
@REGISTRY
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Decision log files or folders (default: the decisions imported into the store).",
)
@CONFIG_OPTION
@DB_OPTION
@click.option("--since", default=None, help="Only decisions at or after this ISO date/time.")
@click.option("--until", default=None, help="Only decisions before this ISO date/time.")
@click.option("--feedback-source", default=None, help="Use only this feedback source.")
@click.option(
    "--quality-target",
    type=float,
    default=None,
    help="Score every policy at this quality target (default: the target each request "
    "was routed at). Records routed at another target do not count as the policy's "
    "choice; it decides again where the text was kept.",
)
@PUBLIC_KEY
@ALLOW_UNSIGNED_LOAD
@click.option("--json", "as_json", is_flag=True, help="Print the estimates as JSON.")
def evaluate_cmd(
    targets: tuple[str, ...],
    registry: str | None,
    logs: tuple[Path, ...],
    config_path: Path | None,
    db_path: Path | None,
    since: str | None,
    until: str | None,
    feedback_source: str | None,
    quality_target: float | None,
    public_keys: tuple[Path, ...],
    allow_unsigned: bool,
    as_json: bool,
) -> None:
    """Estimate published policies' pass rate and cost per request on logged traffic.

    TARGETS are version numbers or channel names (default: champion and candidate). Inverse
    propensity, self-normalised and doubly robust estimates with 95% intervals and the effective
    sample size; each target is also compared with the first one, paired on the same requests.
    """
    if quality_target is not None and not (math.isfinite(quality_target) and quality_target >= 0):
        raise click.BadParameter(
            f"{quality_target} is not a non-negative number", param_hint="--quality-target"
        )
    from routeopt.artifacts.serving.loader import PolicyLoadError
    from routeopt.evals.storage.traffic import (
        TrafficImportError,
        decisions_from_log,
        decisions_from_store,
        feedback_from_store,
        traffic_frame,
        window,
    )
    from routeopt.router_training.live.promise import compare, evaluate

    registry = registry or _default_registry(config_path)
    keys = verification_keys(public_keys, config_path, allow_unsigned)
    loaded = []
    for spec in targets or ("champion", "candidate"):
        try:
            loaded.append(_load_target(registry, spec, keys, allow_unsigned))
        except (PolicyLoadError, ValueError, RuntimeError) as exc:
            if targets:
                raise click.ClickException(f"{spec}: {exc}") from None
            click.echo(f"{spec}: not evaluated ({exc})", err=True)
    if not loaded:
        raise click.ClickException(f"{registry}: no policy to evaluate")
    path = resolve_db(config_path, db_path)
    try:
        decisions = decisions_from_log(list(logs)) if logs else None
    except TrafficImportError as exc:
        raise click.ClickException(str(exc)) from None
    if path.exists():
        with open_store(path, read_only=True, missing="import decision logs first") as store:
            decisions = decisions if decisions is not None else decisions_from_store(store, since, until)
            feedback = feedback_from_store(store, feedback_source)
    elif decisions is None:
        raise click.ClickException(f"{path}: no database; give --log or import decision logs first")
    else:
        feedback = feedback_from_store(None)
    frame = traffic_frame(window(decisions, since, until) if logs else decisions, feedback)
    if frame.empty:
        raise click.ClickException("no logged decisions in the window")
    at = f" @ {quality_target:g}" if quality_target is not None else ""
    results = [
        evaluate(frame, version, policy, label=f"{label}{at}", quality_target=quality_target)
        for label, version, policy in loaded
    ]
    diffs = [(f"{r.label} - {results[0].label}", compare(frame, r, results[0])) for r in results[1:]]
    if as_json:
        click.echo(
            json.dumps(
                {
                    "policies": [r.to_dict() for r in results],
                    "differences": {k: d.to_dict() for k, d in diffs},
                },
                indent=2,
                default=str,
            )
        )
        return
    _print_estimates(results, diffs)


# -- cost plan --------------------------------------------------------------------------------


@cost.command("plan")
@click.option(
    "--log",
    "logs",
    multiple=True,
    type=click.Path(exists=True, path_type=Path),
    help="Decision log files or folders (default: the decisions imported into the store).",
)
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--gpus",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs per self-hosted model (default: enough for its busiest logged hour).",
)
@click.option("--since", default=None, help="Only decisions at or after this ISO date/time.")
@click.option(
    "--min-good",
    type=float,
    default=0.9,
    show_default=True,
    help="A serving level counts as capacity only if this share met the latency targets.",
)
@click.option(
    "--capacity",
    "capacity",
    type=click.Choice(["bench", "replay"]),
    default="bench",
    show_default=True,
    help="GPU capacity from `bench serving` (fixed concurrency, a model "
    "of the traffic) or from `bench replay` (the logged traffic itself, measured).",
)
@click.option("--json", "as_json", is_flag=True)
def plan_cmd(
    logs: tuple[Path, ...],
    config_path: Path | None,
    db_path: Path | None,
    gpus: int | None,
    since: str | None,
    min_good: float,
    capacity: str,
    as_json: bool,
) -> None:
    """Monthly cost of the routed traffic on provider APIs vs each open model's share on GPUs."""
    from routeopt.evals.selfhost.costmodel import load_curve
    from routeopt.evals.selfhost.costplan import cost_plan, format_plan
    from routeopt.evals.storage.traffic import (
        TrafficImportError,
        decisions_from_log,
        decisions_from_store,
        feedback_from_store,
        traffic_frame,
        window,
    )

    cfg = load_config_or_exit(config_path)
    path = Path(db_path) if db_path else cfg.db_path
    try:
        decisions = decisions_from_log(list(logs)) if logs else None
    except TrafficImportError as exc:
        raise click.ClickException(str(exc)) from None
    curves: dict[str, list] = {}
    replays: dict[str, tuple] | None = {} if capacity == "replay" else None
    feedback = feedback_from_store(None)
    if path.exists():
        with open_store(path, read_only=True, missing="import decision logs first") as store:
            if decisions is None:
                decisions = decisions_from_store(store, since)
            feedback = feedback_from_store(store)
            curves = {c.name: load_curve(store, c.name) for c in cfg.candidates if c.gpu_hour_usd is not None}
            if capacity == "replay":
                from routeopt.evals.selfhost.replay_store import replay_capacity

                replays = {
                    c.name: got
                    for c in cfg.candidates
                    if c.gpu_hour_usd is not None and (got := replay_capacity(store, c.name)) is not None
                }
    if decisions is not None and logs:
        decisions = window(decisions, since, None)
    if decisions is None or decisions.empty:
        raise click.ClickException("no logged decisions: give --log or import decision logs first")
    try:
        plan = cost_plan(
            traffic_frame(decisions, feedback), cfg, curves, gpus=gpus, min_good=min_good, replays=replays
        )
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
    if as_json:
        from dataclasses import asdict

        from routeopt.common.io import jsonable

        click.echo(
            json.dumps(
                jsonable({**asdict(plan), "all_api_usd": plan.all_api_usd, "mixed_usd": plan.mixed_usd}),
                indent=2,
            )
        )
        return
    click.echo(format_plan(plan))
