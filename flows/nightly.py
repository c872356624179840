"""The nightly flow: evaluate every suite across every candidate, store, train, publish.

The flow body reads as the pipeline's table of contents; the logic lives in plain functions of
`evals`, `router_training` and `artifacts`. The (suite x candidate) work fans out as Prefect
tasks, so another task runner (Dask, Ray) spreads it over machines without changing this file.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable, Iterator

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import quote

from routeopt.common import tracing
from routeopt.evals.config import (
    Candidate,
    Config,
    batch_option,
    default_config_path,
    load_config,
    with_batch,
)
from routeopt.evals.execution.batch import BatchStage, run_batch_option
from routeopt.evals.execution.budget import Budget, budget_for_run, spent_in_run
from routeopt.evals.execution.cache import format_age, parse_age
from routeopt.evals.execution.reuse import NightPlan, check_drift, plan_night, remeasure, stamp_keys
from routeopt.evals.execution.preflight import Probe, PreflightFailed, broken, refusal, run_preflight
from routeopt.evals.providers.local.provider import keep_loaded, sharing_cpu
from routeopt.evals.execution.runner import PairStats, evaluate_pair
from routeopt.evals.storage.store import Outcome, Store, new_run_id  # noqa: F401 - the flow's id, also for the CLI
from routeopt.evals.suite.spec import Suite, SuiteError, discover_suites, load_suite
from routeopt.flows.review import report_run, review_run
from routeopt.reports.summary import RunResult, excluded_line

ProgressHook = Callable[[str, str, int, int], None]
"""(suite, candidate, advance, total) -> None; the CLI draws a progress bar per pair."""

_PROGRESS: dict[str, ProgressHook] = {}
_STORES: dict[str, Store] = {}
_STORES_LOCK = threading.Lock()
_RUNNING: dict[str, set[tuple[asyncio.AbstractEventLoop, "asyncio.Task[Any]"]]] = {}
_RUNNING_LOCK = threading.Lock()  # evaluation threads add and remove, the flow's thread reads


def shared_store(path: Path) -> Store:
    """The one writing connection per DuckDB file in this process (DuckDB allows one writer);
    threads asking at once get the same one."""
    key = str(Path(path).resolve())
    with _STORES_LOCK:
        if key not in _STORES:
            _STORES[key] = Store(key)
        return _STORES[key]


def close_store(path: Path) -> None:
    with _STORES_LOCK:
        store = _STORES.pop(str(Path(path).resolve()), None)
    if store is not None:
        store.close()


def close_stores() -> None:
    """Close every shared store (the CLI does before it exits)."""
    for key in list(_STORES):
        close_store(Path(key))


class RunIncomplete(RuntimeError):
    """Pairs of the run failed (rows could not be written): it is marked 'failed', and resuming
    it with the same run id completes it."""


def cancel_evaluations(run_id: str) -> int:
    """Cancel the run's (suite x candidate) evaluations running in this process: each stores
    the items it finished, and the run resumes with the rest."""
    with _RUNNING_LOCK:
        running = list(_RUNNING.get(run_id, ()))
    for loop, main in running:
        try:
            loop.call_soon_threadsafe(main.cancel)
        except RuntimeError:  # it finished (its loop closed) meanwhile
            pass
    return len(running)


async def _cancellable(run_id: str, coro: Any) -> Any:
    me = (asyncio.get_running_loop(), asyncio.current_task())
    with _RUNNING_LOCK:
        _RUNNING.setdefault(run_id, set()).add(me)  # type: ignore[arg-type]
    try:
        return await coro
    finally:
        with _RUNNING_LOCK:
            _RUNNING[run_id].discard(me)  # type: ignore[arg-type]
            if not _RUNNING[run_id]:
                del _RUNNING[run_id]


@dataclass
class EvalReport:
    run_id: str
    suites: dict[str, str] = field(default_factory=dict)
    suite_errors: dict[str, str] = field(default_factory=dict)
    pairs: list[PairStats] = field(default_factory=list)
    # candidates whose every call got the same error (`Store.mark_same_errors`)
    misconfigured: list[dict[str, Any]] = field(default_factory=list)


def load_suites(cfg: Config, names: list[str] | None) -> tuple[list[Suite], dict[str, str]]:
    """Load every suite; a broken suite is reported by name and the others still run."""
    suites, errors = [], {}
    for path in discover_suites(cfg.suites_dir, names or cfg.suites):
        try:
            suites.append(load_suite(path, config=cfg))
        except SuiteError as exc:
            errors[path.stem] = str(exc)
    return suites, errors


@task(name="evaluate", cache_policy=NO_CACHE, task_run_name="{suite.name} x {candidate.name}")
def evaluate_task(
    suite: Suite,
    candidate: Candidate,
    run_id: str,
    done: list[str],
    db_path: str | None,
    progress_key: str | None = None,
    budget: Budget | None = None,
    cache_dir: str | None = None,
    cache_max_age_s: float | None = None,
    cache_scope: str | None = None,
    trace_parent: str | None = None,
) -> tuple[PairStats, list[Outcome]]:
    """Run one (suite, candidate) pair.

    With `db_path` the task writes through this process's single writer as it goes (resumable
    at batch granularity); without it (workers in other processes) it returns the rows and the
    flow persists them. With tracing on the pair is a span, a child of the run's
    (`trace_parent`, a W3C header: it travels to workers in other processes too).
    """
    hook = _PROGRESS.get(progress_key or "")
    kept: list[Outcome] = []
    sink = shared_store(Path(db_path)).write_outcomes if db_path else kept.extend
    on_progress = (lambda n: hook(suite.name, candidate.name, n, len(suite.items))) if hook else None
    span = tracing.start_span(
        f"evaluate {suite.name} x {candidate.name}",
        traceparent=trace_parent,
        attributes={
            "openinference.span.kind": "CHAIN",
            "routeopt.run_id": run_id,
            "routeopt.suite": suite.name,
            "routeopt.suite_version": suite.version,
            "routeopt.candidate": candidate.name,
            "gen_ai.request.model": candidate.model,
        },
    )
    try:
        with tracing.use(span):
            stats = asyncio.run(
                _cancellable(
                    run_id,
                    evaluate_pair(
                        suite,
                        candidate,
                        run_id,
                        sink,
                        done=done,
                        on_progress=on_progress,
                        budget=budget,
                        cache=cache_dir,
                        cache_max_age_s=cache_max_age_s,
                        cache_scope=cache_scope,
                    ),
                )
            )
        if span is not None:
            span.set_attributes(
                {
                    "routeopt.items": stats.total,
                    "routeopt.completed": stats.completed,
                    "routeopt.errors": stats.errors,
                    "routeopt.calls": stats.calls,
                    "routeopt.judge_calls": stats.judge_calls,
                }
            )
    except BaseException as exc:
        if span is not None:
            tracing.set_error(span, type(exc).__name__, str(exc))
        raise
    finally:
        if span is not None:
            span.end()
    return stats, kept


def begin_evaluation(
    cfg: Config, run_id: str, suites: list[str] | None, candidates: list[str] | None
) -> tuple[Store, list[Candidate], list[Suite], dict[str, str]]:
    """The run's records before its first call: the resume check (ResumeConflict), the run and
    its candidates, each suite and its items. Idempotent: a resumed run passes here again.
    Returns (store, candidates, suites loaded, suites that did not load)."""
    store = shared_store(cfg.db_path)
    chosen = [cfg.candidate(n) for n in candidates] if candidates is not None else cfg.candidates
    loaded, errors = load_suites(cfg, suites)
    store.check_resume(
        run_id, {c.name: c.measured_dict() for c in chosen}, {s.name: s.version for s in loaded}
    )
    store.begin_run(
        run_id,
        config_fingerprint=cfg.fingerprint(),
        config=cfg.model_dump(mode="json"),
        candidates=[c.public_dict() for c in chosen],
        batch_option=cfg.batch_option,
    )
    for suite in loaded:
        store.register_suite(
            suite.name,
            suite.version,
            suite.spec.model_dump(mode="json"),
            ((it.id, suite.prompt_text(it), it.fields) for it in suite.items),
        )
    return store, chosen, loaded, errors


def evaluate_all(
    cfg: Config,
    run_id: str,
    *,
    suites: list[str] | None = None,
    candidates: list[str] | None = None,
    persist_in_tasks: bool = True,
    progress_key: str | None = None,
    cache_max_age_s: float | None = None,
    trace_parent: str | None = None,
) -> EvalReport:
    """Fan (suite x candidate) out as tasks, resuming what a previous attempt of the run did.

    A resumed run must have the candidates and suite versions it started with (ResumeConflict).
    The response cache always serves the run's own unflushed answers back; answers of earlier
    runs only with `cache_max_age_s` (development runs, never the nightly's default).
    """
    store, chosen, loaded, errors = begin_evaluation(cfg, run_id, suites, candidates)
    report = EvalReport(run_id, {s.name: s.version for s in loaded}, errors)
    budget = budget_for_run(cfg.budget, spent_in_run(store, run_id))
    shares = (  # tasks in other processes cannot share one Budget: each gets a slice
        budget.split([(s.name, c.name) for s in loaded for c in chosen])
        if budget is not None and not persist_in_tasks
        else {}
    )
    if cfg.reuse is not None:  # the incremental night: carry forward what has not changed
        _log_night(plan_night(store, run_id, loaded, chosen, cfg.reuse))
    group = chosen
    failed: list[str] = []
    while group:
        failed += _measure(
            cfg,
            store,
            run_id,
            loaded,
            group,
            report,
            budget,
            shares,
            persist_in_tasks=persist_in_tasks,
            progress_key=progress_key,
            cache_max_age_s=cache_max_age_s,
            trace_parent=trace_parent,
        )
        group = _drifted(cfg, store, run_id, loaded, chosen) if cfg.reuse is not None else []
    report.misconfigured = store.mark_same_errors(run_id)
    if failed:  # rows are missing: never mark such a run completed
        store.finish_run(run_id, "failed")
        raise RunIncomplete(
            f"run {run_id} is not complete: " + "; ".join(failed) + f". Resume it with --run-id {run_id}"
        )
    store.finish_run(run_id, "completed" if not errors else "completed_with_errors")
    return report


def _measure(
    cfg: Config,
    store: Store,
    run_id: str,
    loaded: list[Suite],
    chosen: list[Candidate],
    report: EvalReport,
    budget: Budget | None,
    shares: dict,
    *,
    persist_in_tasks: bool,
    progress_key: str | None,
    cache_max_age_s: float | None,
    trace_parent: str | None,
) -> list[str]:
    """Every (suite x candidate) item without an outcome: batched candidates' submissions first
    (the provider works while the pairs run), then the pairs, which call only what batch mode
    does not answer (the latency sample), then the batches' end. Returns the failures."""
    batches = BatchStage(
        store,
        run_id,
        loaded,
        chosen,
        budget=budget,
        sync_options={"cache": str(cfg.cache_dir), "cache_scope": f"{cfg.db_path}#{run_id}"},
    )
    batches.submit()
    futures = []
    # A candidate's pairs run one after another (its max_concurrency is the endpoint's capacity,
    # not a per-suite one); different candidates run side by side.
    last_of: dict[str, Any] = {}
    for suite in loaded:
        for cand in chosen:
            done = sorted(store.done_items(run_id, suite.name, cand.name) | batches.owned(suite, cand))
            db = str(cfg.db_path) if persist_in_tasks else None
            task_budget = budget if persist_in_tasks else shares.get((suite.name, cand.name))
            futures.append(
                evaluate_task.submit(
                    suite,
                    cand,
                    run_id,
                    done,
                    db,
                    progress_key,
                    task_budget,
                    str(cfg.cache_dir),
                    cache_max_age_s,
                    f"{cfg.db_path}#{run_id}",  # the same run id in another store is another run
                    trace_parent,
                    wait_for=[last_of[cand.name]] if cand.name in last_of else None,
                )
            )
            last_of[cand.name] = futures[-1]
    try:
        failed = _collect(futures, store, report)
        failed += batches.finish()  # polls to the end; what no batch answered is called now
    except BaseException:  # SIGTERM, Ctrl-C (_collect keeps going past a failed pair)
        cancel_evaluations(run_id)  # the pairs in flight stop too
        raise
    return failed


def _logger() -> Any:
    try:
        return get_run_logger()
    except Exception:  # outside a flow run (a plain call of evaluate_all)
        import logging

        return logging.getLogger(__name__)


def _log_night(plan: NightPlan) -> None:
    logger = _logger()
    for name in sorted(plan.carried):
        logger.info(
            "reuse: %s: %d outcomes carried forward, %d re-measured as the drift sample, %d new",
            name,
            plan.carried[name],
            plan.sampled.get(name, 0),
            plan.new.get(name, 0),
        )


def _drifted(
    cfg: Config, store: Store, run_id: str, loaded: list[Suite], chosen: list[Candidate]
) -> list[Candidate]:
    """Stamp tonight's rows for later nights, test the drift samples, and return the candidates
    that drifted, their carried rows removed so that they are measured in full."""
    assert cfg.reuse is not None
    stamp_keys(store, run_id, loaded, chosen)
    logger, again = _logger(), []
    for d in check_drift(store, run_id, cfg.reuse, [c.name for c in chosen]):
        (logger.warning if d.flagged else logger.info)("reuse: %s", d.line())
        if d.flagged and remeasure(store, run_id, d.candidate):
            again.append(cfg.candidate(d.candidate))
    return again


def _collect(futures: list[Any], store: Store, report: EvalReport) -> list[str]:
    """Wait for every pair and persist what workers returned; say which pairs failed."""
    failed = []
    for fut in futures:
        try:
            stats, rows = fut.result()
        except Exception as exc:  # e.g. FlushError: the others' rows are still written
            failed.append(f"{type(exc).__name__}: {exc}")
            continue
        store.write_outcomes(rows)
        report.pairs.append(stats)
    return failed


def training_frame(cfg: Config, run_id: str, leave_out: list[str] | tuple[str, ...] = ()) -> Any:
    """The latest outcomes of every (suite, candidate) of the fleet, this run's included: a
    deployment over a subset of candidates trains on (and gates on) the whole fleet.
    `leave_out`: candidates found misconfigured in this run, whose older outcomes must not put
    them in a policy that gateways would route to."""
    return shared_store(cfg.db_path).latest_frame(
        run_id,
        candidates=[c.name for c in cfg.candidates if c.name not in leave_out],
        max_age_days=cfg.router.max_outcome_age_days,
    )


def preflight_stage(
    cfg: Config, run_id: str, chosen: list[str], given: list[dict] | None, enabled: bool, skip_broken: bool
) -> list[Probe]:
    """Probe the chosen candidates (or take the probes the CLI already sent: `given`), keep
    them with the run, and stop (`PreflightFailed`) on a broken one unless told to skip it."""
    if given is not None:
        probes = [Probe.from_dict(p) for p in given]
    elif enabled:
        probes = run_preflight([cfg.candidate(n) for n in chosen], cfg.preflight.timeout_s)
        logger = get_run_logger()
        for p in probes:
            if p.verdict != "ok":
                logger.warning("preflight: %s%s", p.line(), " (skipped)" if p.broken and skip_broken else "")
    else:
        return []
    shared_store(cfg.db_path).record_preflight(run_id, [p.to_dict() for p in probes])
    if broken(probes) and not skip_broken:
        raise PreflightFailed(refusal(probes))
    return probes


@dataclass
class Refused:
    """A stage after training that could not be done (the champion cannot be verified, the
    registry refused a write): the run's results stand, and the run says why in one sentence."""

    stage: str
    message: str


@task(name="train-router", cache_policy=NO_CACHE)
def train_task(cfg: Config, run_id: str, frame: Any = None) -> Any:
    """`frame`: the training frame, read by the flow; a task on a worker in another process
    cannot open the DuckDB file the flow process holds."""
    from routeopt.router_training.train import train_router

    if frame is None:
        frame = training_frame(cfg, run_id)
    if frame.empty:
        raise RuntimeError(f"run {run_id} has no graded outcomes to train on")
    return train_router(
        frame,
        quality_target=cfg.router.quality_target,
        holdout_fraction=cfg.router.holdout_fraction,
        refit=cfg.router.refit,
        seed=cfg.router.seed,
        latency_alpha=cfg.router.latency_alpha,
        default_budgets={suite: b.pair() for suite, b in cfg.router.budgets.items()} or None,
    )


def _refusals() -> tuple[type[Exception], ...]:
    """What the registry, the signing key or the champion's verification raise: a person must
    look, and the run reports it in one sentence instead of a traceback."""
    from routeopt.artifacts.serving.backends import RegistryError
    from routeopt.artifacts.serving.loader import PolicyLoadError
    from routeopt.artifacts.serving.signatures import SigningError

    return (RegistryError, PolicyLoadError, SigningError, OSError)


@task(name="publish-policy", cache_policy=NO_CACHE)
def publish_task(cfg: Config, result: Any, report: EvalReport, outcome_runs: list[str]) -> Any:
    """Publish the policy, signed, as the next version (`Refused` if the registry or the key
    refuses)."""
    try:
        return _publish(cfg, result, report, outcome_runs)
    except _refusals() as exc:
        return Refused("publish", f"the policy was not published: {exc}")


def _publish(cfg: Config, result: Any, report: EvalReport, outcome_runs: list[str]) -> Any:
    """Publish the policy, signed, as the next version; it becomes `latest` and `candidate`.
    The first publish creates the signing key (`Config.signing_key_path`)."""
    from routeopt.artifacts.publish.registry import move_channel, publish, registry_signing_key
    from routeopt.artifacts.serving.signatures import public_key_path

    path = cfg.signing_key_path()
    key, created = registry_signing_key(cfg.registry_dir, path)
    if created:
        get_run_logger().warning(
            "created the policy signing key %s (keep it secret); gateways verify with %s",
            path,
            public_key_path(path),
        )
    published = publish(
        result.policy,
        cfg.registry_dir,
        lineage={"runs": [report.run_id], "outcome_runs": outcome_runs, "suites": report.suites},
        metrics=result.metrics,
        signing_key=key,
        expires_in=timedelta(days=cfg.publishing.expires_days),
    )
    move_channel(
        cfg.registry_dir, "candidate", published.version, action="publish", signing_key=key, only_forward=True
    )
    return published


def import_traffic(cfg: Config, store: Store) -> dict[str, Any] | None:
    """Bring the gateways' decision logs into the store (idempotent: the whole folder each night).
    A missing folder or a bad log is reported, never fatal: the night's evaluation goes on."""
    from routeopt.evals.storage.traffic import TrafficImportError, import_decisions

    folder = cfg.traffic.log_dir
    if folder is None:
        return None
    if not Path(folder).exists():
        return {"error": f"traffic.log_dir {folder} does not exist; no decision logs imported"}
    try:
        return asdict(import_decisions(folder, store))
    except TrafficImportError as exc:
        return {"error": f"decision logs not imported: {exc}"}


@task(name="import-traffic", cache_policy=NO_CACHE)
def import_traffic_task(cfg: Config) -> dict[str, Any] | None:
    """`import_traffic` on the flow's store, logged."""
    summary = import_traffic(cfg, shared_store(cfg.db_path))
    if summary and "error" in summary:
        get_run_logger().error(summary["error"])
    elif summary:
        get_run_logger().info(
            "decision logs: %d new decisions from %d files", summary["new"], summary["files"]
        )
    return summary


@task(name="promotion-gate", cache_policy=NO_CACHE)
def promote_task(cfg: Config, result: Any, frame: Any, published: Any, blocking: list[str]) -> Any:
    """The promotion gate (`Refused` when the champion cannot be verified or the move fails)."""
    try:
        return _promote(cfg, result, frame, published, blocking)
    except _refusals() as exc:
        return Refused("promotion", f"the champion was not moved: {exc}")


def _promote(cfg: Config, result: Any, frame: Any, published: Any, blocking: list[str]) -> Any:
    """Move `champion` to the new version only if the gate passes (`routeopt.artifacts.publish.promotion`)."""
    from routeopt.artifacts.publish.promotion import champion_version, decide_promotion, heldout
    from routeopt.artifacts.publish.registry import move_channel
    from routeopt.artifacts.serving.signatures import trusted_keys
    from routeopt.artifacts.publish.signing_keys import load_private_key
    from routeopt.evals.storage.traffic import load_traffic
    from routeopt.router_training.live.promise import live_comparison, live_promise

    key = load_private_key(cfg.signing_key_path())
    trusted = [key.public_key(), *(trusted_keys(None) or {}).values()]  # + $ROUTEOPT_PUBLIC_KEY: rotation
    # The policy that will serve against the one that serves, on the held-out items. With refit
    # both learned from them (the split is fixed by the seed): like with like; live traffic is
    # the out-of-sample evidence.
    test = heldout(frame, result.split["test"])
    champion, champion_number, vacant = champion_version(cfg.registry_dir, trusted)
    since = (datetime.now(timezone.utc) - timedelta(days=cfg.traffic.window_days)).isoformat()
    traffic = load_traffic(shared_store(cfg.db_path), since=since, source=cfg.traffic.feedback_source)
    live = live_comparison(traffic, result.policy, published.version, champion, champion_number)
    promise = live_promise(traffic, published.version, result.policy) if not traffic.empty else None
    decision = decide_promotion(
        result.policy,
        champion,
        test,
        tolerance=cfg.publishing.promote_tolerance,
        blocking=blocking,
        vacant=vacant,
        live=live,
        min_feedback=cfg.traffic.min_feedback,
        require_live=cfg.traffic.require_live,
        live_promise=promise,
    )
    if decision.promoted:
        move_channel(
            cfg.registry_dir,
            "champion",
            published.version,
            action="promote",
            signing_key=key,
            only_forward=True,
        )
    return decision


@contextlib.contextmanager
def _run_span(run_id: str) -> Iterator[str | None]:
    """The run's span (tracing on), current for the flow body; yields its `traceparent`,
    which each (suite, candidate) task is handed as its parent."""
    span = tracing.start_span(
        "routeopt nightly", attributes={"routeopt.run_id": run_id, "openinference.span.kind": "CHAIN"}
    )
    try:
        with tracing.use(span):
            yield tracing.traceparent_of(span)
    except BaseException as exc:
        if span is not None:
            tracing.set_error(span, type(exc).__name__, str(exc))
        raise
    finally:
        if span is not None:
            span.end()
            tracing.flush(5.0)  # a run's trace reaches the collector before the command ends


@flow(name="routeopt-nightly", log_prints=True)
def nightly(
    config_path: str | None = None,
    run_id: str | None = None,
    suites: list[str] | None = None,
    candidates: list[str] | None = None,
    train: bool = True,
    publish: bool = True,
    db_path: str | None = None,
    progress_key: str | None = None,
    persist_in_tasks: bool = True,
    cache_max_age: str | None = None,
    preflight: bool | None = None,
    skip_broken: bool | None = None,
    probes: list[dict] | None = None,
    batch: list[str] | None = None,
) -> RunResult:
    """Preflight -> evaluate -> store -> train -> review -> publish -> promote -> report. The
    same run id resumes.

    `cache_max_age` (e.g. "1d"): replay cached answers of earlier runs up to that age, for
    development runs only; by default every model is called again (resuming a run still takes
    its own finished answers from the cache). `preflight`, `skip_broken`: default from the
    config's `preflight` section; `probes`: the preflight a caller already ran (the CLI, to
    report a broken candidate before Prefect's server has started). `batch`: candidates to
    answer through their Batch API in this run (`all`: every one that can), as `--batch` does;
    a resumed run keeps the ones it started with.
    """
    logger = get_run_logger()
    cfg = load_config(config_path or default_config_path())
    max_age_s = parse_age(cache_max_age) if cache_max_age else None
    if max_age_s is not None:
        logger.warning(
            "response cache: replaying answers of earlier runs up to %s old; their "
            "rows are marked cached and left out of cost and latency figures",
            format_age(max_age_s),
        )
    if db_path:
        cfg = cfg.model_copy(update={"db_path": Path(db_path).resolve()})
    run_id = run_id or new_run_id()
    given = batch_option(cfg, batch, candidates) if batch is not None else None
    cfg = with_batch(cfg, run_batch_option(shared_store(cfg.db_path), run_id, given))
    with _run_span(run_id) as trace_parent:
        skip = cfg.preflight.skip_broken if skip_broken is None else skip_broken
        chosen = candidates or [c.name for c in cfg.candidates]
        with keep_loaded():  # a local candidate's model loads once, not once per suite
            checked = preflight_stage(
                cfg, run_id, chosen, probes, cfg.preflight.enabled if preflight is None else preflight, skip
            )
            skipped = [p.candidate for p in broken(checked)]
            measured = [c for c in chosen if c not in skipped]
            with sharing_cpu(sum(cfg.candidate(c).provider == "local" for c in measured)):
                report = evaluate_all(
                    cfg,
                    run_id,
                    suites=suites,
                    candidates=measured,
                    progress_key=progress_key,
                    persist_in_tasks=persist_in_tasks,
                    cache_max_age_s=max_age_s,
                    trace_parent=trace_parent,
                )
        for name, err in report.suite_errors.items():
            logger.error("suite %s skipped: %s", name, err)
        for m in report.misconfigured:
            logger.error(
                "candidate %s: all %d calls got the same error, so its configuration is wrong "
                "(left out of pass rates and training): %s: %s",
                m["candidate"],
                m["n"],
                m["error_kind"],
                m["error"],
            )
        traffic = import_traffic_task(cfg) if cfg.traffic.log_dir is not None else None
        store = shared_store(cfg.db_path)
        excluded = excluded_line(store, run_id)
        if excluded:
            logger.warning(excluded)
        leave_out = skipped + [m["candidate"] for m in report.misconfigured]
        frame = training_frame(cfg, run_id, leave_out) if train else None
        # quote(): large inputs Prefect would otherwise walk, element by element, for futures
        result = train_task(cfg, run_id, quote(frame)) if train and not frame.empty else None
        if train and result is None:
            logger.error("no graded outcomes to train on: no policy from run %s", run_id)
        metrics = result.metrics if result is not None else None
        review = review_run(
            cfg, store, run_id, policy_candidates=result.policy.candidates if result is not None else ()
        )
        blocking = [f.message or f"{f.candidate}/{f.suite}: {f.metric} regressed" for f in review.blocking]
        held = _held(report, skip, publish and result is not None)
        if held:
            logger.error(held)
        published, promotion, refused = _publish_and_promote(
            cfg, result, frame, report, blocking, publish and result is not None and not held
        )
        policy = (
            None
            if published is None
            else {
                "version": published.version,
                "promoted": promotion is not None and promotion.promoted,
                "reason": promotion.reason if promotion is not None else refused[0].message,
            }
        )
        report_path, _ = report_run(
            cfg,
            store,
            run_id,
            drift=review.drift,
            metrics=metrics,
            policy=policy,
            traffic=review.traffic.to_dict() if review.traffic is not None else None,
        )
    return RunResult(
        run_id=run_id,
        db_path=str(cfg.db_path),
        suites=report.suites,
        suite_errors=report.suite_errors,
        pairs=[asdict(p) for p in report.pairs],
        router_metrics=result.metrics if result is not None else None,
        report_path=str(report_path),
        drift_blocking=blocking,
        traffic_check=review.traffic.to_dict() if review.traffic is not None else None,
        published=(
            {
                "version": published.version,
                "uri": published.uri,
                "signed": published.signed,
                "key_id": published.key_id,
                "public_key": str(cfg.signing_key_path().parent / "public_key.pem"),
            }
            if published
            else None
        ),
        promotion=asdict(promotion) if promotion is not None else None,
        cache_max_age=format_age(max_age_s) if max_age_s is not None else None,
        excluded=excluded,
        traffic=traffic,
        preflight=[p.to_dict() for p in checked],
        skipped=skipped,
        misconfigured=report.misconfigured,
        held=held,
        refused=[asdict(r) for r in refused],
    )


def _held(report: EvalReport, skip_broken: bool, would_publish: bool) -> str | None:
    """Why no policy is published from this run: a candidate was misconfigured, and the run
    was not told to go on without it (a fleet with a broken candidate publishes nothing)."""
    names = [m["candidate"] for m in report.misconfigured]
    if not names or skip_broken or not would_publish:
        return None
    return (
        f"no policy published: {', '.join(names)} got the same error on every call (see "
        "above); fix the configuration and resume the run, or publish without "
        f"{'it' if len(names) == 1 else 'them'} with --skip-broken (preflight.skip_broken)"
    )


def _publish_and_promote(
    cfg: Config, result: Any, frame: Any, report: EvalReport, blocking: list[str], go: bool
) -> tuple[Any, Any, list[Refused]]:
    """Publish and pass the gate; a refusal (tampered champion, registry error) is logged in
    one sentence and returned, never raised: the run's results stand."""
    if not go:
        return None, None, []
    logger = get_run_logger()
    published = publish_task(cfg, quote(result), quote(report), sorted(set(frame.run_id)))
    if isinstance(published, Refused):
        logger.error(published.message)
        return None, None, [published]
    promotion = promote_task(cfg, quote(result), quote(frame), quote(published), blocking)
    if isinstance(promotion, Refused):
        logger.error(promotion.message)
        return published, None, [promotion]
    logger.info(
        "champion %s (decided by %s): %s",
        "moved" if promotion.promoted else "kept",
        promotion.decided_by,
        promotion.reason,
    )
    return published, promotion, []
