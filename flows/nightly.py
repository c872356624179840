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

from evals.execution.budget import Budget, budget_for_run, spent_in_run
from evals.config import Candidate, Config, load_config
from evals.execution.runner import PairStats, evaluate_pair
from evals.storage.store import Outcome, Store
from evals.suite.spec import Suite, SuiteError, discover_suites, load_suite
from flows.review import review_run

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
    use_cache: bool = True,
) -> EvalReport:
    """Fan (suite x candidate) out as tasks, resuming what a previous attempt of the run did."""
    store = shared_store(cfg.db_path)
    chosen = [cfg.candidate(n) for n in candidates] if candidates else cfg.candidates
    store.begin_run(
        run_id,
        config_fingerprint=cfg.fingerprint(),
        config=cfg.model_dump(mode="json"),
        candidates=[c.public_dict() for c in chosen],
    )
    loaded, errors = load_suites(cfg, suites)
    report = EvalReport(run_id, {s.name: s.version for s in loaded}, errors)
    budget = budget_for_run(cfg.budget, spent_in_run(store, run_id))
    shares = (  # tasks in other processes cannot share one Budget: each gets a slice
        budget.split([(s.name, c.name) for s in loaded for c in chosen])
        if budget is not None and not persist_in_tasks
        else {}
    )
    cache_dir = str(cfg.cache_dir) if use_cache else None
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
                    cache_dir,
                    wait_for=[last_of[cand.name]] if cand.name in last_of else None,
                )
            )
            last_of[cand.name] = futures[-1]
    try:
        for fut in futures:
            stats, rows = fut.result()
            store.write_outcomes(rows)
            report.pairs.append(stats)
    except BaseException as exc:
        if not isinstance(exc, Exception):  # SIGTERM, Ctrl-C: the pairs in flight stop too
            cancel_evaluations(run_id)
        raise
    store.finish_run(run_id, "completed" if not errors else "completed_with_errors")
    return report


@task(name="train-router", cache_policy=NO_CACHE)
def train_task(cfg: Config, run_id: str, frame: Any = None) -> Any:
    """`frame`: the run's training frame, read by the flow; a task on a worker in another
    process cannot open the DuckDB file the flow process holds."""
    from router_training.train import train_router

    if frame is None:
        frame = shared_store(cfg.db_path).training_frame([run_id])
    if frame.empty:
        raise RuntimeError(f"run {run_id} has no graded outcomes to train on")
    return train_router(
        frame,
        quality_target=cfg.router.quality_target,
        holdout_fraction=cfg.router.holdout_fraction,
        seed=cfg.router.seed,
    )


@task(name="publish-policy", cache_policy=NO_CACHE)
def publish_task(cfg: Config, result: Any, report: EvalReport) -> Any:
    """Publish the policy as the next version; it becomes `latest` and `candidate`."""
    from artifacts.registry import move_channel, publish

    key = cfg.publishing.signing_key
    published = publish(
        result.policy,
        cfg.registry_dir,
        lineage={"runs": [report.run_id], "suites": report.suites},
        metrics=result.metrics,
        signing_key=key,
        expires_in=timedelta(days=cfg.publishing.expires_days),
    )
    move_channel(cfg.registry_dir, "candidate", published.version, action="publish",
                 signing_key=key, only_forward=True)
    return published


@task(name="promotion-gate", cache_policy=NO_CACHE)
def promote_task(cfg: Config, result: Any, frame: Any, published: Any, blocking: list[str]) -> Any:
    """Move `champion` to the new version only if the gate passes (`flows.promotion`)."""
    from artifacts.registry import move_channel
    from flows.promotion import champion_policy, decide_promotion, heldout

    test = heldout(frame, result.split["test"])
    decision = decide_promotion(
        result.policy,
        champion_policy(cfg.registry_dir),
        test,
        tolerance=cfg.publishing.promote_tolerance,
        blocking=blocking,
    )
    if decision.promoted:
        move_channel(cfg.registry_dir, "champion", published.version, action="promote",
                     signing_key=cfg.publishing.signing_key, only_forward=True)
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
    use_cache: bool = True,
) -> dict[str, Any]:
    """Evaluate -> store -> train -> review -> publish -> promote. The same run id resumes."""
    logger = get_run_logger()
    cfg = load_config(config_path)
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
        use_cache=use_cache,
    )
    for name, err in report.suite_errors.items():
        logger.error("suite %s skipped: %s", name, err)
    store = shared_store(cfg.db_path)
    frame = store.training_frame([run_id]) if train else None
    result = train_task(cfg, run_id, frame) if train else None
    review = review_run(
        cfg,
        store,
        run_id,
        metrics=result.metrics if result is not None else None,
        policy_candidates=result.policy.candidates if result is not None else (),
    )
    blocking = [f.message or f"{f.candidate}/{f.suite}: {f.metric} regressed" for f in review.blocking]
    published = promotion = None
    if publish and result is not None:
        published = publish_task(cfg, result, report)
        promotion = promote_task(cfg, result, frame, published, blocking)
        logger.info("champion %s: %s", "moved" if promotion.promoted else "kept", promotion.reason)
    return {
        "run_id": run_id,
        "db_path": str(cfg.db_path),
        "suites": report.suites,
        "suite_errors": report.suite_errors,
        "pairs": [asdict(p) for p in report.pairs],
        "router_metrics": result.metrics if result is not None else None,
        "report_path": str(review.report_path) if review.report_path else None,
        "drift_blocking": blocking,
        "published": (
            {"version": published.version, "uri": published.uri, "signed": published.signed}
            if published
            else None
        ),
        "promotion": asdict(promotion) if promotion is not None else None,
    }
