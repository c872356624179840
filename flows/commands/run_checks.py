"""What `routeopt run` and `eval` check before they start anything, and how they say so.

Every mistake a user can make in the command line or the config is named here in one sentence,
in the first seconds: an unset key variable, a run id that is new where a resume was meant (or
taken where a new run was meant), a resume whose configuration changed, a candidate that fails
its preflight. A run's own options are kept, so the resume hint it prints works from any folder.
"""

from __future__ import annotations

import logging
import os
import shlex
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import click

HEARTBEAT_S = float(os.environ.get("ROUTEOPT_HEARTBEAT_S", "60"))  # a silent run says it is alive


def refuse_unset_keys(candidates: list[Any], skip_broken: bool) -> None:
    """Each `api_key_env` naming an unset variable, named before anything starts."""
    from routeopt.evals.execution.preflight import unset_keys

    missing = unset_keys(candidates)
    if not missing:
        return
    if skip_broken:
        for line in missing.values():
            click.echo(f"routeopt: {line}; skipped (--skip-broken)", err=True)
        return
    one = len(missing) == 1
    raise click.ClickException(
        "\n".join(missing.values()) + f"\nSet {'it' if one else 'them'}, or go "
        f"on without {'this candidate' if one else 'these candidates'} with --skip-broken"
    )


def run_id_for(db: Path, run_id: str | None, resume: str | None) -> str | None:
    """The id to run under: a new one (None: generated later), `--run-id` if no run has it in
    `db`, or `--resume`'s if one has. A resume of an unknown id, or a new run under a taken id,
    is refused: either would silently mix or split one run across databases."""
    if run_id and resume:
        raise click.UsageError("give --run-id (a new run) or --resume (an interrupted one), not both")
    wanted = resume or run_id
    if wanted is None:
        return None
    status = _status_in(db, wanted)
    if resume and status is None:
        raise click.ClickException(
            f"no run {resume!r} in {db}: nothing to resume. Resume in the database the run "
            "used (its resume hint gives --config and --db), or start a new run without --resume"
        )
    if run_id and status is not None:
        raise click.ClickException(
            f"run {run_id!r} already exists in {db} ({status}): resume it with --resume "
            f"{run_id}, or give a new --run-id"
        )
    return wanted


def batch_for_run(cfg: Any, db: Path, kw: dict[str, Any]) -> Any:
    """The config with `--batch` applied: the names checked against the config (one sentence
    naming `--batch` otherwise); on a resume the run's recorded choice, which a different
    `--batch` may not change."""
    from routeopt.evals.config import ConfigError, batch_option, with_batch
    from routeopt.evals.execution.batch import run_batch_option
    from routeopt.evals.storage.store import ResumeConflict

    try:
        given = batch_option(cfg, kw["batch"], kw["candidates"] or None) if kw["batch"] else None
        if not kw["resume"]:
            return with_batch(cfg, given or [])
        with store_of(db, read_only=True) as store:
            return with_batch(cfg, run_batch_option(store, kw["resume"], given))
    except (ConfigError, ResumeConflict) as exc:
        raise click.ClickException(str(exc)) from None


@contextmanager
def store_of(db: Path, *, read_only: bool) -> Iterator[Any]:
    """The store of `db`: this process's writer when an earlier run in it holds one (DuckDB
    lets a process open a file one way only), else a connection of its own, closed after."""
    from routeopt.flows.commands import open_store

    nightly = sys.modules.get("routeopt.flows.nightly")  # imported by a run: never imported here (Prefect)
    held = nightly._STORES.get(str(Path(db).resolve())) if nightly is not None else None
    if held is not None:
        yield held
        return
    with open_store(db, read_only=read_only) as store:
        yield store


def _status_in(db: Path, run_id: str) -> str | None:
    if not db.exists():
        return None
    with store_of(db, read_only=True) as store:
        if not store.has_table("runs"):
            return None
        rows = store.query("SELECT status FROM runs WHERE run_id = ?", [run_id])
    return None if rows.empty else str(rows.status.iloc[0])


