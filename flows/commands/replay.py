"""`routeopt bench replay`: logged traffic sent again, open loop, at 1x, 2x, ... or a sweep for the
highest speed that still meets the SLO (`routeopt.evals.selfhost.replay`). Joins the `bench` group."""

from __future__ import annotations

import asyncio
import json
import signal
from pathlib import Path
from typing import Any

import click

from routeopt.common.io import atomic_write
from routeopt.flows.commands import CONFIG_OPTION, DB_OPTION, load_config_or_exit, open_store
from routeopt.flows.commands.gpu import bench


def _speeds(text: str | None) -> list[float] | None:
    if not text:
        return None
    try:
        speeds = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        speeds = []
    if not speeds or any(s <= 0 for s in speeds):
        raise click.BadParameter(f"{text!r}: give positive speeds, e.g. 1,2,5", param_hint="--speed")
    return speeds


def _mapping(pairs: tuple[str, ...]) -> dict[str, str]:
    out = {}
    for p in pairs:
        logged, sep, cand = p.partition("=")
        if not sep or not logged or not cand:
            raise click.BadParameter(f"{p!r}: write LOGGED=CANDIDATE", param_hint="--model")
        out[logged] = cand
    return out


@bench.command("replay")
@click.argument("log", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
@CONFIG_OPTION
@DB_OPTION
@click.option(
    "--speed",
    "speeds",
    default=None,
    help="Comma-separated speeds (1 = as logged). Default: a sweep for the highest speed that meets the SLO.",
)
@click.option("--sweep-start", type=float, default=1.0, show_default=True)
@click.option("--max-speed", type=float, default=64.0, show_default=True)
@click.option(
    "--sweep-steps",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Bisection steps between the last speed that met the SLO and the first that did not.",
)
@click.option(
    "--sweep-probes",
    type=click.IntRange(min=1),
    default=3,
    show_default=True,
    help="Probes per speed at most; the majority decides whether it met the SLO (near the break "
    "a busy machine's probes land on either side of it).",
)
@click.option(
    "--pin/--no-pin",
    default=True,
    show_default=True,
    help="With local candidates and two CPUs or more: the generator on one CPU, the engines on the "
    "others, so neither takes the other's core.",
)
@click.option("--candidate", "only", default=None, help="Send every arrival to this candidate.")
@click.option(
    "--model",
    "maps",
    multiple=True,
    help="LOGGED=CANDIDATE (repeatable; a trace's suite-only rows are keyed suite:NAME).",
)
@click.option("--skip-unknown", is_flag=True, help="Leave out arrivals whose model is no candidate.")
@click.option("--ttft-target-s", type=float, default=None, help="SLO: time to first token.")
@click.option("--latency-target-s", type=float, default=None, help="SLO: end-to-end latency.")
@click.option(
    "--min-good",
    type=float,
    default=0.9,
    show_default=True,
    help="Share of requests that must meet the targets for a speed to pass.",
)
@click.option(
    "--max-gap-s",
    type=float,
    default=60.0,
    show_default=True,
    help="Idle gaps longer than this are shortened to it (0: keep every gap).",
)
@click.option("--duration-s", type=float, default=None, help="Replay only the log's first N seconds.")
@click.option(
    "--output-tokens",
    type=click.IntRange(min=1),
    default=None,
    help="Output length for arrivals whose model has no logged counts at all.",
)
@click.option("--timeout-s", type=float, default=60.0, show_default=True, help="Per request.")
@click.option(
    "--max-lateness-ms",
    type=float,
    default=10.0,
    show_default=True,
    help="Send lateness p99 above this marks a speed generator-limited.",
)
@click.option(
    "--warmup",
    type=click.IntRange(min=0),
    default=3,
    show_default=True,
    help="Unmeasured requests per candidate first (a local model loads then).",
)
@click.option("--json-out", type=click.Path(dir_okay=False, path_type=Path), default=None)
@click.option("--no-store", is_flag=True, help="Print only; write nothing to DuckDB.")
def replay_cmd(
    log: tuple[Path, ...],
    config_path: Path | None,
    db_path: Path | None,
    speeds: str | None,
    sweep_start: float,
    max_speed: float,
    sweep_steps: int,
    sweep_probes: int,
    pin: bool,
    only: str | None,
    maps: tuple[str, ...],
    skip_unknown: bool,
    ttft_target_s: float | None,
    latency_target_s: float | None,
    min_good: float,
    max_gap_s: float,
    duration_s: float | None,
    output_tokens: int | None,
    timeout_s: float,
    max_lateness_ms: float,
    warmup: int,
    json_out: Path | None,
    no_store: bool,
) -> None:
    """Replay decision logs or an arrival trace (timestamp, model or suite, input_tokens,
    output_tokens, text?) against the configured candidates, open loop, and report per model
    and overall: offered vs achieved rate, TTFT / TPOT / ITL / end-to-end p50, p95, p99,
    goodput, errors by kind, queueing delay and the generator's own lateness."""
    from routeopt.evals.selfhost.arrivals import ReplayInputError, load_arrivals
    from routeopt.evals.selfhost.replay import Slo

    speed_list = _speeds(speeds)
    cfg = load_config_or_exit(config_path)
    try:
        arrivals = load_arrivals(
            list(log),
            [c.name for c in cfg.candidates],
            mapping=_mapping(maps),
            only=only,
            skip_unknown=skip_unknown,
            max_gap_s=max_gap_s or None,
            default_output_tokens=output_tokens,
            limit_s=duration_s,
        )
    except ReplayInputError as exc:
        raise click.ClickException(str(exc)) from None
    click.echo(
        f"{len(arrivals.items)} arrivals over {arrivals.duration_s:,.1f} s for "
        f"{', '.join(arrivals.models())}",
        err=True,
    )
    for note in arrivals.notes:
        click.echo(f"  note: {note}", err=True)
    slo = Slo(ttft_target_s, latency_target_s, min_good)
    results, replay_id = _run(
        cfg,
        arrivals,
        slo,
        speed_list,
        (sweep_start, max_speed, sweep_steps, sweep_probes),
        timeout_s,
        max_lateness_ms / 1000,
        None if no_store else (db_path or cfg.db_path),
        warmup,
        pin,
    )
    _finish(results, replay_id, slo, speeds is None, json_out)


def _run(
    cfg: Any,
    arrivals: Any,
    slo: Any,
    speeds: list[float] | None,
    sweep_opts: tuple,
    timeout_s: float,
    max_lateness_s: float,
    db: Path | None,
    warmup: int,
    pin: bool,
) -> tuple[list, str]:
    from routeopt.evals.selfhost.replay import (
        cpu_split,
        make_sender,
        pinned,
        replay_once,
        summaries,
        sweep,
        warm_up,
    )
    from routeopt.evals.selfhost.replay_store import (
        format_speed,
        new_replay_id,
        request_frame,
        run_rows,
        save,
    )

    replay_id = new_replay_id()
    window = min(60.0, max(1.0, arrivals.duration_s / 10))
    source = ", ".join(arrivals.sources)
    local = [m for m in arrivals.models() if cfg.candidate(m).provider == "local"]
    generator_cpus, engine_cpus = (cpu_split(len(local)) if pin else None) or (None, None)
    if generator_cpus:
        click.echo(
            f"generator on CPU {_cpus(generator_cpus)}, local engines ({', '.join(local)}) on CPU "
            f"{_cpus(engine_cpus)} (--no-pin to leave them to the scheduler)",
            err=True,
        )

    async def main() -> list:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)
        senders = {m: make_sender(cfg.candidate(m), engine_cpus) for m in arrivals.models()}
        await warm_up(senders, arrivals.items, warmup)  # a local model loads before the clock starts
        probes: dict[float, int] = {}

        async def run_at(speed: float) -> tuple:
            if stop.is_set():
                raise asyncio.CancelledError
            run = await replay_once(arrivals.items, speed, senders, timeout_s=timeout_s, stop=stop)
            figures = summaries(run, slo, max_lateness_s, window)
            probe = probes[speed] = probes.get(speed, -1) + 1
            click.echo(format_speed(run, figures, probe))
            if db is not None:  # each probe is kept as soon as it is measured
                with open_store(Path(db), read_only=False) as store:
                    save(
                        store,
                        run_rows(replay_id, run, figures, slo, source, arrivals.notes, probe),
                        request_frame(replay_id, run, probe),
                    )
            return run, figures

        done: list = []
        try:
            done = await sweep(
                run_at,
                speeds,
                start=sweep_opts[0],
                max_speed=sweep_opts[1],
                steps=sweep_opts[2],
                probes=sweep_opts[3],
            )
        except asyncio.CancelledError:
            click.echo("interrupted: the speeds measured so far are kept", err=True)
        finally:
            for s in senders.values():
                s.close()
        return done

    with pinned(generator_cpus):
        return asyncio.run(main()), replay_id


