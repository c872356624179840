"""`routeopt bench serving` and `routeopt cost compare`: self-hosted speed, and what it costs.

`bench` is shared with the router's `bench router`: if `routeopt.flows.commands.router` defines a `bench`
group, `serving` joins it; otherwise this module owns the group. Either way one object is
registered, so both commands appear under one `routeopt bench`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import json
from importlib import import_module
from pathlib import Path
from typing import Any

import click

from routeopt.common.io import atomic_write
from routeopt.flows.commands import CONFIG_OPTION, DB_OPTION, console, load_config_or_exit, open_store


def _bench_group() -> click.Group:
    """The one `bench` group: the router helper's when its module has it, else a new one."""
    if importlib.util.find_spec("routeopt.flows.commands.router") is not None:
        group = getattr(import_module("routeopt.flows.commands.router"), "bench", None)
        if isinstance(group, click.Group):
            return group

    @click.group("bench")
    def bench() -> None:
        """Benchmarks that print figures: serving speed (and the router's, where installed)."""

    return bench


def _floats(text: str | None, option: str) -> list[float]:
    if not text:
        return []
    try:
        return [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise click.BadParameter(
            f"{text!r} is not a comma-separated list of numbers", param_hint=option
        ) from None


def _make_provider(candidate: Any, max_batch: int | None) -> Any:
    from routeopt.evals.providers import make_provider

    if max_batch and candidate.provider == "local":
        from routeopt.evals.providers.local.provider import LocalProvider

        return LocalProvider(candidate, max_batch=max_batch)
    return make_provider(candidate)


def _print_levels(report: Any) -> None:
    from rich.table import Table

    from routeopt.evals.selfhost.serving import TABLE_COLUMNS, table_cells

    table = Table(title=f"serving: {report.candidate} ({report.bench_id})")
    for col in TABLE_COLUMNS:
        table.add_column(col, justify="right")
    for lv in report.levels:
        table.add_row(*table_cells(lv))
    console().print(table)


@click.command("serving")
@click.option("--candidate", "candidate_name", required=True, help="Candidate name in the config.")
@click.option(
    "--concurrency",
    "levels",
    default="1,8,32,128",
    show_default=True,
    help="Comma-separated numbers of requests kept in flight.",
)
@click.option(
    "--prompts",
    "prompts_path",
    required=True,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Suite YAML, JSONL ({prompt|messages, max_tokens?}) or one prompt per line.",
)
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--requests",
    "n_requests",
    type=click.IntRange(min=1),
    default=None,
    help="Requests per level (default max(2c, 16); never fewer than c).",
)
@click.option(
    "--max-tokens", type=click.IntRange(min=1), default=None, help="Override every prompt's max_tokens."
)
@click.option("--latency-target-s", type=float, default=None, help="Goodput SLO on latency.")
@click.option("--ttft-target-s", type=float, default=None, help="Goodput SLO on TTFT.")
@click.option("--tpot-target-s", type=float, default=None, help="Goodput SLO on TPOT.")
@click.option(
    "--max-batch",
    type=click.IntRange(min=1),
    default=None,
    help="Local candidates: largest batch the in-process batcher forms.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=1,
    show_default=True,
    help="Unmeasured requests first (the local provider loads its model then).",
)
@click.option(
    "--json-out",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Also write the figures to this JSON file.",
)
@click.option("--no-store", is_flag=True, help="Print only; write nothing to DuckDB.")
@click.option(
    "--draft-baseline/--no-draft-baseline",
    default=True,
    show_default=True,
    help="For a candidate with a draft model: also measure it without the draft.",
)
def serving_cmd(
    candidate_name: str,
    levels: str,
    prompts_path: Path,
    config_path: Path | None,
    db_path: Path | None,
    n_requests: int | None,
    max_tokens: int | None,
    latency_target_s: float | None,
    ttft_target_s: float | None,
    tpot_target_s: float | None,
    max_batch: int | None,
    warmup: int,
    json_out: Path | None,
    no_store: bool,
    draft_baseline: bool,
) -> None:
    """Measure TTFT, TPOT, inter-token latency, tokens/s and goodput at fixed concurrencies.

    Works for a `local` candidate (in-process checkpoint) and any OpenAI-compatible server (an
    `openai` candidate with base_url). Rows go to the `serving_runs` table of the DuckDB store.
    A candidate with a draft model (`speculative:`) also gets the draft's acceptance rate and
    mean accepted length, and is measured again without the draft (stored as `NAME:no-draft`)
    for the speed-up at each concurrency.
    """
    from routeopt.evals.selfhost.serving import (
        ServingError,
        Targets,
        bench_serving,
        load_prompts,
        parse_levels,
        save_report,
        without_draft,
    )

    cfg = load_config_or_exit(config_path)
    try:
        candidate = cfg.candidate(candidate_name)
        requests = load_prompts(prompts_path, max_tokens)
        level_list = parse_levels(levels)
    except (KeyError, ServingError) as exc:
        raise click.ClickException(str(exc).strip("'\"")) from None
    targets = Targets(latency_target_s, ttft_target_s, tpot_target_s)
    runs = [candidate]
    if candidate.speculative is not None and draft_baseline:
        runs.append(without_draft(candidate))
    reports = [
        asyncio.run(
            bench_serving(
                c,
                requests,
                level_list,
                n_requests,
                targets,
                provider=_make_provider(c, max_batch),
                prompts_label=str(prompts_path),
                warmup=warmup,
                on_level=lambda lv, c=c: click.echo(
                    f"  {c.name} c={lv.concurrency}: {lv.output_tok_s:.1f} out tok/s, {lv.errors} errors",
                    err=True,
                ),
            )
        )
        for c in runs
    ]
    for report in reports:
        _print_levels(report)
    if len(reports) == 2:
        _print_speedups(*reports)
    if json_out:
        _atomic_json(json_out, _report_json(*reports))
    if not no_store:
        path = Path(db_path) if db_path else cfg.db_path
        with open_store(path, read_only=False) as store:
            for report in reports:  # one benchmark: the pair shares its id
                report.bench_id = reports[0].bench_id
                save_report(store, report)
        rows = sum(len(r.levels) for r in reports)
        click.echo(f"stored {rows} rows in {path} (bench_id {reports[0].bench_id})")


