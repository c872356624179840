"""The incremental night: measure what may have changed, carry forward what has not.

An outcome depends on the item (its prompt and fields), the grader, the model's identity and
its generation settings; `measure_key` hashes exactly those. A night with `reuse` configured:

1. `plan_night`: per (suite, candidate), items whose key has a graded outcome measured within
   `max_age_days` are carried forward: copied into this run as `call_mode = 'carried'`
   (`cached`: out of this night's cost and timings, in its pass rates), with the run that
   measured them and when. New items, new or changed candidates (no matching key) are measured.
   Of the carryable items, a drift sample per candidate is measured again: the longest-unmeasured
   items first (so every item is re-measured before it ages out), at least the size that finds a
   drop of `detectable_drop` in pass rate with `power` (`sample_size`).
2. `check_drift`: per candidate, the sampled items' new outcomes against their last ones, an
   exact one-sided McNemar test at `alpha` (Bonferroni over the candidates). A candidate that
   drifted has its carried rows removed, so the flow measures all of its items before training.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import Any, Sequence

from routeopt.evals.config import Candidate, ReuseSettings
from routeopt.evals.storage.store import OUTCOME_COLUMNS, Outcome, Store
from routeopt.evals.suite.spec import Item, Suite

SAMPLES_SCHEMA = """
CREATE TABLE IF NOT EXISTS reuse_samples (
    run_id VARCHAR NOT NULL,
    suite VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    item_id VARCHAR NOT NULL,
    prev_passed BOOLEAN NOT NULL,
    prev_run VARCHAR,
    PRIMARY KEY (run_id, suite, candidate, item_id)
);
"""
_PRICE_FIELDS = (
    "input_price_per_mtok",
    "cached_input_price_per_mtok",
    "output_price_per_mtok",
    "cache_write_input_price_per_mtok",
    "gpu_hour_usd",
    "gpu_tokens_per_s",
    "utilization",
    "batch",
    "timeout_s",
    "max_retries",
    "stream",
    "circuit_breaker_max_wait_s",
)


def model_identity(candidate: Candidate) -> dict:
    """What decides a candidate's answers: not its prices, pacing or how it is called."""
    return {k: v for k, v in candidate.measured_dict().items() if k not in _PRICE_FIELDS}


