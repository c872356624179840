"""A run's evaluation stage without Prefect, for kill -9 tests and benchmarks of batch mode.

`python -m tests.batch_driver CONFIG DB RUN_ID [CANDIDATE,...]` does what `evaluate_all` does
for one run (records, batch submissions, the synchronous pairs, the batches' end) and exits 0
when the run is complete; run it again with the same RUN_ID to resume. `fleet(...)` writes a
fake fleet's config beside a suite (with `judge`, a judge candidate the run does not evaluate).
"""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

from routeopt.evals.config import load_config
from routeopt.evals.execution.batch import BatchStage
from routeopt.evals.execution.runner import RetryPolicy, evaluate_pair
from routeopt.evals.storage.store import Store
from routeopt.evals.suite.spec import discover_suites, load_suite

FAST = RetryPolicy(base_s=0.01, max_s=0.05)


def run(config: str, db: str, run_id: str, only: str | None = None) -> Store:
    """The run's evaluation stage; `only`: the candidates it evaluates (comma-separated)."""
    cfg = load_config(config)
    store = Store(db)
    suites = [load_suite(p, config=cfg) for p in discover_suites(cfg.suites_dir, cfg.suites)]
    if only:
        cfg = cfg.model_copy(update={"candidates": [c for c in cfg.candidates if c.name in only.split(",")]})
    store.check_resume(
        run_id, {c.name: c.measured_dict() for c in cfg.candidates}, {s.name: s.version for s in suites}
    )
    store.begin_run(
        run_id, config=cfg.model_dump(mode="json"), candidates=[c.public_dict() for c in cfg.candidates]
    )
    for s in suites:
        store.register_suite(
            s.name,
            s.version,
            s.spec.model_dump(mode="json"),
            ((it.id, s.prompt_text(it), it.fields) for it in s.items),
        )
    options = {"retry": FAST, "cache": str(cfg.cache_dir)}
    stage = BatchStage(store, run_id, suites, cfg.candidates, sync_options=options)
    stage.submit()
    for s in suites:
        for c in cfg.candidates:
            done = store.done_items(run_id, s.name, c.name) | stage.owned(s, c)
            asyncio.run(evaluate_pair(s, c, run_id, store.write_outcomes, done=sorted(done), **options))
    failed = stage.finish()
    if failed:
        raise SystemExit("; ".join(failed))
    store.finish_run(run_id)
    return store


def fleet(
    folder: Path,
    urls: dict[str, str],
    *,
    batch: bool,
    poll_s: float = 0.05,
    latency_sample: int = 2,
    extra: dict | None = None,
    judge: bool = False,
) -> Path:
    """A config of one OpenAI and one Anthropic candidate on the fake servers at `urls`
    (provider -> base URL), batched or not; suites in `folder/suites`."""
    spec = {"poll_interval_s": poll_s, "latency_sample": latency_sample, **(extra or {})}
    cands = [
        {
            "name": "gpt",
            "provider": "openai",
            "model": "gpt-fake",
            "base_url": urls["openai"],
            "input_price_per_mtok": 2.5,
            "output_price_per_mtok": 10.0,
            "max_retries": 2,
            **({"batch": spec} if batch else {}),
        },
        {
            "name": "claude",
            "provider": "anthropic",
            "model": "claude-fake",
            "base_url": urls["anthropic"],
            "input_price_per_mtok": 3.0,
            "output_price_per_mtok": 15.0,
            "max_retries": 2,
            **({"batch": spec} if batch else {}),
        },
    ]
    if judge:
        cands.append(
            {
                "name": "judge",
                "provider": "openai",
                "model": "judge-fake",
                "base_url": urls["openai"],
                "input_price_per_mtok": 2.0,
                "output_price_per_mtok": 8.0,
                "max_retries": 2,
                "batch": {"enabled": False, "poll_interval_s": poll_s},
            }
        )
    path = folder / "routeopt.yaml"
    path.write_text(
        json.dumps(
            {
                "candidates": cands,
                "suites_dir": "suites",
                "db_path": "out/routeopt.duckdb",
                "cache_dir": "out/cache",
                "registry_dir": "out/registry",
                "preflight": {"enabled": False},
            }
        )
    )
    return path


if __name__ == "__main__":
    run(*sys.argv[1:5]).close()