def _cpus(cpus: set[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def _finish(results: list, replay_id: str, slo: Any, swept: bool, json_out: Path | None) -> None:
    from routeopt.evals.selfhost.replay import disagreement, highest_meeting, lowest_breaking

    best, broke, band = highest_meeting(results), lowest_breaking(results), disagreement(results)
    targets = slo.ttft_s is not None or slo.latency_s is not None
    if targets:
        verdict = "no speed met the SLO" if best is None else f"highest speed meeting the SLO: {best:g}x"
        click.echo(
            f"{verdict} ({slo.min_good:.0%} of requests within "
            f"{'TTFT ' + format(slo.ttft_s, 'g') + ' s' if slo.ttft_s is not None else ''}"
            f"{' and ' if slo.ttft_s is not None and slo.latency_s is not None else ''}"
            f"{'latency ' + format(slo.latency_s, 'g') + ' s' if slo.latency_s is not None else ''})"
        )
        if broke is not None:
            click.echo(f"the SLO broke at {broke:g}x")
        if band is not None:
            click.echo(
                f"probes from {band[0]:g}x to {band[1]:g}x disagreed (some met the SLO, some broke it): "
                "on this machine, at this time, the break is only known to lie in that band"
            )
    elif swept:
        click.echo(
            "no --ttft-target-s or --latency-target-s: the sweep stops where the generator "
            "or the endpoint gave out"
        )
    click.echo(f"replay id {replay_id}")
    if json_out is not None:
        payload = {
            "replay_id": replay_id,
            "highest_speed_meeting_slo": best,
            "slo_broken_at_speed": broke,
            "probes_disagree_between": list(band) if band else None,
            "speeds": [
                {
                    "speed": run.speed,
                    "probe": [r.speed for r, _ in results[:i]].count(run.speed),
                    "status": run.status,
                    "down": run.down,
                    "figures": f,
                }
                for i, (run, f) in enumerate(results)
            ],
        }
        atomic_write(json_out, json.dumps(payload, indent=2, default=str))
