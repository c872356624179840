"""Router commands: import outcomes, train and publish, benchmark the router, route requests.

Heavy imports (pandas, duckdb, sklearn) happen inside the commands so `--help` stays fast.
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any, Callable, Iterator

import click

from routeopt.common.io import atomic_write
from routeopt.flows.commands import CONFIG_OPTION, open_store, publishing_key, resolve_db, verification_keys


@click.group("import")
def import_group() -> None:
    """Bring outcomes recorded elsewhere into the store."""


@import_group.command("outcomes")
@click.argument("file", type=click.Path(path_type=Path, dir_okay=False))
@click.option(
    "--db",
    "db_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="DuckDB store to write into (default: db_path from the config).",
)
@click.option("--run-id", default=None, help="Run id (default: derived from the file's hash).")
@click.option(
    "--suite-default", default="imported", show_default=True, help="Suite for rows without a 'suite' value."
)
@CONFIG_OPTION
def import_outcomes_cmd(
    file: Path, db_path: Path | None, run_id: str | None, suite_default: str, config_path: Path | None
) -> None:
    """Import a long-format outcome FILE (.parquet, .csv, .jsonl): request_id, prompt, model, score."""
    from routeopt.evals.storage.importer import OutcomeImportError, import_outcomes

    db_path = resolve_db(config_path, db_path)
    try:
        with open_store(db_path, read_only=False) as store:
            s = import_outcomes(file, store, run_id=run_id, suite_default=suite_default)
    except OutcomeImportError as exc:
        raise click.ClickException(str(exc)) from None
    state = "imported" if s.new_run else "already imported (nothing duplicated)"
    click.echo(
        f"{state}: run {s.run_id}: {s.rows} outcomes, {s.requests} requests, "
        f"{len(s.candidates)} candidates, suites {', '.join(sorted(s.suites))}"
    )


def _publish(policy: Any, registry: Path, lineage: dict, metrics: dict, key: Any) -> str:
    from routeopt.artifacts.publish.registry import publish

    v = publish(policy, registry, lineage=lineage, metrics=metrics, signing_key=key)
    return f"published version {v.version} (signed, key {v.key_id}) to {v.location}"


@click.command("train")
@click.option(
    "--db",
    "db_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="DuckDB store with outcomes (default: db_path from the config).",
)
@click.option(
    "--registry",
    type=click.Path(path_type=Path, file_okay=False),
    default=None,
    help="Policy registry folder to publish into (default: registry_dir from the config).",
)
@click.option(
    "--quality-target",
    type=float,
    default=0.95,
    show_default=True,
    help="Fraction of the best single candidate's pass rate to keep.",
)
@click.option(
    "--holdout-fraction",
    type=float,
    default=0.3,
    show_default=True,
    help="Requests kept back to measure the policy and its knob's promise on.",
)
@click.option(
    "--refit/--no-refit",
    default=True,
    show_default=True,
    help="Publish the policy refit on every request once the held-out figures are taken.",
)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--run-id", "run_ids", multiple=True, help="Train on these runs only (repeatable).")
@click.option("--embeddings", is_flag=True, help="Add MiniLM sentence embeddings (the 'embeddings' extra).")
@click.option(
    "--estimator",
    type=click.Choice(["linear", "lightgbm"]),
    default="linear",
    show_default=True,
    help="Pass-probability model: the linear difficulty model or one LightGBM model per candidate.",
)
@click.option(
    "--confidence",
    type=float,
    default=0.95,
    show_default=True,
    help="How sure the knob must be that a target's promise holds on new requests.",
)
@click.option(
    "--latency-alpha",
    type=click.FloatRange(0, 1, min_open=True, max_open=True),
    default=0.1,
    show_default=True,
    help="Where outcomes measured latency: the share of requests over their budget every "
    "offered latency budget is certified to keep.",
)
@click.option(
    "--signing-key",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Ed25519 private key (default: the config's key, created on first use in "
    ".routeopt/keys/ beside it).",
)
@click.option(
    "--traffic",
    "traffic_path",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Certify the knob for this unlabelled traffic: decision logs (files or folders; "
    "text where kept, else suites and prompt lengths) or a "
    'JSONL of {"prompt", "suite"?}.',
)
@click.option(
    "--robust",
    "robust_gamma",
    type=click.FloatRange(min=1.0),
    default=None,
    help="Certify the knob for any traffic whose suite x difficulty mix is within this "
    "factor of the eval suites' (e.g. 2); nothing about the traffic need be known.",
)
@CONFIG_OPTION
def train(
    db_path: Path | None,
    registry: Path | None,
    quality_target: float,
    holdout_fraction: float,
    refit: bool,
    seed: int,
    run_ids: tuple[str, ...],
    embeddings: bool,
    estimator: str,
    confidence: float,
    latency_alpha: float,
    signing_key: Path | None,
    traffic_path: Path | None,
    robust_gamma: float | None,
    config_path: Path | None,
) -> None:
    """Train a router on every outcome in the store and publish it, signed (the store and the
    registry default to the config's)."""
    from routeopt.flows.commands.artifacts import _default_registry
    from routeopt.router_training.fit.certificate import Certificate

    db_path = resolve_db(config_path, db_path)
    registry = Path(registry or _default_registry(config_path))
    key = publishing_key(signing_key, config_path, create_for=registry)
    if traffic_path is not None and robust_gamma is not None:
        raise click.UsageError("give --traffic or --robust, not both")
    with open_store(db_path, read_only=True, missing="run `routeopt run` or import outcomes first") as store:
        frame = store.training_frame(list(run_ids) or None)
    if frame.empty:
        raise click.ClickException(
            f"{db_path}: no graded outcomes to train on; run evals or import outcomes first"
        )
    sample = _traffic(traffic_path) if traffic_path is not None else None
    result = _train(
        frame,
        quality_target=quality_target,
        holdout_fraction=holdout_fraction,
        seed=seed,
        embeddings=embeddings,
        estimator=estimator,
        confidence=confidence,
        refit=refit,
        certificate=Certificate(traffic=sample, robust=robust_gamma),
        latency_alpha=latency_alpha,
    )
    lineage = {
        "db": str(db_path),
        "runs": sorted(frame["run_id"].unique().tolist()),
        "rows": len(frame),
        "seed": seed,
        "holdout_fraction": holdout_fraction,
        "refit": result.metrics["refit"],
        "estimator": estimator,
        "confidence": confidence,
        "split_sizes": {k: len(v) for k, v in result.split.items()},
    }
    click.echo(_publish(result.policy, registry, lineage, result.metrics, key))
    knob = result.metrics.get("knob", {})
    click.echo(
        f"knob: certified up to target {knob.get('certified_up_to', float('nan')):.3f} with "
        f"confidence {confidence:g} (reference {result.policy.reference_model}), for "
        f"{knob.get('certificate', {}).get('assumes', 'requests like the calibration requests')}"
    )
    holdout = result.metrics.get("holdout", {})
    held, promise = holdout.get("router_at_target"), holdout.get("promise")
    if held and result.metrics.get("refit"):
        click.echo(
            f"published policy: fitted on all {result.metrics['n_fit']} requests; the held-out "
            f"figures are of the same training fitted without the {result.metrics['n_test']} held-out ones"
        )
    if held:
        click.echo(
            f"held-out at target {held['target']}: pass {held['pass_rate']:.4f}, "
            f"cost/request ${held['cost']:.6f}"
        )
    if promise and promise.get("promised"):
        click.echo(
            f"held-out promise (pass >= target x reference): held at {promise['held']} of "
            f"{promise['promised']} certified targets on {promise['n']} requests, significantly "
            f"broken at {promise.get('contradicted', 0)}"
        )
    reuse = result.metrics.get("reuse")
    if reuse:
        age = reuse.get("age_days", {})
        click.echo(
            f"carried forward: {reuse['rows']} of {reuse['of']} outcome rows ({reuse['held_out_rows']} of "
            f"the {reuse['held_out_of']} held-out), measured a median {age.get('median', float('nan')):.1f} "
            f"and at most {age.get('max', float('nan')):.1f} days before the latest"
        )
    click.echo(latency_summary(result.policy, holdout.get("latency")))


def latency_summary(policy: Any, held_out: dict | None) -> str:
    """One line on the latency budgets a policy offers, and how they did on held-out requests."""
    lat = policy.latency
    if lat is None:
        why = policy.metrics.get("latency", {}).get("measurements")
        return (
            "latency budgets: none ("
            + ("too few latency measurements" if why else "the outcomes measured no latency")
            + ")"
        )
    offered = "; ".join(
        f"{kind} p95 {', '.join(f'{b:g}' for b in lat.budgets(kind))} s"
        for kind in lat.model.kinds
        if lat.budgets(kind)
    )
    line = f"latency budgets (over budget <= {lat.alpha:g} certified): {offered or 'none certified'}"
    if held_out and held_out.get("promised"):
        line += (
            f"; held-out: kept at {held_out['held']} of {held_out['promised']} certified "
            f"(budget, target) pairs on {held_out['n']} requests"
        )
    return line


def _traffic(path: Path) -> Any:
    """The unlabelled traffic sample of --traffic: decision logs, or a JSONL of prompts."""
    from routeopt.evals.storage.traffic import TrafficImportError, decisions_from_log
    from routeopt.router_training.fit.certificate import traffic_sample_of

    try:
        frame = decisions_from_log(path)
    except TrafficImportError:
        frame = None
    if frame is None or frame.empty:
        import pandas as pd

        from routeopt.evals.suite.datasets import jsonl_records

        rows = []
        for where, rec in jsonl_records(path):
            if isinstance(rec, str) or not isinstance(rec.get("prompt"), str):
                raise click.ClickException(
                    f"{where}: --traffic wants decision logs or lines with a string 'prompt'"
                )
            rows.append({"prompt": rec["prompt"], "suite": rec.get("suite")})
        frame = pd.DataFrame(rows)
    try:
        return traffic_sample_of(frame, source=str(path))
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


def _train(frame: Any, **kwargs: Any) -> Any:
    from routeopt.router_training.train import train_router

    try:
        return train_router(frame, **kwargs)
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None


@click.group("bench")
def bench() -> None:
    """Benchmarks that print figures: router quality (and serving speed where installed)."""


def _stored_frame(path: Path) -> Any:
    """The training frame `routeopt train` reads after `routeopt import outcomes path`."""
    from routeopt.evals.storage.importer import OutcomeImportError, training_frame_of

    try:
        return training_frame_of(path)
    except OutcomeImportError as exc:
        raise click.ClickException(str(exc)) from None


def _bench_sets(train_paths: tuple[Path, ...], test_paths: tuple[Path, ...], sets: Path | None) -> list:
    if len(train_paths) != len(test_paths):
        raise click.UsageError(f"give one --test per --train (got {len(train_paths)} and {len(test_paths)})")
    from routeopt.router_training.evaluation.bench import find_sets

    pairs = [(p.parent.name or p.stem, p, q) for p, q in zip(train_paths, test_paths)]
    if sets is not None:
        try:
            pairs += find_sets(sets)
        except ValueError as exc:
            raise click.ClickException(str(exc)) from None
    if not pairs:
        raise click.UsageError("give --sets FOLDER or --train FILE --test FILE (repeatable)")
    return pairs


@bench.command("router")
@click.option(
    "--train",
    "train_paths",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    multiple=True,
    help="Outcome file to train on (repeatable, paired with --test in order).",
)
@click.option(
    "--test",
    "test_paths",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    multiple=True,
    help="Outcome file to measure on, never trained on (repeatable).",
)
@click.option(
    "--sets",
    type=click.Path(path_type=Path, exists=True, file_okay=False),
    default=None,
    help="A folder of sets: every sub-folder with train.parquet and test.parquet.",
)
@click.option(
    "--plot",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the cost-quality points of every set to this PNG.",
)
@click.option(
    "--json",
    "json_path",
    type=click.Path(path_type=Path, dir_okay=False),
    default=None,
    help="Write the full report (curves included) as JSON.",
)
@click.option(
    "--holdout-fraction",
    type=float,
    default=0.3,
    show_default=True,
    help="As `routeopt train`: requests held out of training for the policy's own report.",
)
@click.option("--confidence", type=float, default=0.95, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option("--embeddings", is_flag=True, help="Add MiniLM sentence embeddings (the 'embeddings' extra).")
@click.option("--estimator", type=click.Choice(["linear", "lightgbm"]), default="linear", show_default=True)
@click.option(
    "--shift",
    "shifts",
    multiple=True,
    type=click.Choice(["all", "hard", "suites", "long"]),
    help="Also measure on the project's own shifted test sets (repeatable; 'all': every one): "
    "the default knob, the knob certified toward the shifted prompts (--traffic) and "
    "the robust knob (--robust).",
)
@click.option(
    "--robust",
    "robust_gamma",
    type=click.FloatRange(min=1.0),
    default=2.0,
    show_default=True,
    help="With --shift: the robust knob's gamma.",
)
def bench_router(
    train_paths: tuple[Path, ...],
    test_paths: tuple[Path, ...],
    sets: Path | None,
    plot: Path | None,
    json_path: Path | None,
    holdout_fraction: float,
    confidence: float,
    seed: int,
    embeddings: bool,
    estimator: str,
    shifts: tuple[str, ...],
    robust_gamma: float,
) -> None:
    """The quality knob on sets it never trained on, beside the reference and the zero router.

    Each set goes the user's way: its train file is imported into a fresh store and trained on
    as `routeopt train` does; every test request is routed at the targets 0 ... 1.1 as `routeopt
    route --quality-target` routes; the choices are scored against the test outcomes. With
    --shift, the same again on shifted test sets (`routeopt.router_training.evaluation.shift_bench`).
    """
    from routeopt.common.io import jsonable
    from routeopt.router_training.evaluation.bench import (
        format_set,
        format_summary,
        plot_sets,
        read_frame,
        run_set,
    )
    from routeopt.router_training.evaluation.shift_bench import (
        SHIFTS,
        format_shift_summary,
        format_shifts,
        run_shifts,
    )

    options = dict(
        holdout_fraction=holdout_fraction,
        seed=seed,
        embeddings=embeddings,
        estimator=estimator,
        confidence=confidence,
    )
    wanted = SHIFTS if "all" in shifts else tuple(s for s in SHIFTS if s in shifts)
    reports, shifted = [], []
    for name, train_path, test_path in _bench_sets(train_paths, test_paths, sets):
        frame = _stored_frame(train_path)
        fit = lambda f: _train(f, **options).policy
        try:
            report = run_set(name, frame, read_frame(test_path), fit)
            if wanted:
                certified = lambda f, cert: _train(f, certificate=cert, **options).policy
                shifted.append(
                    run_shifts(name, frame, read_frame(test_path), certified, wanted, robust_gamma, seed)
                )
        except ValueError as exc:
            raise click.ClickException(f"{test_path}: {exc}") from None
        click.echo(format_set(report) + "\n")
        if wanted:
            click.echo(format_shifts(shifted[-1]) + "\n")
        reports.append(report)
    click.echo(format_summary(reports))
    if shifted:
        click.echo("\n" + format_shift_summary(shifted))
        reports = [{**r, "shifts": s} for r, s in zip(reports, shifted)]
    if plot is not None:
        plot_sets(reports, plot)
        click.echo(f"plot: {plot}")
    if json_path is not None:
        atomic_write(json_path, json.dumps(jsonable(reports), indent=1))


def _load_policy(
    path: Path, keys: list | None, allow_unsigned: bool, default_model: str | None, channel: str | None = None
) -> tuple[Any, Any]:
    """(policy, gateway status). Registries and published versions go through the verifying
    gateway loader (a registry's `channel`, by default champion, else latest); the policy is None
    while it serves the default model. A bare folder written by `RoutingPolicy.save` has no
    signature, so it loads only with --allow-unsigned (status None)."""
    from routeopt.artifacts.serving.loader import load

    bare = (path / "policy.json").is_file() and not (path / "manifest.json").exists()
    if channel is not None and (bare or (path / "manifest.json").exists()):
        raise click.UsageError(f"--channel {channel}: {path} is one policy, not a registry")
    if bare:
        if not allow_unsigned:
            raise click.ClickException(
                f"{path}: a bare policy folder has no manifest or signature; "
                f"publish it to a registry, or pass --allow-unsigned"
            )
        from routeopt.router_training.policy.routing import RoutingPolicy

        return RoutingPolicy.load(path), None
    try:
        router = load(
            path,
            keys,
            channel=channel,
            allow_unsigned=allow_unsigned,
            default_model=default_model or "",
            state_dir=False,
        )
    except Exception as exc:  # the loader's errors name the problem; show them as-is
        raise click.ClickException(str(exc)) from None
    status = router.status()
    return (None if status.serving_default else router.policy), status


def _requests(path: Path) -> Iterator[tuple[int, dict]]:
    from routeopt.evals.suite.datasets import jsonl_records

    for where, rec in jsonl_records(path):
        if isinstance(rec, str):
            raise click.ClickException(f"{where}: {rec}")
        if not isinstance(rec.get("prompt"), str):
            raise click.ClickException(f"{where}: needs a string field 'prompt'")
        suite = rec.get("suite")
        if suite is not None and not isinstance(suite, str):
            raise click.ClickException(f"{where}: field 'suite' must be a string")
        yield int(where.rpartition(":")[2]), rec


def _write_decisions(path: Path, rows: list[dict]) -> None:
    atomic_write(path, "".join(json.dumps(row) + "\n" for row in rows))


@click.command("route")
@click.argument("text", required=False)
@click.option(
    "--policy",
    "policy_path",
    type=click.Path(path_type=Path, exists=True),
    default=None,
    help="Registry folder or a version folder (default: registry_dir from the config).",
)
@click.option(
    "--channel",
    default=None,
    help="The registry channel to route with (champion, candidate, latest; default: champion, else latest).",
)
@click.option(
    "--input",
    "input_path",
    type=click.Path(path_type=Path, exists=True, dir_okay=False),
    help='JSONL of {"id", "prompt", "suite"?}.',
)
@click.option(
    "--output",
    "output_path",
    type=click.Path(path_type=Path, dir_okay=False),
    help='JSONL of {"id", "model"} (default: stdout).',
)
@click.option("--suite", default=None, help="Suite of TEXT, when routing one prompt.")
@click.option("--quality-target", type=float, default=None, help="Override the policy's target.")
@click.option(
    "--ttft-budget",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="Seconds to first token (p95) the choice must keep (policies trained on timed outcomes).",
)
@click.option(
    "--latency-budget",
    type=click.FloatRange(0, min_open=True),
    default=None,
    help="End-to-end seconds (p95) the choice must keep (not with --ttft-budget).",
)
@click.option(
    "--public-key",
    "public_keys",
    multiple=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Trusted Ed25519 public key (default: $ROUTEOPT_PUBLIC_KEY, else public_key.pem "
    "beside the config's signing key).",
)
@click.option(
    "--allow-unsigned", is_flag=True, help="Load without checking signatures when no public key is found."
)
@click.option(
    "--default-model",
    envvar="ROUTEOPT_DEFAULT_MODEL",
    default=None,
    help="Route to this model when no valid policy is there (expired, refused), saying why "
    "on stderr (default: $ROUTEOPT_DEFAULT_MODEL; without it such a policy is an error).",
)
@CONFIG_OPTION
def route(
    text: str | None,
    policy_path: Path | None,
    channel: str | None,
    input_path: Path | None,
    output_path: Path | None,
    suite: str | None,
    quality_target: float | None,
    ttft_budget: float | None,
    latency_budget: float | None,
    public_keys: tuple[Path, ...],
    allow_unsigned: bool,
    default_model: str | None,
    config_path: Path | None,
) -> None:
    """Route one TEXT, or every request of --input, with a published policy (verified)."""
    from routeopt.flows.commands.artifacts import _default_registry

    if (text is None) == (input_path is None):
        raise click.UsageError("give either TEXT or --input FILE")
    if ttft_budget is not None and latency_budget is not None:
        raise click.UsageError("give --ttft-budget or --latency-budget, not both")
    budget = {"ttft_budget_s": ttft_budget, "latency_budget_s": latency_budget}
    policy_path = Path(policy_path or _default_registry(config_path))
    if not policy_path.exists():
        raise click.ClickException(
            f"{policy_path}: no policy registry; run `routeopt run` or "
            "`routeopt train` first, or give --policy"
        )
    bare = (policy_path / "policy.json").is_file() and not (policy_path / "manifest.json").exists()
    keys = None if bare else verification_keys(public_keys, config_path, allow_unsigned)
    policy, status = _load_policy(policy_path, keys, allow_unsigned, default_model, channel)
    if policy is None:
        click.echo(
            f"warning: routing everything to the default model {status.default_model}: "
            f"{status.default_reason}",
            err=True,
        )
    if text is not None:
        if policy is None:
            click.echo(
                json.dumps(
                    {
                        "model": status.default_model,
                        "fallbacks": [],
                        "pass_probabilities": {},
                        "expected_cost_usd": {},
                        "default_reason": status.default_reason,
                    }
                )
            )
            return
        d = _budgeted(
            lambda: policy.decide(
                text, suite=suite, quality_target=quality_target, use_defaults=True, **budget
            )
        )
        out = {
            "model": d.model,
            "fallbacks": list(d.fallbacks),
            "pass_probabilities": d.pass_probabilities,
            "expected_cost_usd": d.expected_cost_usd,
            "propensity": d.propensity,
        }
        if d.budget is not None:
            out["budget"] = dataclasses.asdict(d.budget)
        click.echo(json.dumps(out))
        return
    records = list(_requests(input_path))
    prompts, suites = [r["prompt"] for _, r in records], [r.get("suite") for _, r in records]
    if policy is None:
        decisions = None
        models = [status.default_model] * len(records)
    else:
        decisions = _budgeted(
            lambda: policy.decide_batch(prompts, suites, quality_target, use_defaults=True, **budget)
        )
        models = [d.model for d in decisions]
    rows = [{"id": r.get("id", line_no), "model": m} for (line_no, r), m in zip(records, models)]
    if decisions is not None:
        for row, d in zip(rows, decisions):
            if d.budget is not None:
                row["budget_met"] = d.budget.met
    if output_path is None:
        for row in rows:
            sys.stdout.write(json.dumps(row) + "\n")
    else:
        _write_decisions(output_path, rows)
        click.echo(f"routed {len(rows)} requests -> {output_path}")


def _budgeted(decide: Callable[[], Any]) -> Any:
    """A decision under a budget the policy may not serve: its ValueError as a usage error."""
    try:
        return decide()
    except ValueError as exc:
        raise click.ClickException(str(exc)) from None
