"""`routeopt run` and `routeopt eval`: the nightly pipeline, whole or its evaluation stage."""

from __future__ import annotations

import os
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

from evals.config import ConfigError, default_config_path
from flows.commands import CONFIG_OPTION

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
    from rich.console import Console

    from evals.storage.store import ResumeConflict
    from flows.nightly import nightly, shared_store
    from flows.summary import candidate_table, print_summary

    config_path = kw.pop("config_path") or default_config_path()
    started = time.perf_counter()
    try:
        with _progress(not kw.pop("no_progress") and sys.stderr.isatty()) as progress_key:
            result = nightly(
                config_path=str(config_path),
                run_id=kw["run_id"],
                suites=list(kw["suites"]) or None,
                candidates=list(kw["candidates"]) or None,
                db_path=kw["db_path"],
                train=train,
                publish=publish,
                cache_max_age=kw["cache_max_age"] or (DEFAULT_CACHE_AGE if kw["cache"] else None),
                progress_key=progress_key,
            )
    except (ConfigError, ResumeConflict) as exc:
        raise click.ClickException(str(exc)) from None
    console = Console()
    rows = candidate_table(shared_store(Path(result["db_path"])), result["run_id"])
    print_summary(console, rows, result)
    console.print(f"wall time: {time.perf_counter() - started:.1f}s  db: {result['db_path']}")
    if result["suite_errors"]:
        sys.exit(1)


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
