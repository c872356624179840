"""A synthetic nightly history in a real DuckDB store, for the drift, export and report tests.

Each run evaluates two suites across three candidates with seeded outcomes; the last run can
carry injected regressions, so tests know exactly which drift must be found.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import numpy as np
import pandas as pd

from routeopt.evals.storage.store import OUTCOME_COLUMNS, Outcome, Store

CANDIDATES = {
    "big": dict(provider="openai", model="big", input_price_per_mtok=5.0, output_price_per_mtok=15.0),
    "mid": dict(provider="openai", model="mid", input_price_per_mtok=1.0, output_price_per_mtok=3.0),
    "small": dict(provider="local", model="small", variant="fp32", gpu_hour_usd=0.5),
}
PASS = {"big": 0.92, "mid": 0.8, "small": 0.55}
LATENCY = {"big": 1.2, "mid": 0.6, "small": 0.2}
SUITES = ("arith", "facts")


@dataclass
class Regression:
    candidate: str
    suite: str
    pass_rate: float | None = None  # replace the pass probability
    latency_factor: float = 1.0
    price_factor: float = 1.0


@dataclass
class History:
    db_path: Path
    run_ids: list[str] = field(default_factory=list)


def _outcomes(
    run_id: str, rng: np.random.Generator, n: int, when: datetime, reg: list[Regression]
) -> list[Outcome]:
    rows = []
    for suite in SUITES:
        for cand in CANDIDATES:
            hit = next((r for r in reg if r.candidate == cand and r.suite == suite), None)
            p = hit.pass_rate if hit and hit.pass_rate is not None else PASS[cand]
            lat_f = hit.latency_factor if hit else 1.0
            for i in range(n):
                tin, tout = int(rng.integers(20, 80)), int(rng.integers(5, 40))
                lat = float(rng.gamma(4.0, LATENCY[cand] / 4.0)) * lat_f
                err = "rate_limited" if rng.random() < 0.01 else None
                price_in = CANDIDATES[cand].get("input_price_per_mtok", 0.0)
                price_f = float(np.prod([r.price_factor for r in reg if r.candidate == cand]))
                price_out = CANDIDATES[cand].get("output_price_per_mtok", 0.0) * price_f
                cost = (tin * price_in + tout * price_out) / 1e6 if price_in else 0.5 / 3600 * lat / 8
                rows.append(
                    Outcome(
                        run_id=run_id,
                        suite=suite,
                        suite_version="v1",
                        item_id=f"{i:03d}",
                        candidate=cand,
                        passed=None if err else bool(rng.random() < p),
                        score=None if err else 1.0,
                        input_tokens=None if err else tin,
                        output_tokens=None if err else tout,
                        cost_usd=None if err else cost,
                        ttft_s=None if err else lat * 0.3,
                        latency_s=None if err else lat,
                        error_kind=err,
                        error="429" if err else None,
                        response="ok",
                        created_at=when,
                    )
                )
    return rows


def _items(suite: str, n: int) -> list[tuple[str, str, dict]]:
    """Prompts whose length varies with the item, so a router has a feature to look at."""
    words = "alpha beta gamma delta epsilon zeta eta theta".split()
    return [
        (f"{i:03d}", f"[{suite}] question {i}: " + " ".join(words[: 1 + i % 8]) * (1 + i % 3), {})
        for i in range(n)
    ]


def _bulk_insert(store: Store, rows: list[Outcome]) -> None:
    """Insert from a DataFrame: `Store.write_outcomes` (executemany) takes ~10 ms a row."""
    frame = pd.DataFrame([asdict(r) for r in rows], columns=list(OUTCOME_COLUMNS))
    with store._lock:
        store._con.register("new_rows", frame)
        store._con.execute(f"INSERT INTO outcomes ({', '.join(OUTCOME_COLUMNS)}) SELECT * FROM new_rows")
        store._con.unregister("new_rows")


def make_history(
    db_path: Path, runs: int = 4, items: int = 60, regressions: list[Regression] = (), seed: int = 0
) -> History:
    """Write `runs` completed nightly runs; `regressions` apply to the last run only."""
    rng = np.random.default_rng(seed)
    hist = History(Path(db_path))
    start = datetime(2026, 11, 1, 2, 0, tzinfo=timezone.utc)
    with Store(db_path) as store:
        for k in range(runs):
            run_id = f"run-{k:02d}"
            last = k == runs - 1
            reg = list(regressions) if last else []
            cands = []
            for name, spec in CANDIDATES.items():
                spec = dict(spec, name=name)
                f = float(np.prod([r.price_factor for r in reg if r.candidate == name]))
                if "output_price_per_mtok" in spec:
                    spec["output_price_per_mtok"] *= f
                cands.append(spec)
            store.begin_run(run_id, source="nightly", candidates=cands)
            if k == 0:
                for suite in SUITES:
                    store.register_suite(suite, "v1", {"name": suite}, _items(suite, items))
            when = start + timedelta(days=k)
            store._write("UPDATE runs SET started_at = ? WHERE run_id = ?", [(when, run_id)])
            _bulk_insert(store, _outcomes(run_id, rng, items, when, reg))
            store.finish_run(run_id)
            hist.run_ids.append(run_id)
    return hist
