"""The cost model: $/Mtok from throughput, API prices, break-even volumes, the stored curve."""

from __future__ import annotations

import math

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from routeopt.evals.config import Candidate
from routeopt.evals.selfhost import costmodel as cm
from routeopt.evals.selfhost.serving import (
    RequestRecord,
    ServingReport,
    Targets,
    save_report,
    summarize,
)
from routeopt.evals.storage.store import Store


def gpu(**kw) -> Candidate:
    spec = dict(name="gpu-a", provider="local", model="m", gpu_hour_usd=3.6, max_concurrency=8)
    spec.update(kw)
    return Candidate(**spec)


def api(**kw) -> Candidate:
    spec = dict(
        name="api-a", provider="openai", model="m", input_price_per_mtok=1.0, output_price_per_mtok=4.0
    )
    spec.update(kw)
    return Candidate(**spec)


CURVE = [cm.ThroughputPoint(1, 100.0), cm.ThroughputPoint(8, 500.0), cm.ThroughputPoint(32, 1000.0)]


def test_usd_per_mtok_known_value_and_idle_cost():
    # $3.60/h = $0.001/s; 1000 tok/s -> $1 per million tokens at full load, $4 at 25%.
    assert cm.usd_per_mtok(3.6, 1000.0) == pytest.approx(1.0)
    assert cm.usd_per_mtok(3.6, 1000.0, 0.25) == pytest.approx(4.0)
    assert cm.usd_per_mtok(3.6, 0.0) == math.inf
    with pytest.raises(ValueError, match="utilization"):
        cm.usd_per_mtok(3.6, 10.0, 0.0)


@given(st.floats(0.01, 100), st.floats(0.1, 1e5), st.floats(0.01, 1.0), st.floats(0.01, 1.0))
def test_cost_falls_with_throughput_and_utilisation(price, tok_s, u1, u2):
    lo, hi = sorted((u1, u2))
    assert cm.usd_per_mtok(price, tok_s, hi) <= cm.usd_per_mtok(price, tok_s, lo) * (1 + 1e-12)
    assert cm.usd_per_mtok(price, tok_s * 2, hi) < cm.usd_per_mtok(price, tok_s, hi)


def test_cost_table_covers_levels_times_utilisations():
    rows = cm.cost_table(list(reversed(CURVE)), 3.6, (0.5, 1.0))
    assert [(r.concurrency, r.utilization) for r in rows] == [
        (1, 0.5),
        (1, 1.0),
        (8, 0.5),
        (8, 1.0),
        (32, 0.5),
        (32, 1.0),
    ]
    assert rows[-1].usd_per_mtok == pytest.approx(1.0)
    assert rows[0].usd_per_mtok == pytest.approx(20.0)


def test_throughput_interpolates_and_clamps():
    assert cm.throughput_at(CURVE, 1) == 100.0
    assert cm.throughput_at(CURVE, 20) == pytest.approx(500 + 12 / 24 * 500)
    assert cm.throughput_at(CURVE, 512) == 1000.0
    with pytest.raises(ValueError, match="bench serving"):
        cm.throughput_at([], 4)


def test_capacity_ignores_levels_that_miss_targets():
    pts = [
        cm.ThroughputPoint(8, 500.0, goodput_rps=9.5, request_rps=10.0),
        cm.ThroughputPoint(32, 1000.0, goodput_rps=2.0, request_rps=20.0),
    ]
    assert cm.capacity_tok_s(pts) == 500.0
    assert cm.capacity_tok_s(pts, min_good=0.05) == 1000.0
    assert cm.capacity_tok_s([cm.ThroughputPoint(8, 500.0, 0.0, 10.0)]) == 0.0


def test_api_price_includes_input_and_cached_input():
    a = api(cached_input_price_per_mtok=0.1)
    assert cm.api_usd_per_mtok(a) == 4.0
    assert cm.api_usd_per_mtok(a, input_per_output=3.0) == pytest.approx(7.0)
    assert cm.api_usd_per_mtok(a, 3.0, cached_fraction=0.5) == pytest.approx(4 + 3 * 0.55)
    with pytest.raises(ValueError, match="GPU-priced"):
        cm.api_usd_per_mtok(gpu())


def test_break_even_known_numbers():
    # one GPU-day = $86.40; API at $4/Mtok -> 21.6M tokens/day; capacity 1000 tok/s = 86.4M/day
    be = cm.break_even(3.6, 1000.0, 4.0)
    assert be is not None
    assert be.first_tok_per_day == pytest.approx(21.6e6)
    assert be.ratio == pytest.approx(0.25)
    assert be.always_tok_per_day == pytest.approx(21.6e6)  # r = 1/4: the API never wins again
    assert cm.break_even(3.6, 1000.0, 0.5) is None  # self-hosting costs $1/Mtok even at full load


