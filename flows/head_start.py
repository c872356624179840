"""The run's evaluations, begun while Prefect's temporary server starts.

A `routeopt run` without a configured Prefect API starts a temporary server, which takes 10 to
20 s of one core on these machines (its imports, and on a new Prefect home every database
migration since Prefect 2); the flow cannot begin before it answers. Meanwhile the run's
(suite x candidate) pairs are evaluated here, outside Prefect, through the same runner and the
same single writer, under the run's id. When the server answers they are cancelled, each
storing the items it finished, and the flow resumes the run as it resumes any interrupted run:
its tasks evaluate only the items not stored yet, so every item is evaluated once and the
outcomes are the ones the flow would have recorded.

Not begun when an API is configured (nothing to wait for) or with tracing on (the run's trace
begins with the flow, and these calls would fall outside it).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from typing import Any

from routeopt.evals.config import Config
from routeopt.evals.execution.batch import batch_owned
from routeopt.evals.execution.budget import budget_for_run, spent_in_run
from routeopt.evals.execution.runner import evaluate_pair
from routeopt.evals.providers.local.provider import sharing_cpu
from routeopt.flows.nightly import _PROGRESS, _cancellable, begin_evaluation, cancel_evaluations

log = logging.getLogger(__name__)


class HeadStart:
    """Evaluate the run's pairs in a thread of its own until `stop()`; a candidate's pairs one
    after another and the candidates side by side, as the flow orders them."""

    def __init__(
        self,
        cfg: Config,
        run_id: str,
        *,
        suites: list[str] | None,
        candidates: list[str],
        progress_key: str | None = None,
        cache_max_age_s: float | None = None,
    ) -> None:
        self.cfg, self.run_id, self.suites, self.candidates = cfg, run_id, suites, candidates
        self.progress_key, self.cache_max_age_s = progress_key, cache_max_age_s
        self.items = 0  # stored by the pairs begun here
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._thread = threading.Thread(target=self._run, name="routeopt-head-start", daemon=True)

    def start(self) -> "HeadStart":
        self._started = time.perf_counter()
        self._thread.start()
        return self

    def stop(self) -> float:
        """Cancel the evaluations (each stores what it finished) and wait for them; returns
        the seconds they ran. A failure here never fails the run: the flow does the items."""
        self._stopping.set()
        while self._thread.is_alive():
            cancel_evaluations(self.run_id)
            self._thread.join(0.05)
        if self.error is not None:
            log.warning(
                "the evaluations begun before the flow stopped early (the flow does their items): %s: %s",
                type(self.error).__name__,
                self.error,
            )
        return time.perf_counter() - self._started

    def _run(self) -> None:
        try:
            store, chosen, loaded, _ = begin_evaluation(self.cfg, self.run_id, self.suites, self.candidates)
            budget = budget_for_run(self.cfg.budget, spent_in_run(store, self.run_id))
            with sharing_cpu(sum(c.provider == "local" for c in chosen)):
                asyncio.run(self._all(store, chosen, loaded, budget))
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # noqa: BLE001 - reported by stop(), never raised into the run
            self.error = exc

    async def _all(self, store: Any, chosen: list[Any], loaded: list[Any], budget: Any) -> None:
        await asyncio.gather(
            *(_cancellable(self.run_id, self._candidate(store, cand, loaded, budget)) for cand in chosen),
            return_exceptions=True,
        )

    async def _candidate(self, store: Any, cand: Any, loaded: list[Any], budget: Any) -> None:
        hook = _PROGRESS.get(self.progress_key or "")
        for suite in loaded:
            if self._stopping.is_set():
                return
            # batch mode answers its items after the head start; only its latency sample is called
            done = store.done_items(self.run_id, suite.name, cand.name) | batch_owned(suite, cand)
            on_progress = (lambda n, s=suite: hook(s.name, cand.name, n, len(s.items))) if hook else None
            try:
                stats = await evaluate_pair(
                    suite,
                    cand,
                    self.run_id,
                    store.write_outcomes,
                    done=done,
                    on_progress=on_progress,
                    budget=budget,
                    cache=str(self.cfg.cache_dir),
                    cache_max_age_s=self.cache_max_age_s,
                    cache_scope=f"{self.cfg.db_path}#{self.run_id}",
                )
            finally:
                self.items += len(store.done_items(self.run_id, suite.name, cand.name) - done)
            if stats.halted:
                return