def _print_speedups(report: Any, baseline: Any) -> None:
    from routeopt.evals.selfhost.serving import speedups

    parts = ", ".join(f"c={c}: {x:.2f}x" for c, x in speedups(report, baseline).items())
    click.echo(f"speculative decoding, output tok/s with the draft / without: {parts}")


def _report_json(report: Any, baseline: Any = None) -> dict:
    from routeopt.evals.selfhost.serving import report_json, speedups

    out = report_json(report)
    if baseline is not None:
        out["without_draft"] = report_json(baseline)
        out["speedup_by_concurrency"] = speedups(report, baseline)
    return out


def _atomic_json(path: Path, payload: dict) -> None:
    atomic_write(path, json.dumps(payload, indent=2, sort_keys=True, default=str))


bench = _bench_group()
bench.add_command(serving_cmd)


@click.group("cost")
def cost() -> None:
    """What self-hosted candidates cost per token, beside the API candidates' list prices."""


@cost.command("compare")
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--utilization",
    "utils",
    default="0.1,0.25,0.5,1",
    show_default=True,
    help="Utilisations to price at (share of paid GPU hours spent serving).",
)
@click.option(
    "--input-per-output",
    type=float,
    default=None,
    help="Input tokens per output token for API prices (default: the benchmark's).",
)
@click.option(
    "--min-good",
    type=float,
    default=0.9,
    show_default=True,
    help="A level counts as capacity only if this share of requests met the targets.",
)
@click.option(
    "--run-id",
    default=None,
    help="Run whose prompt caching to show (default: the latest run in the database).",
)
def compare(
    config_path: Path | None,
    db_path: Path | None,
    utils: str,
    input_per_output: float | None,
    min_good: float,
    run_id: str | None,
) -> None:
    """$/Mtok of each self-hosted candidate per concurrency and utilisation, API list prices,
    the daily output-token volume above which self-hosting is cheaper, and what prompt caching
    saved in a run (tokens, and input $ against the same calls without caching)."""
    from routeopt.evals.selfhost.costmodel import compare as compare_costs
    from routeopt.evals.selfhost.costmodel import load_caching, load_curve
    from routeopt.reports.summary import caching_table

    cfg = load_config_or_exit(config_path)
    path = Path(db_path) if db_path else cfg.db_path
    if not path.exists():
        raise click.ClickException(f"{path}: no database; run `routeopt bench serving` first")
    utilizations = _floats(utils, "--utilization")
    if not utilizations or any(not 0 < u <= 1 for u in utilizations):
        raise click.BadParameter("utilisations must be in (0, 1]", param_hint="--utilization")
    with open_store(path, read_only=True) as store:
        curves = {c.name: load_curve(store, c.name) for c in cfg.candidates if c.gpu_hour_usd is not None}
        run_id = run_id or _latest_run(store)
        caching = caching_table(load_caching(store, run_id, cfg.candidates)) if run_id else None
    out = console()
    if caching is not None:
        caching.title = f"run {run_id}: {caching.title}"
        out.print(caching)
    if not any(curves.values()):
        if caching is not None:
            return
        raise click.ClickException(
            f"{path}: no serving benchmark for any GPU-priced candidate "
            f"({', '.join(curves) or 'none in the config'}); run `routeopt bench serving` first"
        )
    summaries, verdicts = compare_costs(cfg.candidates, curves, utilizations, input_per_output, min_good)
    _print_comparison(out, summaries, verdicts, [c for c in cfg.candidates if c.gpu_hour_usd is None])


