"""`routeopt cost plan`: logged hourly volumes -> monthly API bills vs GPUs sized for the peak."""

from __future__ import annotations

import json
import math

import pandas as pd
import pytest
from click.testing import CliRunner
from hypothesis import given
from hypothesis import strategies as st

from routeopt.evals.config import Config
from routeopt.evals.selfhost.costmodel import ThroughputPoint, gpu_plan, traffic_break_even
from routeopt.evals.selfhost.costplan import cost_plan, format_plan, model_traffic
from routeopt.flows.cli import cli
from tests.evals.storage.test_traffic import decision, write_log
from tests.fake_llm import FakeLLM


def _cfg() -> Config:
    return Config.model_validate(
        {
            "candidates": [
                {
                    "name": "api",
                    "provider": "openai",
                    "model": "x",
                    "input_price_per_mtok": 1.0,
                    "output_price_per_mtok": 2.0,
                },
                {
                    "name": "open",
                    "provider": "openai",
                    "model": "llama",
                    "base_url": "http://gpu/v1",
                    "gpu_hour_usd": 2.0,
                },
                {
                    "name": "unbenched",
                    "provider": "openai",
                    "model": "m",
                    "base_url": "http://gpu2/v1",
                    "gpu_hour_usd": 1.0,
                },
            ],
            "traffic": {"api_prices": {"open": {"input_price_per_mtok": 0.2, "output_price_per_mtok": 0.6}}},
        }
    )


def _frame() -> pd.DataFrame:
    """48 hours: 'open' serves 10 requests an hour (36,000 output tokens), 100 in hour 30;
    'api' 5 requests an hour; one 'unbenched' request."""
    rows = []
    for h in range(48):
        for i in range(100 if h == 30 else 10):
            rows.append(
                {
                    "time": pd.Timestamp("2025-03-01", tz="UTC") + pd.Timedelta(hours=h, minutes=i % 60),
                    "model": "open",
                    "input_tokens": 1000,
                    "output_tokens": 3600,
                    "prompt_chars": 4000,
                }
            )
        for i in range(5):
            rows.append(
                {
                    "time": pd.Timestamp("2025-03-01", tz="UTC") + pd.Timedelta(hours=h, minutes=i),
                    "model": "api",
                    "input_tokens": 2000,
                    "output_tokens": None,
                    "prompt_chars": 8000,
                }
            )
    rows.append(
        {
            "time": pd.Timestamp("2025-03-01T05:00Z"),
            "model": "unbenched",
            "input_tokens": None,
            "output_tokens": None,
            "prompt_chars": 400,
        }
    )
    return pd.DataFrame(rows)


def test_model_traffic_counts_tokens_per_hour() -> None:
    frame = _frame()
    frame.loc[frame.model == "api", "output_tokens"] = 100
    traffic, hours, start, _ = model_traffic(frame)
    assert hours == 48 and str(start) == "2025-03-01 00:00:00+00:00"
    open_ = next(t for t in traffic if t.model == "open")
    assert open_.requests == 570 and open_.output_tokens == 570 * 3600
    assert open_.hourly_output_tokens[30] == 360_000 and open_.hourly_output_tokens[0] == 36_000
    un = next(t for t in traffic if t.model == "unbenched")
    assert un.estimated == 1 and un.input_tokens == 100  # 400 chars / 4


def test_cost_plan_sizes_gpus_for_the_peak_and_prices_both_sides() -> None:
    curves = {"open": [ThroughputPoint(1, 20.0), ThroughputPoint(8, 60.0)]}
    plan = cost_plan(_frame(), _cfg(), curves)
    scale = 730 / 48
    rows = {r.model: r for r in plan.rows}
    api, open_, un = rows["api"], rows["open"], rows["unbenched"]
    assert plan.tokens_estimated == 241  # api rows lack output tokens, unbenched lacks both
    assert api.kind == "api" and api.api_monthly_usd == pytest.approx(240 * 2000 * scale * 1.0 / 1e6)
    g = open_.gpu
    assert g.peak_tok_s == pytest.approx(100.0) and g.capacity_tok_s == 60.0 and g.gpus == 2
    assert g.mean_tok_s == pytest.approx(570 * 3600 / 48 / 3600)
    assert g.utilization == pytest.approx(g.mean_tok_s / 120.0)
    assert g.monthly_usd == pytest.approx(2 * 2.0 * 730) and g.serves_peak
    open_api = (570 * 1000 * 0.2 + 570 * 3600 * 0.6) * scale / 1e6
    assert open_.api_monthly_usd == pytest.approx(open_api)
    assert open_.break_even_scale == pytest.approx(traffic_break_even(open_api, 2.0 * 730, 100.0, 60.0))
    assert un.gpu is None and "bench serving --candidate unbenched" in un.note
    assert plan.mixed_usd is None and plan.all_api_usd is None  # unbenched has neither price
    fixed = cost_plan(_frame(), _cfg(), curves, gpus=1)
    assert not fixed.rows[0].gpu.serves_peak and "cannot serve the busiest hour" in fixed.rows[0].note
    text = format_plan(plan)
    assert "logged traffic: 811 requests over 48 h" in text
    rows_text = [line for line in text.splitlines()[4:] if line and not line.startswith(" ")]
    assert [line.split()[0] for line in rows_text[:3]] == ["open", "api", "unbenched"]
    assert "(GPU capacity 60.0 out tok/s, modelled: bench serving at fixed concurrency)" in text


