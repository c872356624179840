"""`routeopt run` and `routeopt eval`: the nightly pipeline, whole or its evaluation stage."""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

from evals.config import ConfigError, default_config_path
from flows.commands import CONFIG_OPTION, console, load_config_or_exit

# After SIGINT/SIGTERM, how long the in-flight calls get to wind down before the process exits
# regardless (Kubernetes sends SIGKILL 30 s after SIGTERM by default).
SHUTDOWN_GRACE_S = 10.0
DEFAULT_CACHE_AGE = "1d"  # how old a replayed answer may be with a bare --cache


def _common(fn: Any) -> Any:
    fn = CONFIG_OPTION(fn)
    fn = click.option("--run-id", default=None, help="Resume or name a run (default: a new id).")(fn)
    fn = click.option("--db", "db_path", default=None, help="DuckDB file (default: from config).")(fn)
    fn = click.option("--suite", "suites", multiple=True, help="Only these suites (repeatable).")(fn)
    fn = click.option(
        "--candidate", "candidates", multiple=True, help="Only these candidates (repeatable)."
    )(fn)
    fn = click.option("--no-progress", is_flag=True, help="Do not draw progress bars.")(fn)
    fn = click.option(
        "--cache", "cache", is_flag=True,
        help=f"Development runs: replay answers that earlier runs recorded up to "
             f"{DEFAULT_CACHE_AGE} ago instead of calling the models (they count in pass rates, "
             "not in cost or latency). Off by default: every model is called again.",
    )(fn)
    fn = click.option(
        "--cache-max-age", "cache_max_age", default=None, callback=_check_age, metavar="AGE",
        help="Like --cache, with this age limit (e.g. 30m, 12h, 1d).",
    )(fn)
    return fn


def _check_age(ctx: click.Context, param: click.Parameter, value: str | None) -> str | None:
    from evals.execution.cache import parse_age

    if value is not None:
        try:
            parse_age(value)
        except ValueError as exc:
            raise click.BadParameter(str(exc)) from None
    return value


@contextmanager
def _progress(enabled: bool) -> Iterator[str | None]:
    """A rich progress bar per (suite x candidate), fed by the flow's tasks in this process."""
    if not enabled:
        yield None
        return
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from flows import nightly

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
        with lock:
            key = (suite, candidate)
            if key not in bars:
                bars[key] = progress.add_task(f"{suite} x {candidate}", total=total)
        progress.advance(bars[key], advance)

    key = f"cli-{os.getpid()}"
    nightly._PROGRESS[key] = hook
    with progress:
        try:
            yield key
        finally:
            nightly._PROGRESS.pop(key, None)


def _run_flow(train: bool, publish: bool, **kw: Any) -> None:
    started = time.perf_counter()
    # Everything that can be wrong with the command line fails here, before anything slow.
    cfg = load_config_or_exit(kw.pop("config_path") or default_config_path())
    _check_names(cfg, kw["suites"], kw["candidates"])
    shutdown = _Shutdown(resume=f"routeopt {'run' if train else 'eval'}")
    from evals.storage.store import ResumeConflict
    from flows.nightly import RunIncomplete
    from flows.prefect_api import ServerError

    try:
        result = _run_nightly(cfg, shutdown, train=train, publish=publish, **kw)
    except (ConfigError, ServerError, ResumeConflict, RunIncomplete) as exc:
        raise click.ClickException(str(exc)) from None
    except Interrupted as stop:
        shutdown.exit(stop.signum)
    finally:
        if shutdown.signum is None:
            shutdown.restore()
    from evals.selfhost.costmodel import load_caching
    from flows.nightly import shared_store
    from reports.summary import candidate_table, print_summary

    out = console()
    store = shared_store(Path(result["db_path"]))
    rows = candidate_table(store, result["run_id"])
    print_summary(out, rows, result, load_caching(store, result["run_id"]))
    out.print(f"wall time: {time.perf_counter() - started:.1f}s  db: {result['db_path']}")
    if result["suite_errors"]:
        sys.exit(1)


def _run_nightly(cfg: Any, shutdown: "_Shutdown", **kw: Any) -> dict[str, Any]:
    """The flow, reporting to a configured Prefect API or to a temporary server of its own."""
    from flows import prefect_api

    shutdown.server = prefect_api.launch()  # starting now, it overlaps the imports below
    from flows.nightly import new_run_id, nightly

    run_id = kw["run_id"] or new_run_id()
    shutdown.run = (Path(kw["db_path"]).resolve() if kw["db_path"] else cfg.db_path, run_id)
    with _progress(not kw["no_progress"] and sys.stderr.isatty()) as progress_key, \
            prefect_api.serving(shutdown.server):
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
        )


def _check_names(cfg: Any, suites: tuple[str, ...], candidates: tuple[str, ...]) -> None:
    """Unknown --suite or --candidate names fail at once, naming what exists."""
    from evals.suite.spec import SuiteError, discover_suites

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

    def __init__(self, resume: str):
        self.resume = resume
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
        click.echo(f"routeopt: {signal.Signals(signum).name}: stopping "
                   "(send it again to stop at once)", err=True)
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
            from flows.nightly import shared_store

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
            click.echo(f"routeopt: run {run_id} interrupted by {name}; finished items are "
                       f"stored. Resume with: {self.resume} --run-id {run_id}", err=True)
        else:
            click.echo(f"routeopt: {name} before the run began; nothing was recorded", err=True)
        sys.exit(128 + signum)


@click.command("run")
@_common
@click.option("--no-publish", is_flag=True, help="Train and report, but publish nothing.")
def run(**kw: Any) -> None:
    """Run the nightly pipeline once: evaluate, store, train, publish, summarise.

    Every suite runs across every candidate; outcomes go to DuckDB; a router is trained and
    checked on held-out items; the policy is published to the registry. Re-running with the
    same --run-id resumes: finished items are not called again (a changed candidate or suite
    version is refused: start a new run). Every model is called again on a new run unless
    --cache asks to replay earlier answers.
    """
    _run_flow(train=True, publish=not kw.pop("no_publish"), **kw)


@click.command("eval")
@_common
def eval_cmd(**kw: Any) -> None:
    """Evaluate every suite across every candidate and store the outcomes (no training).

    Resumable: with the --run-id of an interrupted run, only the remaining items are called
    (a changed candidate or suite version is refused: start a new run).
    """
    _run_flow(train=False, publish=False, **kw)
