"""Drift detection between nightly runs, and which regressions block a policy."""

from __future__ import annotations

from pathlib import Path

import pytest

from routeopt.evals.config import AlertSettings
from routeopt.evals.storage.drift import bh_adjust, blocking_regressions, detect_drift, mcnemar_p
from routeopt.evals.storage.store import Store
from tests.ops_history import Regression, make_history


def _find(report, candidate, suite, metric):
    return [f for f in report.findings if (f.candidate, f.suite, f.metric) == (candidate, suite, metric)]


@pytest.fixture(scope="module")
def regressed(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("drift") / "db.duckdb"
    make_history(
        db,
        runs=4,
        items=120,
        regressions=[
            Regression("mid", "arith", pass_rate=0.45),
            Regression("big", "facts", latency_factor=2.0),
            Regression("small", "arith", price_factor=1.0),
            Regression("big", "arith", price_factor=1.5),
        ],
    )
    return db


@pytest.fixture(scope="module")
def steady(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("steady") / "db.duckdb"
    make_history(db, runs=4, items=120, seed=7)
    return db


def test_injected_regressions_are_found_and_nothing_else(regressed: Path):
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03", AlertSettings())
    assert report.baseline_runs == ["run-00", "run-01", "run-02"]
    assert report.compared_pairs == 6
    drop = _find(report, "mid", "arith", "pass_rate")
    assert len(drop) == 1 and drop[0].severity == "regression"
    assert drop[0].change < -0.2 and drop[0].q_value < 0.05
    # compared item by item: each of the 120 items, now and in its latest baseline run
    assert drop[0].n_current == drop[0].n_baseline == 120
    slow = _find(report, "big", "facts", "latency_p95_s")
    assert len(slow) == 1 and slow[0].severity == "regression" and slow[0].change > 0.5
    assert _find(report, "big", "facts", "ttft_p95_s")[0].severity == "regression"
    price = _find(report, "big", "*", "price:output_price_per_mtok")
    assert price and price[0].current == pytest.approx(22.5) and price[0].severity == "regression"
    assert _find(report, "big", "arith", "cost_per_call_usd")[0].change > 0.1
    flagged = {(f.candidate, f.suite) for f in report.regressions}
    assert flagged <= {("mid", "arith"), ("big", "facts"), ("big", "*"), ("big", "arith")}
    assert report.findings[0].severity == "regression"


def test_a_steady_history_raises_no_pass_rate_or_latency_alarm(steady: Path):
    with Store(steady, read_only=True) as store:
        report = detect_drift(store, "run-03")
    assert report.compared_pairs == 6
    assert [f.message for f in report.regressions] == []


def test_the_first_run_has_nothing_to_compare(steady: Path):
    with Store(steady, read_only=True) as store:
        report = detect_drift(store, "run-00")
        assert report.compared_pairs == 0 and report.findings == []
        with pytest.raises(KeyError, match="no run 'nope'"):
            detect_drift(store, "nope")


def test_an_earlier_run_is_compared_only_with_runs_before_it(regressed: Path):
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-02", AlertSettings(baseline_runs=1))
    assert report.baseline_runs == ["run-01"] and report.regressions == []


def test_statistics_helpers():
    assert mcnemar_p(0, 0) == 1.0 and mcnemar_p(10, 10) == pytest.approx(1.0)
    assert mcnemar_p(12, 0) == pytest.approx(2 * 0.5**12)  # 12 items got worse, none better
    assert mcnemar_p(0, 12) == mcnemar_p(12, 0)  # two-sided
    qs = bh_adjust([0.01, 0.04, 0.03, 0.5])
    assert qs[0] == pytest.approx(0.04) and qs[3] == pytest.approx(0.5)
    assert all(q >= p for q, p in zip(qs, [0.01, 0.04, 0.03, 0.5]))


def _two_nights(path: Path, before: list[dict], now: list[dict]) -> Store:
    """Two completed runs of one candidate on one suite; each dict holds an item's fields."""
    from datetime import datetime, timedelta, timezone

    from routeopt.evals.storage.store import Outcome

    store = Store(path)
    for k, (run_id, rows) in enumerate((("before", before), ("now", now))):
        store.begin_run(run_id)
        when = datetime(2026, 5, 1, tzinfo=timezone.utc) + timedelta(days=k)
        store._write("UPDATE runs SET started_at = ? WHERE run_id = ?", [(when, run_id)])
        store.write_outcomes([Outcome(run_id, "s", "v1", f"{i:03d}", "m", **r) for i, r in enumerate(rows)])
        store.finish_run(run_id)
    return store


def _graded(ok: bool, latency: float = 1.0, **kw) -> dict:
    return dict(passed=ok, score=float(ok), latency_s=latency, ttft_s=latency / 2, cost_usd=0.01, **kw)


def test_the_same_items_are_compared_pairwise(tmp_path: Path):
    """8 of 48 passing items now fail and none recovers: 0.8 -> 0.667. An unpaired test on two
    samples of 60 calls this chance (Fisher p = 0.13); item by item it is 8 flips one way."""
    before = [_graded(i < 48) for i in range(60)]
    now = [_graded(i < 40) for i in range(60)]
    with _two_nights(tmp_path / "db.duckdb", before, now) as store:
        report = detect_drift(store, "now")
    drop = _find(report, "m", "s", "pass_rate")
    assert len(drop) == 1 and drop[0].severity == "regression"
    assert drop[0].p_value == pytest.approx(2 * 0.5**8)
    assert (drop[0].baseline, drop[0].current) == (pytest.approx(0.8), pytest.approx(40 / 60))


def test_timeouts_count_as_failures_and_our_errors_do_not(tmp_path: Path):
    """A model that starts timing out on half the items has regressed in pass rate, not only in
    error rate; items an open breaker or a spend cap kept from it are no evidence either way."""
    before = [_graded(True) for _ in range(60)]
    now = (
        [_graded(True) for _ in range(20)]
        + [dict(error_kind="timeout") for _ in range(20)]
        + [dict(error_kind="circuit_open") for _ in range(20)]
    )
    with _two_nights(tmp_path / "db.duckdb", before, now) as store:
        report = detect_drift(store, "now")
    drop = _find(report, "m", "s", "pass_rate")
    assert len(drop) == 1 and drop[0].current == pytest.approx(0.5) and drop[0].n_current == 40
    errors = _find(report, "m", "s", "error_rate")
    assert errors[0].current == pytest.approx(0.5) and errors[0].severity == "regression"


def test_replayed_answers_count_in_pass_rates_not_in_times(tmp_path: Path):
    """A replayed cache row keeps its pass label (graded again) but not its original timing."""
    before = [_graded(True) for _ in range(40)]
    now = [_graded(True) for _ in range(30)] + [_graded(False, 50.0, cached=True) for _ in range(10)]
    with _two_nights(tmp_path / "db.duckdb", before, now) as store:
        report = detect_drift(store, "now")
    assert _find(report, "m", "s", "pass_rate")[0].current == pytest.approx(0.75)
    assert not _find(report, "m", "s", "latency_p95_s")  # 30 live items, all as fast as before


def test_min_pass_rate_drop_and_alpha_are_honoured(regressed: Path):
    with Store(regressed, read_only=True) as store:
        strict = detect_drift(store, "run-03", AlertSettings(min_pass_rate_drop=0.5))
        tiny_alpha = detect_drift(store, "run-03", AlertSettings(alpha=1e-30))
    assert not _find(strict, "mid", "arith", "pass_rate")
    assert not _find(tiny_alpha, "mid", "arith", "pass_rate")


def test_blocking_regressions_concern_only_the_policy_candidates(regressed: Path):
    with Store(regressed, read_only=True) as store:
        report = detect_drift(store, "run-03")
    blocking = blocking_regressions(report, ["mid", "small"])
    assert [(f.candidate, f.metric) for f in blocking] == [("mid", "pass_rate")]
    assert blocking_regressions(report, ["small"]) == []
    # a price rise alone does not block: the new policy was trained on the new prices
    assert all(not f.metric.startswith("price") for f in blocking_regressions(report, ["big"]))