def test_cost_plan_can_size_gpus_at_the_capacity_a_replay_measured() -> None:
    """The replay held 4x the logged traffic: 150 output tok/s in its busiest minute, against the
    bench's 60 at fixed concurrency; the plan says which figure it used."""
    curves = {"open": [ThroughputPoint(1, 20.0), ThroughputPoint(8, 60.0)]}
    plan = cost_plan(_frame(), _cfg(), curves, replays={"open": (150.0, "replay-x", 4.0)})
    rows = {r.model: r for r in plan.rows}
    g = rows["open"].gpu
    assert g.capacity_tok_s == 150.0 and g.gpus == 1 and g.serves_peak
    assert rows["open"].capacity_source == "measured: replay replay-x held 4x the logged traffic"
    assert (
        rows["unbenched"].gpu is None
        and "routeopt bench replay LOG --candidate unbenched" in rows["unbenched"].note
    )
    assert (
        "(GPU capacity 150.0 out tok/s, measured: replay replay-x held 4x the logged traffic)"
        in format_plan(plan)
    )


@given(st.floats(1, 1e5), st.floats(1, 1e4), st.floats(0.1, 1e3), st.floats(0.1, 1e3))
def test_break_even_is_the_first_volume_where_gpus_win(api, gpu, peak, cap) -> None:
    s = traffic_break_even(api, gpu, peak, cap)

    def gpus_win(scale: float) -> bool:
        return max(1, math.ceil(scale * peak / cap - 1e-9)) * gpu <= scale * api * (1 + 1e-9)  # >= 1 GPU

    if s is None:
        assert not any(gpus_win(k * cap / peak) for k in range(1, 50))  # not even at full bands
    else:
        assert gpus_win(s)
        assert not any(gpus_win(s * f) for f in (0.5, 0.9, 0.99) if s * f > 0)


def test_gpu_plan_guards() -> None:
    with pytest.raises(ValueError, match="bench serving"):
        gpu_plan([1.0], 0.0, 1.0)
    with pytest.raises(ValueError, match="one non-negative value per hour"):
        gpu_plan([], 10.0, 1.0)
    idle = gpu_plan([0.0, 0.0, 36_000.0], 10.0, 1.0)
    assert idle.gpus == 1 and idle.utilization == pytest.approx(1 / 3)


def test_cli_cost_plan_on_a_measured_serving_benchmark(tmp_path) -> None:
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a b c d e f", "max_tokens": 32}) + "\n")
    db, cfg = tmp_path / "db.duckdb", tmp_path / "cfg.yaml"
    runner = CliRunner()
    with FakeLLM(token_delay_s=0.002) as server:
        cfg.write_text(
            "candidates:\n"
            f"  - {{name: open, provider: openai, model: m, base_url: '{server.openai_base_url}',"
            " gpu_hour_usd: 2.0, max_concurrency: 4}\n"
            "  - {name: api, provider: openai, model: x, input_price_per_mtok: 1.0, output_price_per_mtok: 3.0}\n"
            "traffic: {api_prices: {open: {input_price_per_mtok: 0.1, output_price_per_mtok: 0.3}}}\n"
        )
        res = runner.invoke(
            cli,
            [
                "bench",
                "serving",
                "--candidate",
                "open",
                "--config",
                str(cfg),
                "--prompts",
                str(prompts),
                "--concurrency",
                "1,4",
                "--requests",
                "8",
                "--db",
                str(db),
            ],
        )
        assert res.exit_code == 0, res.output
    records = [
        decision(f"r{h}-{i}", "open" if i % 2 else "api", time=f"2025-03-01T{h:02d}:{i:02d}:00Z")
        for h in range(24)
        for i in range(20)
    ]
    usage = [
        {
            "kind": "usage",
            "time": r["time"],
            "request_id": r["request_id"],
            "model": r["model"],
            "input_tokens": 500,
            "output_tokens": 200,
        }
        for r in records
    ]
    log = write_log(tmp_path / "log.jsonl", records + usage)
    res = runner.invoke(cli, ["cost", "plan", "--log", str(log), "--config", str(cfg), "--db", str(db)])
    assert res.exit_code == 0, res.output
    out = res.output
    assert "logged traffic: 480 requests over 24 h" in out and "tokens estimated for 0 requests" in out
    open_line = next(line for line in out.splitlines() if line.startswith("open "))
    assert "self-hosted" in open_line and " 1 " in open_line  # one GPU serves this peak
    assert "monthly, everything on provider APIs:" in out
    as_json = json.loads(
        runner.invoke(
            cli, ["cost", "plan", "--log", str(log), "--config", str(cfg), "--db", str(db), "--json"]
        ).output
    )
    rows = {r["model"]: r for r in as_json["rows"]}
    assert rows["open"]["monthly_output_tokens"] == pytest.approx(240 * 200 * 730 / 24)
    assert rows["open"]["gpu"]["monthly_usd"] == pytest.approx(2.0 * 730)
    missing = runner.invoke(cli, ["cost", "plan", "--config", str(cfg), "--db", str(tmp_path / "none.db")])
    assert missing.exit_code != 0 and "no logged decisions" in missing.output
