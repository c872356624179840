"""The nightly flow: evaluate every suite across every candidate, store, train, publish.

The flow body reads as the pipeline's table of contents; the logic lives in plain functions of
`evals`, `router_training` and `artifacts`. The (suite x candidate) work fans out as Prefect
tasks, so another task runner (Dask, Ray) spreads it over machines without changing this file.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Callable

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from evals.config import Candidate, Config, load_config
from evals.execution.budget import Budget, budget_for_run, spent_in_run
from evals.execution.cache import format_age, parse_age
from evals.execution.runner import PairStats, evaluate_pair
from evals.storage.store import Outcome, Store
from evals.suite.spec import Suite, SuiteError, discover_suites, load_suite
from flows.review import report_run, review_run
from reports.summary import excluded_line

ProgressHook = Callable[[str, str, int, int], None]
"""(suite, candidate, advance, total) -> None; the CLI draws a progress bar per pair."""

_PROGRESS: dict[str, ProgressHook] = {}
_STORES: dict[str, Store] = {}
_RUNNING: dict[str, set[tuple[asyncio.AbstractEventLoop, "asyncio.Task[Any]"]]] = {}
_RUNNING_LOCK = threading.Lock()  # evaluation threads add and remove, the flow's thread reads


def shared_store(path: Path) -> Store:
    """The one writing connection per DuckDB file in this process (DuckDB allows one writer)."""
    key = str(Path(path).resolve())
    if key not in _STORES:
        _STORES[key] = Store(key)
    return _STORES[key]


def close_store(path: Path) -> None:
    store = _STORES.pop(str(Path(path).resolve()), None)
    if store is not None:
        store.close()


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


def new_run_id() -> str:
    return datetime.now(timezone.utc).strftime("run-%Y%m%d-%H%M%S-") + uuid.uuid4().hex[:6]


@dataclass
class EvalReport:
    run_id: str
    suites: dict[str, str] = field(default_factory=dict)
    suite_errors: dict[str, str] = field(default_factory=dict)
    pairs: list[PairStats] = field(default_factory=list)


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
) -> tuple[PairStats, list[Outcome]]:
    """Run one (suite, candidate) pair.

    With `db_path` the task writes through this process's single writer as it goes (resumable
    at batch granularity); without it (workers in other processes) it returns the rows and the
    flow persists them.
    """
    hook = _PROGRESS.get(progress_key or "")
    kept: list[Outcome] = []
    sink = shared_store(Path(db_path)).write_outcomes if db_path else kept.extend
    on_progress = (lambda n: hook(suite.name, candidate.name, n, len(suite.items))) if hook else None
    stats = asyncio.run(
        _cancellable(run_id, evaluate_pair(
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
        ))
    )
    return stats, kept


def evaluate_all(
    cfg: Config,
    run_id: str,
    *,
    suites: list[str] | None = None,
    candidates: list[str] | None = None,
    persist_in_tasks: bool = True,
    progress_key: str | None = None,
    cache_max_age_s: float | None = None,
) -> EvalReport:
    """Fan (suite x candidate) out as tasks, resuming what a previous attempt of the run did.

    A resumed run must have the candidates and suite versions it started with (ResumeConflict).
    The response cache always serves the run's own unflushed answers back; answers of earlier
    runs only with `cache_max_age_s` (development runs, never the nightly's default).
    """
    store = shared_store(cfg.db_path)
    chosen = [cfg.candidate(n) for n in candidates] if candidates else cfg.candidates
    loaded, errors = load_suites(cfg, suites)
    store.check_resume(run_id, {c.name: c.measured_dict() for c in chosen},
                       {s.name: s.version for s in loaded})
    store.begin_run(
        run_id,
        config_fingerprint=cfg.fingerprint(),
        config=cfg.model_dump(mode="json"),
        candidates=[c.public_dict() for c in chosen],
    )
    report = EvalReport(run_id, {s.name: s.version for s in loaded}, errors)
    budget = budget_for_run(cfg.budget, spent_in_run(store, run_id))
    shares = (  # tasks in other processes cannot share one Budget: each gets a slice
        budget.split([(s.name, c.name) for s in loaded for c in chosen])
        if budget is not None and not persist_in_tasks
        else {}
    )
    futures = []
    # A candidate's pairs run one after another (its max_concurrency is the endpoint's capacity,
    # not a per-suite one); different candidates run side by side.
    last_of: dict[str, Any] = {}
    for suite in loaded:
        store.register_suite(
            suite.name,
            suite.version,
            suite.spec.model_dump(mode="json"),
            ((it.id, suite.prompt_text(it), it.fields) for it in suite.items),
        )
        for cand in chosen:
            done = sorted(store.done_items(run_id, suite.name, cand.name))
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
                    wait_for=[last_of[cand.name]] if cand.name in last_of else None,
                )
            )
            last_of[cand.name] = futures[-1]
    try:
        failed = _collect(futures, store, report)
    except BaseException:  # SIGTERM, Ctrl-C (_collect keeps going past a failed pair)
        cancel_evaluations(run_id)  # the pairs in flight stop too
        raise
    if failed:  # rows are missing: never mark such a run completed
        store.finish_run(run_id, "failed")
        raise RunIncomplete(f"run {run_id} is not complete: " + "; ".join(failed)
                            + f". Resume it with --run-id {run_id}")
    store.finish_run(run_id, "completed" if not errors else "completed_with_errors")
    return report


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


def training_frame(cfg: Config, run_id: str) -> Any:
    """The latest outcomes of every (suite, candidate) of the fleet, this run's included: a
    deployment over a subset of candidates trains on (and gates on) the whole fleet."""
    return shared_store(cfg.db_path).latest_frame(
        run_id, candidates=[c.name for c in cfg.candidates],
        max_age_days=cfg.router.max_outcome_age_days)


@task(name="train-router", cache_policy=NO_CACHE)
def train_task(cfg: Config, run_id: str, frame: Any = None) -> Any:
    """`frame`: the training frame, read by the flow; a task on a worker in another process
    cannot open the DuckDB file the flow process holds."""
    from router_training.train import train_router

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
    )


@task(name="publish-policy", cache_policy=NO_CACHE)
def publish_task(cfg: Config, result: Any, report: EvalReport, outcome_runs: list[str]) -> Any:
    """Publish the policy, signed, as the next version; it becomes `latest` and `candidate`.
    The first publish creates the signing key (`Config.signing_key_path`)."""
    from artifacts.registry import move_channel, publish, registry_signing_key
    from artifacts.signing import public_key_path

    path = cfg.signing_key_path()
    key, created = registry_signing_key(cfg.registry_dir, path)
    if created:
        get_run_logger().warning("created the policy signing key %s (keep it secret); gateways "
                                 "verify with %s", path, public_key_path(path))
    published = publish(
        result.policy,
        cfg.registry_dir,
        lineage={"runs": [report.run_id], "outcome_runs": outcome_runs, "suites": report.suites},
        metrics=result.metrics,
        signing_key=key,
        expires_in=timedelta(days=cfg.publishing.expires_days),
    )
    move_channel(cfg.registry_dir, "candidate", published.version, action="publish",
                 signing_key=key, only_forward=True)
    return published


def import_traffic(cfg: Config, store: Store) -> dict[str, Any] | None:
    """Bring the gateways' decision logs into the store (idempotent: the whole folder each night).
    A missing folder or a bad log is reported, never fatal: the night's evaluation goes on."""
    from evals.storage.traffic import TrafficImportError, import_decisions

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
        get_run_logger().info("decision logs: %d new decisions from %d files", summary["new"], summary["files"])
    return summary


@task(name="promotion-gate", cache_policy=NO_CACHE)
def promote_task(cfg: Config, result: Any, frame: Any, published: Any, blocking: list[str]) -> Any:
    """Move `champion` to the new version only if the gate passes (`artifacts.promotion`)."""
    from artifacts.promotion import champion_version, decide_promotion, heldout
    from artifacts.registry import move_channel
    from artifacts.signing import load_private_key, trusted_keys
    from evals.storage.traffic import load_traffic
    from router_training.live import live_comparison, live_promise

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
        move_channel(cfg.registry_dir, "champion", published.version, action="promote",
                     signing_key=key, only_forward=True)
    return decision


@flow(name="routeopt-nightly", log_prints=True)
def nightly(
    config_path: str = "routeopt.yaml",
    run_id: str | None = None,
    suites: list[str] | None = None,
    candidates: list[str] | None = None,
    train: bool = True,
    publish: bool = True,
    db_path: str | None = None,
    progress_key: str | None = None,
    persist_in_tasks: bool = True,
    cache_max_age: str | None = None,
) -> dict[str, Any]:
    """Evaluate -> store -> train -> review -> publish -> promote -> report. The same run id resumes.

    `cache_max_age` (e.g. "1d"): replay cached answers of earlier runs up to that age, for
    development runs only; by default every model is called again (resuming a run still takes
    its own finished answers from the cache).
    """
    logger = get_run_logger()
    cfg = load_config(config_path)
    max_age_s = parse_age(cache_max_age) if cache_max_age else None
    if max_age_s is not None:
        logger.warning("response cache: replaying answers of earlier runs up to %s old; their "
                       "rows are marked cached and left out of cost and latency figures",
                       format_age(max_age_s))
    if db_path:
        cfg = cfg.model_copy(update={"db_path": Path(db_path).resolve()})
    run_id = run_id or new_run_id()
    report = evaluate_all(
        cfg,
        run_id,
        suites=suites,
        candidates=candidates,
        progress_key=progress_key,
        persist_in_tasks=persist_in_tasks,
        cache_max_age_s=max_age_s,
    )
    for name, err in report.suite_errors.items():
        logger.error("suite %s skipped: %s", name, err)
    traffic = import_traffic_task(cfg) if cfg.traffic.log_dir is not None else None
    store = shared_store(cfg.db_path)
    excluded = excluded_line(store, run_id)
    if excluded:
        logger.warning(excluded)
    frame = training_frame(cfg, run_id) if train else None
    result = train_task(cfg, run_id, frame) if train else None
    metrics = result.metrics if result is not None else None
    review = review_run(cfg, store, run_id,
                        policy_candidates=result.policy.candidates if result is not None else ())
    blocking = [f.message or f"{f.candidate}/{f.suite}: {f.metric} regressed" for f in review.blocking]
    published = promotion = None
    if publish and result is not None:
        published = publish_task(cfg, result, report, sorted(set(frame.run_id)))
        promotion = promote_task(cfg, result, frame, published, blocking)
        logger.info("champion %s (decided by %s): %s", "moved" if promotion.promoted else "kept",
                    promotion.decided_by, promotion.reason)
    policy = None if published is None else {"version": published.version, "promoted": promotion.promoted,
                                             "reason": promotion.reason}
    report_path, _ = report_run(cfg, store, run_id, drift=review.drift, metrics=metrics, policy=policy,
                                traffic=review.traffic.to_dict() if review.traffic is not None else None)
    return {
        "run_id": run_id,
        "db_path": str(cfg.db_path),
        "suites": report.suites,
        "suite_errors": report.suite_errors,
        "pairs": [asdict(p) for p in report.pairs],
        "router_metrics": result.metrics if result is not None else None,
        "report_path": str(report_path),
        "drift_blocking": blocking,
        "traffic_check": review.traffic.to_dict() if review.traffic is not None else None,
        "published": (
            {"version": published.version, "uri": published.uri, "signed": published.signed,
             "key_id": published.key_id,
             "public_key": str(cfg.signing_key_path().parent / "public_key.pem")}
            if published
            else None
        ),
        "promotion": asdict(promotion) if promotion is not None else None,
        "cache_max_age": format_age(max_age_s) if max_age_s is not None else None,
        "excluded": excluded,
        "traffic": traffic,
    }