def _latest_run(store: Any) -> str | None:
    """The most recently started run in the store, if it has any."""
    with store._lock:
        has_runs = store._con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = 'runs'"
        ).fetchone()[0]
    if not has_runs:
        return None
    latest = store.query("SELECT run_id FROM runs ORDER BY started_at DESC LIMIT 1")
    return None if latest.empty else str(latest.iloc[0]["run_id"])


def _usd(x: float) -> str:
    return "inf" if x == float("inf") else f"{x:,.3f}"


def _print_comparison(console: Any, summaries: list, verdicts: list, apis: list) -> None:
    for s in summaries:
        _print_selfhosted(console, s)
    if apis:
        first = next((s for s in summaries if s.input_per_output), None)
        _print_api(
            console, apis, first.input_per_output if first else 0.0, first.candidate if first else "none"
        )
    if verdicts:
        _print_verdicts(console, verdicts)


def _print_selfhosted(console: Any, s: Any) -> None:
    from rich.table import Table

    utils = sorted({r.utilization for r in s.table})
    t = Table(title=f"{s.candidate}: $/Mtok output at ${s.gpu_hour_usd:g}/GPU-hour")
    for col in ("concurrency", "out tok/s", "met targets", *(f"util {u:g}" for u in utils)):
        t.add_column(col, justify="right")
    for conc in sorted({r.concurrency for r in s.table}):
        rows = {r.utilization: r for r in s.table if r.concurrency == conc}
        good = s.good_fraction.get(conc)
        t.add_row(
            str(conc),
            f"{rows[utils[0]].output_tok_s:.1f}",
            "-" if good is None else f"{good:.0%}",
            *(_usd(rows[u].usd_per_mtok) for u in utils),
        )
    console.print(t)
    conf = "-" if s.configured_usd_per_mtok is None else _usd(s.configured_usd_per_mtok)
    console.print(
        f"  capacity {s.capacity_tok_s:.1f} out tok/s (levels meeting the targets); at "
        f"the configured utilisation {s.utilization:g} and concurrency: ${conf}/Mtok"
    )


def _print_api(console: Any, apis: list, ratio: float, source: str) -> None:
    from rich.table import Table

    from routeopt.evals.selfhost.costmodel import api_usd_per_mtok

    t = Table(title="API list prices ($/Mtok)")
    for col in ("candidate", "input", "cache read", "cache write", "output", "output incl. input"):
        t.add_column(col, justify="right")
    for a in apis:
        read, write = a.cache_prices()
        t.add_row(
            a.name,
            _usd(a.input_price_per_mtok or 0.0),
            _usd(read),
            _usd(write),
            _usd(a.output_price_per_mtok or 0.0),
            _usd(api_usd_per_mtok(a, ratio)),
        )
    console.print(t)
    console.print(
        f"  'output incl. input' adds {ratio:.2f} input tokens per output token (from "
        f"{source}'s benchmark, or --input-per-output); the break-even table uses each "
        "self-hosted candidate's own ratio"
    )


def _print_verdicts(console: Any, verdicts: list) -> None:
    from rich.table import Table

    t = Table(title="Break-even: daily output tokens above which self-hosting is cheaper")
    for col in ("self-hosted", "vs API", "API $/Mtok", "self $/Mtok @100%", "first", "always"):
        t.add_column(col, justify="right")
    for v in verdicts:
        be = v.break_even
        t.add_row(
            v.self_hosted,
            v.api,
            _usd(v.api_usd_per_mtok),
            _usd(v.self_usd_per_mtok_full_load),
            "never" if be is None else f"{be.first_tok_per_day:,.0f}",
            "never" if be is None else f"{be.always_tok_per_day:,.0f}",
        )
    console.print(t)
    console.print(
        "  first: one GPU 24/7 becomes cheaper; always: cheaper at every larger volume "
        "(each added GPU is a step of fixed cost)"
    )