def measure_key(suite: Suite, item: Item, candidate: Candidate, identity: str | None = None) -> str:
    """The hash of what decides an item's outcome on a candidate."""
    request = suite.request(item, candidate)
    payload = json.dumps(
        [
            suite.name,
            [(m.role, m.content) for m in request.messages],
            repr(request.settings),
            item.fields,
            suite.grader.fingerprint(),
            identity or json.dumps(model_identity(candidate), sort_keys=True),
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


_KEYS: dict[tuple[str, str, str], dict[str, str]] = {}


def pair_keys(suite: Suite, candidate: Candidate) -> dict[str, str]:
    """Item -> `measure_key` of a (suite, candidate); kept for the night (rendering every
    prompt again for each step cost seconds per thousand items)."""
    identity = json.dumps(model_identity(candidate), sort_keys=True)
    memo = (suite.name, suite.version, identity)
    if memo not in _KEYS:
        if len(_KEYS) > 256:
            _KEYS.clear()
        _KEYS[memo] = {it.id: measure_key(suite, it, candidate, identity) for it in suite.items}
    return _KEYS[memo]


def _z(p: float) -> float:
    """The standard normal quantile."""
    from statistics import NormalDist

    return NormalDist().inv_cdf(p)


def sample_size(settings: ReuseSettings, tests: int) -> int:
    """Paired items per candidate for a one-sided McNemar test at alpha/tests to find a drop of
    `detectable_drop` with `power`, when a stable model's outcomes flip at `flip_rate` each way
    (Connor 1987: n = (z_a sqrt(psi) + z_b sqrt(psi - d^2))^2 / d^2, psi = d + 2 f)."""
    if settings.drift_sample is not None:
        return settings.drift_sample
    d, f = settings.detectable_drop, settings.flip_rate
    psi = d + 2 * f
    za, zb = _z(1 - settings.alpha / max(tests, 1)), _z(settings.power)
    return math.ceil((za * math.sqrt(psi) + zb * math.sqrt(max(psi - d * d, 1e-12))) ** 2 / d**2)


def mcnemar_p(worse: int, better: int) -> float:
    """One-sided exact McNemar: P(X >= worse) for X ~ Binomial(worse + better, 1/2)."""
    n = worse + better
    if n == 0:
        return 1.0
    return sum(math.comb(n, k) for k in range(worse, n + 1)) / 2**n


@dataclass
class NightPlan:
    """What a night measures and carries, per candidate."""

    carried: dict[str, int] = field(default_factory=dict)
    sampled: dict[str, int] = field(default_factory=dict)
    new: dict[str, int] = field(default_factory=dict)
    sample_size: int = 0


@dataclass
class Drift:
    candidate: str
    sampled: int
    worse: int  # passed last time, failed now
    better: int
    p_value: float
    flagged: bool

    def line(self) -> str:
        verdict = "drift: re-measured in full" if self.flagged else "no drift"
        return (
            f"{self.candidate}: {self.sampled} items re-measured, {self.worse} now fail that "
            f"passed, {self.better} now pass that failed (p = {self.p_value:.2g}): {verdict}"
        )


def _previous(
    store: Store, run_id: str, suite: Suite, cand: Candidate, keys: dict[str, str], since: datetime
) -> Any:
    """The newest graded outcome per item with the same key, measured since `since`."""
    import pandas as pd

    frame = pd.DataFrame({"item_id": list(keys), "measure_key": list(keys.values())})
    with store._lock:
        store._con.register("_keys", frame)
        try:
            return store._con.execute(
                """SELECT o.* FROM outcomes o JOIN _keys k USING (item_id, measure_key)
                    WHERE o.suite = ? AND o.candidate = ? AND o.run_id <> ?
                      AND o.error_kind IS NULL AND o.passed IS NOT NULL AND o.measured_at >= ?
                    QUALIFY row_number() OVER (PARTITION BY o.item_id ORDER BY o.measured_at DESC) = 1""",
                [suite.name, cand.name, run_id, since],
            ).df()
        finally:
            store._con.unregister("_keys")


def plan_night(
    store: Store,
    run_id: str,
    suites: Sequence[Suite],
    candidates: Sequence[Candidate],
    settings: ReuseSettings,
    now: datetime | None = None,
) -> NightPlan:
    """Carry forward unchanged pairs into `run_id` and record the drift sample (idempotent:
    a resumed run finds its carried rows and sample already written)."""
    with store._lock:
        store._con.execute(SAMPLES_SCHEMA)
    done = store.query(
        "SELECT candidate, count(*) FILTER (WHERE call_mode = 'carried') AS c "
        "FROM outcomes WHERE run_id = ? GROUP BY 1",
        [run_id],
    )
    planned = store.query("SELECT count(*) AS n FROM reuse_samples WHERE run_id = ?", [run_id]).n[0]
    if planned or done.c.sum():  # a resumed night: planned (and perhaps found drift) already
        return NightPlan(carried={r.candidate: int(r.c) for r in done.itertuples()})
    now = now or datetime.now(timezone.utc)
    since = now - timedelta(days=settings.max_age_days)
    plan = NightPlan(sample_size=sample_size(settings, len(candidates)))
    for cand in candidates:
        prev = {s.name: _previous(store, run_id, s, cand, pair_keys(s, cand), since) for s in suites}
        total = sum(len(p) for p in prev.values())
        want = min(total, max(plan.sample_size, 0))
        plan.carried[cand.name] = plan.sampled[cand.name] = plan.new[cand.name] = 0
        for suite in suites:
            p = prev[suite.name]
            share = math.ceil(want * len(p) / total) if total else 0
            order = sorted(
                p.itertuples(index=False),
                key=lambda r: (r.measured_at, hashlib.sha256(f"{run_id}\0{r.item_id}".encode()).hexdigest()),
            )
            sample, carry = order[:share], order[share:]
            _record(store, run_id, suite, cand, sample, carry)
            plan.sampled[cand.name] += len(sample)
            plan.carried[cand.name] += len(carry)
            plan.new[cand.name] += len(suite.items) - len(p)
    return plan


def _record(store: Store, run_id: str, suite: Suite, cand: Candidate, sample: list, carry: list) -> None:
    import pandas as pd

    picked = pd.DataFrame(
        [(run_id, suite.name, cand.name, r.item_id, bool(r.passed), r.run_id) for r in sample],
        columns=["run_id", "suite", "candidate", "item_id", "prev_passed", "prev_run"],
    )
    store.write_frame(picked, "INSERT INTO reuse_samples SELECT * FROM _frame ON CONFLICT DO NOTHING")
    rows = []
    for r in carry:
        values = {c: getattr(r, c) for c in OUTCOME_COLUMNS if hasattr(r, c)}
        values = {k: (None if _isna(v) else int(v) if k in _INT_COLUMNS else v) for k, v in values.items()}
        values.update(
            run_id=run_id,
            suite_version=suite.version,
            call_mode="carried",
            cached=True,
            carried_from=values["carried_from"] or r.run_id,
            created_at=None,
            trace_id=None,
            span_id=None,
        )
        rows.append(Outcome(**values))
    store.write_outcomes(rows)


_INT_COLUMNS = frozenset(
    {
        "input_tokens",
        "output_tokens",
        "cached_input_tokens",
        "cache_write_input_tokens",
        "attempts",
        "judge_input_tokens",
        "judge_output_tokens",
    }
)


def _isna(v: Any) -> bool:
    import pandas as pd

    try:
        return bool(pd.isna(v))
    except (TypeError, ValueError):
        return False


def stamp_keys(store: Store, run_id: str, suites: Sequence[Suite], candidates: Sequence[Candidate]) -> None:
    """Write each measured row's `measure_key`, so later nights can carry it forward."""
    import pandas as pd

    rows = [
        (s.name, item_id, c.name, key)
        for s in suites
        for c in candidates
        for item_id, key in pair_keys(s, c).items()
    ]
    frame = pd.DataFrame(rows, columns=["suite", "item_id", "candidate", "measure_key"])
    store.write_frame(
        frame,
        f"""UPDATE outcomes SET measure_key = f.measure_key FROM _frame f
        WHERE outcomes.run_id = '{run_id.replace("'", "''")}' AND outcomes.suite = f.suite
          AND outcomes.item_id = f.item_id AND outcomes.candidate = f.candidate
          AND outcomes.measure_key IS NULL""",
    )


def check_drift(store: Store, run_id: str, settings: ReuseSettings, candidates: Sequence[str]) -> list[Drift]:
    """Per candidate: tonight's outcomes of the sampled items against their last ones."""
    frame = store.query(
        """SELECT s.candidate, count(*) AS n,
                  count(*) FILTER (WHERE s.prev_passed AND NOT o.passed) AS worse,
                  count(*) FILTER (WHERE NOT s.prev_passed AND o.passed) AS better
           FROM reuse_samples s JOIN outcomes o ON o.run_id = s.run_id AND o.suite = s.suite
                AND o.candidate = s.candidate AND o.item_id = s.item_id
           WHERE s.run_id = ? AND o.error_kind IS NULL AND o.passed IS NOT NULL
           GROUP BY s.candidate""",
        [run_id],
    )
    level = settings.alpha / max(len(candidates), 1)
    out = []
    for r in frame.itertuples():
        p = mcnemar_p(int(r.worse), int(r.better))
        out.append(
            Drift(r.candidate, int(r.n), int(r.worse), int(r.better), p, p < level and r.worse > r.better)
        )
    return out


def remeasure(store: Store, run_id: str, candidate: str) -> int:
    """Remove a drifted candidate's carried rows from the run: the flow measures them again."""
    n = int(
        store.query(
            "SELECT count(*) AS n FROM outcomes WHERE run_id = ? AND candidate = ? AND call_mode = 'carried'",
            [run_id, candidate],
        ).n[0]
    )
    store.write(
        "DELETE FROM outcomes WHERE run_id = ? AND candidate = ? AND call_mode = 'carried'",
        [(run_id, candidate)],
    )
    return n