def refuse_changed_resume(
    cfg: Any, db: Path, run_id: str, suites: list[str] | None, candidates: list[Any]
) -> None:
    """A resume whose candidates or suite versions changed since the run started: print what
    the run did so far, then the one sentence that says what changed."""
    from routeopt.evals.storage.store import ResumeConflict
    from routeopt.evals.suite.spec import SuiteError, discover_suites, load_suite
    from routeopt.flows.commands import console
    from routeopt.reports.summary import RunResult, candidate_table, excluded_line, print_summary

    versions = {}
    for path in discover_suites(cfg.suites_dir, suites or cfg.suites):
        try:
            suite = load_suite(path, config=cfg)
        except SuiteError:
            continue  # reported, and skipped, by the run itself
        versions[suite.name] = suite.version
    with store_of(db, read_only=True) as store:
        try:
            store.check_resume(run_id, {c.name: c.measured_dict() for c in candidates}, versions)
            return
        except ResumeConflict as exc:
            print_summary(
                console(),
                candidate_table(store, run_id),
                RunResult(run_id=run_id, excluded=excluded_line(store, run_id)),
            )
            raise click.ClickException(str(exc)) from None


def resume_hint(command: str, cfg: Any, run_id: str, kw: dict[str, Any]) -> str:
    """`routeopt run --resume ID --config /abs/routeopt.yaml ...`: every option that decides
    what the run is, with absolute paths, so it resumes the same run from any folder."""
    parts = ["routeopt", command, "--resume", run_id, "--config", str(cfg.source_path)]
    if kw.get("db_path"):
        parts += ["--db", str(Path(kw["db_path"]).resolve())]
    for name in kw.get("suites") or ():
        parts += ["--suite", name]
    for name in kw.get("candidates") or ():
        parts += ["--candidate", name]
    for name in cfg.batch_option:
        parts += ["--batch", name]
    if kw.get("cache_max_age"):
        parts += ["--cache-max-age", kw["cache_max_age"]]
    elif kw.get("cache"):
        parts.append("--cache")
    parts += [
        flag
        for flag, key in (
            ("--no-publish", "no_publish"),
            ("--skip-broken", "skip_broken"),
            ("--no-preflight", "no_preflight"),
        )
        if kw.get(key)
    ]
    return " ".join(shlex.quote(p) for p in parts)


def report_probes(probes: list[Any], skip_broken: bool) -> None:
    """One line per candidate that did not answer its probe, as it is known."""
    for p in probes:
        if p.verdict == "ok":
            continue
        tail = (
            (" - skipped (--skip-broken)" if skip_broken else "")
            if p.broken
            else " - not a configuration error; the run goes on"
        )
        click.echo(f"routeopt: preflight: {p.line()}{tail}", err=True)


class QuietTracebacks(logging.Filter):
    """Without --debug, log records keep their one-line message and lose their traceback: the
    run's own errors are said in one sentence, and a bug is named with its type."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and record.exc_info[1] is not None:
            exc = record.exc_info[1]
            record.msg = f"{record.getMessage()} ({type(exc).__name__}; --debug shows the traceback)"
            record.args = None
        record.exc_info = record.exc_text = None
        return True


def quiet_tracebacks() -> None:
    """Put `QuietTracebacks` on every handler of the root logger (Prefect's console among them)."""
    for handler in logging.getLogger().handlers:
        if not any(isinstance(f, QuietTracebacks) for f in handler.filters):
            handler.addFilter(QuietTracebacks())


class Heartbeat:
    """A line every HEARTBEAT_S while nothing else shows the run is alive: always without
    progress bars, and with them while no bar has moved (training, reviewing, publishing, or an
    endpoint the queue waits for)."""

    def __init__(self, bars: bool, interval_s: float = HEARTBEAT_S, clock: Any = time.monotonic):
        self.bars, self.interval_s, self.clock = bars, interval_s, clock
        self.started = self.last = clock()
        self.done = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._beat, daemon=True, name="routeopt-heartbeat")

    def count(self, suite: str, candidate: str, advance: int, total: int) -> None:
        self.done += advance
        if advance:
            self.last = self.clock()

    def line(self) -> str | None:
        now = self.clock()
        if self.bars and now - self.last < self.interval_s:
            return None  # a bar has moved
        last = f"; the last {now - self.last:.0f}s ago" if self.done else ""
        return f"routeopt: still running after {now - self.started:.0f}s ({self.done} items evaluated{last})"

    def _beat(self) -> None:
        while not self._stop.wait(self.interval_s):
            line = self.line()
            if line:
                click.echo(line, err=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