@settings(max_examples=200, deadline=None)
@given(st.floats(0.1, 50), st.floats(1.0, 5000), st.floats(0.01, 50), st.floats(0.0, 1.0))
@example(gpu_hour=0.125, cap=2.0, api_price=17.375, frac=0.0)  # break-even 0.08% below one GPU's capacity
def test_break_even_is_where_the_bills_cross(gpu_hour, cap, api_price, frac):
    """The API wins just below the first break-even and one GPU wins just above it, within one
    GPU's capacity (past it a second GPU's day is due); above `always` self-hosting wins."""
    be = cm.break_even(gpu_hour, cap, api_price)
    bill = lambda v: (cm.selfhost_daily_usd(v, gpu_hour, cap), cm.api_daily_usd(v, api_price))  # noqa: E731
    if be is None:
        # even at full load a GPU-day costs more than the API for the same tokens
        s, a = bill(cap * cm.SECONDS_PER_DAY)
        assert s >= a * (1 - 1e-9)
        return
    s, a = bill(be.first_tok_per_day * 0.999)
    assert a < s
    s, a = bill(min(be.first_tok_per_day * 1.001, (be.first_tok_per_day + be.capacity_tok_per_day) / 2))
    assert s <= a
    above = be.always_tok_per_day * (1.001 + 3 * frac)
    s, a = bill(above)
    assert s <= a * (1 + 1e-9)
    assert be.always_tok_per_day >= be.first_tok_per_day


def test_configured_cost_uses_config_utilisation_and_concurrency():
    c = gpu(utilization=0.5, max_concurrency=8)
    assert cm.configured_usd_per_mtok(c, CURVE) == pytest.approx(3.6 / 3600 / (500 * 0.5) * 1e6)
    assert cm.request_cost_usd(c, 1000, CURVE) == pytest.approx(4e-3 * 1000 / 1000)
    assert cm.configured_usd_per_mtok(api(), CURVE) is None


def test_compare_prices_the_same_traffic_on_both_sides():
    pts = [
        cm.ThroughputPoint(1, 100.0, mean_input_tokens=200, mean_output_tokens=100),
        cm.ThroughputPoint(8, 1000.0, mean_input_tokens=200, mean_output_tokens=100),
    ]
    summaries, verdicts = cm.compare([gpu(), api()], {"gpu-a": pts}, (1.0,))
    (s,) = summaries
    assert s.capacity_tok_s == 1000.0 and s.input_per_output == pytest.approx(2.0)
    (v,) = verdicts
    assert v.api_usd_per_mtok == pytest.approx(4.0 + 2 * 1.0)
    assert v.self_usd_per_mtok_full_load == pytest.approx(1.0)
    assert v.break_even is not None
    assert v.break_even.first_tok_per_day == pytest.approx(86.4 / 6.0 * 1e6)


def _record(out_tokens: int, latency: float) -> RequestRecord:
    return RequestRecord(
        0.0,
        latency,
        True,
        ttft_s=0.1,
        latency_s=latency,
        tpot_s=None,
        input_tokens=10,
        output_tokens=out_tokens,
    )


def test_load_curve_reads_the_latest_benchmark(tmp_path):
    with Store(tmp_path / "db.duckdb") as store:
        assert cm.load_curve(store, "gpu-a") == []
        for tok in (10, 20):
            levels = [summarize(c, [_record(tok, 1.0)] * c, 1.0, c) for c in (1, 4)]
            save_report(store, ServingReport(f"b{tok}", "gpu-a", gpu().public_dict(), "p", Targets(), levels))
        curve = cm.load_curve(store, "gpu-a")
        assert [(p.concurrency, p.output_tok_s) for p in curve] == [(1, 20.0), (4, 80.0)]
        assert curve[0].mean_input_tokens == 10.0
        old = cm.load_curve(store, "gpu-a", bench_id="b10")
        assert [p.output_tok_s for p in old] == [10.0, 40.0]
        # max_concurrency 8 is past the curve's end: 80 tok/s at 50% busy, $3.60/h
        c = gpu(utilization=0.5)
        assert cm.stored_usd_per_mtok(store, c) == pytest.approx(0.001 / 40 * 1e6)
        assert cm.stored_usd_per_mtok(store, gpu(name="never-benched")) is None
        assert cm.stored_usd_per_mtok(store, api()) is None
