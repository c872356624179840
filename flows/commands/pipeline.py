"""`routeopt run` and `routeopt eval`: the nightly pipeline, whole or its evaluation stage."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

import click

from routeopt.evals.config import ConfigError, default_config_path
from routeopt.flows.commands import CONFIG_OPTION, console, load_config_or_exit
from routeopt.flows.commands.run_checks import (
    Heartbeat,
    batch_for_run,
    quiet_tracebacks,
    refuse_changed_resume,
    refuse_unset_keys,
    report_probes,
    resume_hint,
    run_id_for,
    store_of,
)

# After SIGINT/SIGTERM, how long the in-flight calls get to wind down before the process exits
# regardless (Kubernetes sends SIGKILL 30 s after SIGTERM by default).
SHUTDOWN_GRACE_S = 10.0
DEFAULT_CACHE_AGE = "1d"  # how old a replayed answer may be with a bare --cache

if TYPE_CHECKING:
    from routeopt.reports.summary import RunResult


def _common(fn: Any) -> Any:
    fn = CONFIG_OPTION(fn)
    fn = click.option(
        "--run-id",
        default=None,
        help="Name a new run (default: a new id); an id the database has is refused.",
    )(fn)
    fn = click.option(
        "--resume",
        default=None,
        metavar="ID",
        help="Resume the interrupted run ID of this database: only its missing items "
        "are called. An id the database does not have is refused.",
    )(fn)
    fn = click.option("--db", "db_path", default=None, help="DuckDB file (default: from config).")(fn)
    fn = click.option("--suite", "suites", multiple=True, help="Only these suites (repeatable).")(fn)
    fn = click.option("--candidate", "candidates", multiple=True, help="Only these candidates (repeatable).")(
        fn
    )
    fn = click.option(
        "--batch",
        "batch",
        multiple=True,
        metavar="NAME",
        help="Answer this candidate's items through its provider's Batch API in this run, at "
        "batch prices (repeatable; `all`: every openai and anthropic candidate priced by tokens). "
        "Its `batch:` settings apply, else the defaults. A resume keeps the run's choice.",
    )(fn)
    fn = click.option("--no-progress", is_flag=True, help="Do not draw progress bars.")(fn)
    fn = click.option(
        "--cache",
        "cache",
        is_flag=True,
        help=f"Development runs: replay answers that earlier runs recorded up to "
        f"{DEFAULT_CACHE_AGE} ago instead of calling the models (they count in pass rates, "
        "not in cost or latency). Off by default: every model is called again.",
    )(fn)
    fn = click.option(
        "--cache-max-age",
        "cache_max_age",
        default=None,
        callback=_check_age,
        metavar="AGE",
        help="Like --cache, with this age limit (e.g. 30m, 12h, 1d).",
    )(fn)
    fn = click.option(
        "--skip-broken",
        is_flag=True,
        help="Go on without the candidates that fail their preflight (or whose every call gets "
        "the same error): they are left out of training and the policy, and the run still "
        "exits non-zero (default: preflight.skip_broken from the config).",
    )(fn)
    fn = click.option(
        "--no-preflight", is_flag=True, help="Do not probe each candidate before the first suite."
    )(fn)
    fn = click.option("--debug", is_flag=True, help="Show tracebacks (default: one sentence per error).")(fn)
    return fn


def _check_age(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from routeopt.evals.execution.cache import parse_age

    if value is not None:
        try:
            parse_age(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@contextmanager
def _progress(enabled: bool, count: Any) -> Iterator[str | None]:
    """A rich progress bar per (suite x candidate), fed by the flow's tasks in this process;
    `count(suite, candidate, advance, total)` sees every advance (the heartbeat)."""
    from routeopt.flows import nightly

    key = f"cli-{os.getpid()}"
    if not enabled:
        nightly._PROGRESS[key] = count
        try:
            yield key
        finally:
            nightly._PROGRESS.pop(key, None)
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    bars: dict[tuple[str, str], Any] = {}
    lock = threading.Lock()
    progress = Progress(
        TextColumn("{task.description:<28}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        transient=False,
    )

    def hook(suite: str, candidate: str, advance: int, total: int) -> None:
        count(suite, candidate, advance, total)
        with lock:
            pair = (suite, candidate)
            if pair not in bars:
                bars[pair] = progress.add_task(f"{suite} x {candidate}", total=total)
        progress.advance(bars[pair], advance)

    nightly._PROGRESS[key] = hook
    with progress:
        try:
            yield key
        finally:
            nightly._PROGRESS.pop(key, None)


def _run_flow(command: str, train: bool, publish: bool, **kw: Any) -> None:
    started = time.perf_counter()
    # Everything that can be wrong with the command line fails here, before anything slow.
    cfg = load_config_or_exit(kw.pop("config_path") or default_config_path())
    _check_names(cfg, kw["suites"], kw["candidates"])
    skip = kw["skip_broken"] or cfg.preflight.skip_broken
    db = Path(kw["db_path"]).resolve() if kw["db_path"] else cfg.db_path
    run_id = run_id_for(db, kw["run_id"], kw["resume"])
    cfg = batch_for_run(cfg, db, kw)
    chosen = [cfg.candidate(n) for n in kw["candidates"]] if kw["candidates"] else list(cfg.candidates)
    refuse_unset_keys(chosen, skip)
    if kw["resume"]:
        refuse_changed_resume(cfg, db, kw["resume"], list(kw["suites"]) or None, chosen)
    shutdown = _Shutdown()
    from routeopt.evals.execution.preflight import PreflightFailed
    from routeopt.evals.storage.store import ResumeConflict
    from routeopt.flows.prefect_api import ServerError

    try:
        result = _run_nightly(
            cfg, shutdown, run=(command, db, run_id, chosen, skip), train=train, publish=publish, **kw
        )
    except (ConfigError, ServerError, ResumeConflict, PreflightFailed) as exc:
        raise click.ClickException(str(exc)) from None
    except Interrupted as stop:
        shutdown.exit(stop.signum)
    except click.ClickException:
        raise
    except Exception as exc:
        from routeopt.flows.nightly import RunIncomplete

        if kw["debug"] and not isinstance(exc, RunIncomplete):
            raise
        tail = (
            "" if isinstance(exc, RunIncomplete) else f" ({type(exc).__name__}; --debug shows the traceback)"
        )
        raise click.ClickException(f"{exc}{tail}") from None
    finally:
        if shutdown.signum is None:
            shutdown.restore()
    _summarise(result, started, shutdown.hint)


def _summarise(result: RunResult, started: float, hint: str | None) -> None:
    """The summary of what ran; then each thing that went wrong, one sentence each, last; exit
    non-zero when anything did (a suite that did not load, a misconfigured, skipped or halted
    candidate, a policy held back or refused)."""
    from routeopt.evals.selfhost.costmodel import load_caching
    from routeopt.flows.nightly import shared_store
    from routeopt.evals.execution.batch import batch_summary
    from routeopt.reports.summary import candidate_table, error_rows, modes_table, print_summary

    out = console()
    store = shared_store(Path(result.db_path))
    rows = candidate_table(store, result.run_id)
    print_summary(
        out, rows, result, load_caching(store, result.run_id), errors=error_rows(store, result.run_id)
    )
    modes = modes_table(batch_summary(store, result.run_id))
    if modes is not None:
        out.print(modes)
    out.print(f"wall time: {time.perf_counter() - started:.1f}s  db: {result.db_path}")
    problems = _problems(result, hint)
    for sentence in problems:
        click.echo(f"Error: {sentence}", err=True)
    if problems or result.suite_errors:
        sys.exit(1)


def _problems(result: RunResult, hint: str | None) -> list[str]:
    """One sentence per reason this run needs a person (the suites' errors are in the summary)."""
    out = [r["message"] for r in result.refused or []]
    if result.misconfigured:
        names = ", ".join(m["candidate"] for m in result.misconfigured)
        out.append(
            f"{names} got the same error on every call: a configuration error, left out "
            f"of pass rates and training; fix it, then resume with: {hint}"
        )
    if result.held:
        out.append(result.held)
    if result.skipped:
        skipped = result.skipped
        out.append(
            f"{', '.join(skipped)} failed preflight and {'was' if len(skipped) == 1 else 'were'} "
            "left out of this run and its policy (--skip-broken)"
        )
    halted = [p["candidate"] for p in result.pairs or [] if p.get("halted")]
    if halted:
        out.append(
            f"{', '.join(sorted(set(halted)))} stopped calling when the API key was refused; "
            f"fix the key, then resume with: {hint}"
        )
    return out


def _run_nightly(
    cfg: Any, shutdown: "_Shutdown", run: tuple[str, Path, str | None, list[Any], bool], **kw: Any
) -> RunResult:
    """Preflight, then the flow, reporting to a configured Prefect API or a temporary server.

    API candidates are probed before the server starts, so a wrong key, model, port or path is
    named in the first seconds; local ones while it starts (they load a model: CPU time that
    overlaps the server's start instead of preceding it)."""
    from routeopt.evals.providers.local.provider import keep_loaded
    from routeopt.evals.storage.store import new_run_id
    from routeopt.flows import prefect_api

    command, db, run_id, chosen, skip = run
    run_id = run_id or new_run_id()
    shutdown.run = (db, run_id)
    shutdown.hint = resume_hint(command, cfg, run_id, kw)
    preflight = cfg.preflight.enabled and not kw["no_preflight"]
    started = time.perf_counter()
    remote = _probe(cfg, db, run_id, [c for c in chosen if c.provider != "local"], skip, preflight)
    took = time.perf_counter() - started
    shutdown.server = prefect_api.launch()  # starting now, it overlaps the imports below
    started = time.perf_counter()
    with keep_loaded():  # the models the probes load serve the flow's first suites
        local = _probe(cfg, db, run_id, [c for c in chosen if c.provider == "local"], skip, preflight)
        took += time.perf_counter() - started
        order = {c.name: i for i, c in enumerate(chosen)}
        probes = sorted(remote + local, key=lambda p: order[p.candidate])
        if probes:
            answered = sum(p.verdict == "ok" for p in probes)
            click.echo(
                f"routeopt: preflight: {answered} of {len(probes)} candidates answered in {took:.1f}s",
                err=True,
            )
        from routeopt.flows.nightly import nightly

        if not kw["debug"]:
            quiet_tracebacks()
        bars = not kw["no_progress"] and sys.stderr.isatty()
        with (
            Heartbeat(bars) as beat,
            _progress(bars, beat.count) as progress_key,
            _head_start(cfg, shutdown.server, run_id, kw, probes, progress_key),
            prefect_api.serving(shutdown.server),
        ):
            return nightly(
                config_path=str(cfg.source_path),
                run_id=run_id,
                suites=list(kw["suites"]) or None,
                candidates=list(kw["candidates"]) or None,
                db_path=kw["db_path"],
                train=kw["train"],
                publish=kw["publish"],
                cache_max_age=kw["cache_max_age"] or (DEFAULT_CACHE_AGE if kw["cache"] else None),
                progress_key=progress_key,
                preflight=preflight,
                skip_broken=skip,
                probes=[p.to_dict() for p in probes] if preflight else None,
                batch=cfg.batch_option or None,
            )


@contextmanager
def _head_start(
    cfg: Any, server: Any, run_id: str, kw: dict[str, Any], probes: list[Any], progress_key: str | None
) -> Iterator[None]:
    """While Prefect's temporary server starts, begin the run's evaluations (`routeopt.flows.head_start`);
    they stop once it answers (or the run is interrupted), and the flow does the rest."""
    from routeopt.common import tracing

    if server is None or tracing.enabled():
        yield
        return
    from routeopt.evals.execution.cache import parse_age
    from routeopt.flows import prefect_api
    from routeopt.flows.head_start import HeadStart

    if kw["db_path"]:
        cfg = cfg.model_copy(update={"db_path": Path(kw["db_path"]).resolve()})  # as the flow does
    broken = {p.candidate for p in probes if p.broken}
    names = list(kw["candidates"]) or [c.name for c in cfg.candidates]
    max_age = kw["cache_max_age"] or (DEFAULT_CACHE_AGE if kw["cache"] else None)
    head = HeadStart(
        cfg,
        run_id,
        suites=list(kw["suites"]) or None,
        candidates=[n for n in names if n not in broken],
        progress_key=progress_key,
        cache_max_age_s=parse_age(max_age) if max_age else None,
    ).start()
    try:
        server.wait_ready(prefect_api.startup_timeout_s())
    finally:
        took = head.stop()
    if head.items:
        click.echo(
            f"routeopt: {head.items} items evaluated in {took:.1f}s while Prefect's server started", err=True
        )
    yield


def _probe(cfg: Any, db: Path, run_id: str, candidates: list[Any], skip: bool, enabled: bool) -> list[Any]:
    """Preflight of these candidates, each failure said at once (`run_checks.report_probes`).
    A broken one stops the run here, unless skipped, its probes kept with their cost."""
    if not candidates or not enabled:
        return []
    from routeopt.evals.execution.preflight import PreflightFailed, broken, refusal, run_preflight

    probes = run_preflight(candidates, cfg.preflight.timeout_s)
    report_probes(probes, skip)
    if broken(probes) and not skip:
        with store_of(db, read_only=False) as store:
            store.record_preflight(run_id, [p.to_dict() for p in probes])
        raise PreflightFailed(refusal(probes))
    return probes


def _check_names(cfg: Any, suites: tuple[str, ...], candidates: tuple[str, ...]) -> None:
    """Unknown --suite or --candidate names fail at once, naming what exists."""
    from routeopt.evals.suite.spec import SuiteError, discover_suites

    try:
        discover_suites(cfg.suites_dir, list(suites) or cfg.suites)
        for name in candidates:
            cfg.candidate(name)
    except SuiteError as exc:
        raise click.ClickException(str(exc)) from None
    except KeyError as exc:
        raise click.ClickException(f"--candidate: {exc.args[0]}") from None


class Interrupted(KeyboardInterrupt):
    """SIGINT or SIGTERM. A KeyboardInterrupt, so Prefect marks the flow run Crashed as for a
    Ctrl-C; the CLI then exits with 128 + the signal number, as a shell reports it."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class _Shutdown:
    """SIGINT/SIGTERM during a run: stop within SHUTDOWN_GRACE_S and leave nothing behind.

    The first signal interrupts the flow, which cancels the evaluations in flight (each stores
    what it finished); the run resumes with its id. Prefect handles a SIGTERM during the flow
    first (it marks the flow run Crashed) and then passes it on here. If the calls in flight
    have not wound down SHUTDOWN_GRACE_S later, or a second signal comes, the process stops
    the Prefect server and exits at once, as after a kill -9 (which the store survives).
    """

    def __init__(self) -> None:
        self.hint: str | None = None  # the command that resumes the run (`resume_hint`)
        self.server: Any = None
        self.run: tuple[Path, str] | None = None  # (DuckDB file, run id) once it has an id
        self.signum: int | None = None
        self._previous: dict[int, Any] = {}
        if threading.current_thread() is threading.main_thread():  # only it may set handlers
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._on_signal)

    def restore(self) -> None:
        """Put the previous handlers back (the run is over; nothing is left to stop)."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.signum is not None:
            self._exit_now(signum)
        self.signum = signum
        click.echo(
            f"routeopt: {signal.Signals(signum).name}: stopping (send it again to stop at once)", err=True
        )
        threading.Thread(target=self._deadline, daemon=True, name="routeopt-shutdown").start()
        raise Interrupted(signum)

    def _deadline(self) -> None:
        time.sleep(SHUTDOWN_GRACE_S)
        click.echo(f"routeopt: still busy {SHUTDOWN_GRACE_S:.0f} s later; stopping now", err=True)
        self._exit_now(self.signum or signal.SIGTERM)

    def _exit_now(self, signum: int) -> None:
        if self.server is not None:
            self.server.stop()
        os._exit(128 + signum)

    def exit(self, signum: int) -> None:
        """Record the run as interrupted, say how to resume it, exit with 128 + signum."""
        name = signal.Signals(signum).name
        begun = False
        if self.run is not None and self.run[0].exists():
            from routeopt.flows.nightly import shared_store

            db_path, run_id = self.run
            try:
                store = shared_store(db_path)
                begun = not store.query("SELECT 1 FROM runs WHERE run_id = ?", [run_id]).empty
                if begun:
                    store.finish_run(run_id, "interrupted")
            except Exception as exc:  # the exit status and the resume hint matter more
                click.echo(f"routeopt: could not mark run {run_id} interrupted: {exc}", err=True)
                begun = True
        if begun:
            click.echo(
                f"routeopt: run {run_id} interrupted by {name}; finished items are "
                f"stored. Resume with: {self.hint}",
                err=True,
            )
        else:
            click.echo(f"routeopt: {name} before the run began; nothing was recorded", err=True)
        sys.exit(128 + signum)


@click.command("run")
@_common
@click.option("--no-publish", is_flag=True, help="Train and report, but publish nothing.")
def run(**kw: Any) -> None:
    """Run the nightly pipeline once: preflight, evaluate, store, train, publish, summarise.

    Each candidate first answers one tiny request: a wrong key, model name, URL or port stops
    the run before its first suite (unless --skip-broken). Every suite runs across every
    candidate; outcomes go to DuckDB; a router is trained and checked on held-out items; the
    policy is published to the registry. --resume ID resumes an interrupted run: finished
    items are not called again (a changed candidate or suite version is refused: start a new
    run). Every model is called again on a new run unless --cache asks to replay earlier answers.
    """
    _run_flow("run", train=True, publish=not kw["no_publish"], **kw)


@click.command("eval")
@_common
def eval_cmd(**kw: Any) -> None:
    """Evaluate every suite across every candidate and store the outcomes (no training).

    Each candidate first answers one tiny request (see `routeopt run`). Resumable: with
    --resume ID, only the remaining items of the interrupted run are called (a changed
    candidate or suite version is refused: start a new run).
    """
    _run_flow("eval", train=False, publish=False, **kw)
