"""The serving benchmark: load generator, figures, prompts, storage, and the CLI - against the
fake OpenAI-compatible server (real SDK, real SSE) and an in-process local checkpoint."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import sys

import pytest
from click.testing import CliRunner

from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import Completion, GenerationSettings, Message, Request
from routeopt.evals.selfhost.serving import (
    RequestRecord,
    ServingError,
    Targets,
    bench_serving,
    load_prompts,
    markdown_table,
    parse_levels,
    percentiles,
    run_level,
    save_report,
    summarize,
)
from routeopt.evals.storage.store import Store
from tests.benchmarks import load
from tests.fake_llm import FakeLLM


def req(text: str, max_tokens: int = 64) -> Request:
    return Request((Message("user", text),), GenerationSettings(max_tokens=max_tokens))


class SleepyProvider:
    """A provider that holds each call for a fixed time: it tests the load generator alone."""

    def __init__(self, hold_s: float = 0.02):
        self.hold_s = hold_s
        self.in_flight = 0
        self.peak = 0
        self.calls = 0

    async def generate(self, request: Request) -> Completion:
        self.calls += 1
        self.in_flight += 1
        self.peak = max(self.peak, self.in_flight)
        try:
            await asyncio.sleep(self.hold_s)
        finally:
            self.in_flight -= 1
        return Completion(
            text="x y",
            finish_reason="stop",
            input_tokens=3,
            output_tokens=2,
            ttft_s=self.hold_s / 2,
            latency_s=self.hold_s,
        )

    async def aclose(self) -> None:
        pass


def test_percentiles_and_empty_sample():
    assert percentiles([]) is None
    p = percentiles(list(range(1, 101)))
    assert p["p50"] == pytest.approx(50.5) and p["p99"] == pytest.approx(99.01)
    assert p["mean"] == pytest.approx(50.5)


def test_parse_levels_names_the_bad_entry():
    assert parse_levels("1, 8,32") == [1, 8, 32]
    with pytest.raises(ServingError, match="'x'"):
        parse_levels("1,x")
    with pytest.raises(ServingError, match="'0'"):
        parse_levels("0")


@pytest.mark.parametrize("c,n", [(1, 5), (4, 10), (16, 40)])
async def test_run_level_keeps_exactly_c_in_flight(c, n):
    provider = SleepyProvider()
    records, wall, peak = await run_level(provider, [req("a"), req("b")], c, n)
    assert len(records) == n == provider.calls
    assert peak == provider.peak == c
    assert wall >= provider.hold_s * (n // c)
    assert all(r.ok for r in records)


def test_summarize_figures_from_known_records():
    recs = [
        RequestRecord(
            0.0,
            1.0,
            True,
            ttft_s=0.2,
            latency_s=1.0,
            tpot_s=0.1,
            input_tokens=5,
            output_tokens=9,
            chunk_gaps_s=[0.1] * 8,
        ),
        RequestRecord(
            0.0,
            2.0,
            True,
            ttft_s=0.5,
            latency_s=2.0,
            tpot_s=0.15,
            input_tokens=7,
            output_tokens=11,
            chunk_gaps_s=[0.2, 0.1],
        ),
        RequestRecord(0.5, 1.5, False, error_kind="timeout"),
    ]
    lv = summarize(2, recs, 2.0, 2, Targets(latency_s=1.5, ttft_s=1.0))
    assert (lv.requests, lv.errors) == (3, 1)
    assert lv.output_tok_s == pytest.approx(20 / 2.0)
    assert lv.input_tok_s == pytest.approx(12 / 2.0)
    assert lv.request_rps == pytest.approx(1.0)
    assert lv.goodput_rps == pytest.approx(0.5)  # only the first meets latency <= 1.5
    assert lv.mean_in_flight == pytest.approx(4.0 / 2.0)
    assert lv.itl_s["p50"] == pytest.approx(0.1)
    assert lv.request_tok_s["p50"] == pytest.approx((9 + 5.5) / 2)
    assert lv.ttft_s["p50"] == pytest.approx(0.35)
    assert summarize(1, recs, 2.0, 1).goodput_rps is None  # no targets, no goodput


def test_load_prompts_formats_and_errors(tmp_path):
    good = tmp_path / "p.jsonl"
    good.write_text(
        '{"prompt": "hi", "max_tokens": 7}\n\n'
        '{"messages": [{"role": "user", "content": "yo"}], "system": "s"}\n'
    )
    a, b = load_prompts(good)
    assert a.settings.max_tokens == 7 and a.chat == [{"role": "user", "content": "hi"}]
    assert b.system == "s" and b.settings.max_tokens == 128
    assert all(r.settings.max_tokens == 3 for r in load_prompts(good, max_tokens=3))
    txt = tmp_path / "p.txt"
    txt.write_text("one\n\ntwo\n")
    assert [r.prompt_text for r in load_prompts(txt)] == ["one", "two"]
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"prompt": "ok"}\n{"nope": 1}\n')
    with pytest.raises(ServingError, match=r"bad\.jsonl:2: needs a string 'prompt'"):
        load_prompts(bad)
    bad.write_text('{"prompt": "ok"}\n{oops\n')
    with pytest.raises(ServingError, match=r"bad\.jsonl:2: not valid JSON"):
        load_prompts(bad)
    with pytest.raises(ServingError, match="not found"):
        load_prompts(tmp_path / "missing.jsonl")


def test_load_prompts_from_a_suite(tmp_path):
    (tmp_path / "d.jsonl").write_text('{"q": "1+1", "a": "2"}\n{"q": "2+2", "a": "4"}\n')
    (tmp_path / "s.yaml").write_text(
        "name: s\ndataset: {path: d.jsonl}\nprompt: {template: 'Q: {{ q }}'}\n"
        "generation: {max_tokens: 5}\ngrader: {type: exact_match, target: '{{ a }}'}\n"
    )
    reqs = load_prompts(tmp_path / "s.yaml")
    assert [r.prompt_text for r in reqs] == ["Q: 1+1", "Q: 2+2"]
    assert reqs[0].settings.max_tokens == 5


def fake_candidate(server: FakeLLM, **kw) -> Candidate:
    spec = dict(
        name="fake-gpu",
        provider="openai",
        model="served-model",
        base_url=server.openai_base_url,
        gpu_hour_usd=2.0,
        timeout_s=10.0,
    )
    spec.update(kw)
    return Candidate(**spec)


async def test_bench_against_openai_compatible_server(tmp_path):
    words = " ".join(f"w{i}" for i in range(12))
    with FakeLLM(first_token_delay_s=0.03, token_delay_s=0.004) as server:
        cand = fake_candidate(server)
        report = await bench_serving(cand, [req(words, 64)], [1, 4], 8, Targets(ttft_s=10.0))
        sent = server.requests
    assert len(sent) == 1 + 2 * 8  # one warmup, then 8 per level
    assert all(r.body["stream"] is True and r.body["model"] == "served-model" for r in sent)
    for lv in report.levels:
        assert lv.errors == 0 and lv.max_in_flight == lv.concurrency
        # "echo: w0 ... w11" is 13 whitespace tokens in the fake server's usage
        assert lv.mean_output_tokens == 13
        # The server sleeps 0.03 s, then 0.004 s before each of its 13 chunks, so a client's
        # clock can only see more: TTFT plus the 12 gaps of every request. No single gap is
        # bounded: a busy client reads several chunks at once and times them ~0 apart.
        assert lv.ttft_s["p50"] >= 0.03
        assert lv.ttft_s["mean"] + 12 * lv.itl_s["mean"] >= 0.03 + 13 * 0.004 - 1e-3
        assert lv.latency_s["p50"] >= 0.03 + 13 * 0.004 - 1e-3
        assert lv.goodput_rps == pytest.approx(lv.request_rps)
    assert report.levels[1].output_tok_s > report.levels[0].output_tok_s
    with Store(tmp_path / "db.duckdb") as store:
        assert save_report(store, report) == 2
        assert save_report(store, report) == 2  # idempotent: same keys, no duplicates
        df = store.query("SELECT * FROM serving_runs ORDER BY concurrency")
    assert list(df["concurrency"]) == [1, 4]
    assert df["base_url"].iloc[0] == cand.base_url and df["ttft_target_s"].iloc[0] == 10.0
    assert json.loads(df["detail_json"].iloc[0])["error_kinds"] == {}
    assert "| 4 | 8 | 0 |" in markdown_table(report)


async def test_errors_are_counted_not_fatal():
    with FakeLLM() as server:
        cand = fake_candidate(server, timeout_s=5.0)
        reqs = [req("fine"), req("[[fault:server_error]] boom")]
        report = await bench_serving(cand, reqs, [2], 6, warmup=0)
    lv = report.levels[0]
    assert (lv.requests, lv.errors) == (6, 3)
    assert lv.mean_output_tokens == 2  # "echo: fine"


def test_cli_bench_then_cost_compare(tmp_path):
    from routeopt.flows.cli import cli

    prompts = tmp_path / "p.jsonl"
    prompts.write_text(json.dumps({"prompt": "a b c d e f", "max_tokens": 32}) + "\n")
    db = tmp_path / "db.duckdb"
    with FakeLLM(token_delay_s=0.002) as server:
        cfg = tmp_path / "cfg.yaml"
        cfg.write_text(
            "candidates:\n"
            f"  - {{name: fake-gpu, provider: openai, model: m, base_url: '{server.openai_base_url}',"
            " gpu_hour_usd: 2.0, utilization: 0.5, max_concurrency: 4}\n"
            "  - {name: api-x, provider: openai, model: x, input_price_per_mtok: 1.0,"
            " output_price_per_mtok: 3.0}\n"
        )
        runner = CliRunner()
        res = runner.invoke(
            cli,
            [
                "bench",
                "serving",
                "--candidate",
                "fake-gpu",
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
                "--json-out",
                str(tmp_path / "o.json"),
            ],
        )
        assert res.exit_code == 0, res.output
        assert "stored 2 rows" in res.output
        assert json.loads((tmp_path / "o.json").read_text())["levels"][1]["concurrency"] == 4
        bad = runner.invoke(
            cli,
            [
                "bench",
                "serving",
                "--candidate",
                "nope",
                "--config",
                str(cfg),
                "--prompts",
                str(prompts),
                "--db",
                str(db),
            ],
        )
        assert bad.exit_code != 0 and "no candidate 'nope'" in bad.output
    res = runner.invoke(cli, ["cost", "compare", "--config", str(cfg), "--db", str(db)])
    assert res.exit_code == 0, res.output
    assert "fake-gpu" in res.output and "api-x" in res.output and "Break-even" in res.output
    empty = runner.invoke(cli, ["cost", "compare", "--config", str(cfg), "--db", str(tmp_path / "x.db")])
    assert empty.exit_code != 0 and "bench serving" in empty.output


def _gpu_check():
    return load("gpu_check")


async def test_bench_local_checkpoint(tmp_path):
    """A local candidate: an in-process random Llama through the local provider's batcher."""
    pytest.importorskip("transformers")
    gc = _gpu_check()
    ckpt = gc.build_checkpoint(tmp_path / "ckpt", gc.ARCH_TINY)
    cand = Candidate(
        name="tiny",
        provider="local",
        model=ckpt["path"],
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=4,
    )
    reqs = [req("add: 12+7=", 6), req("sort: 9381=", 6)]
    report = await bench_serving(cand, reqs, [1, 4], 4)
    for lv in report.levels:
        assert lv.errors == 0 and lv.max_in_flight == lv.concurrency
        assert lv.mean_output_tokens == 6  # EOS can never win: every request runs to max_tokens
        assert lv.tpot_s is not None and lv.itl_s is not None and lv.ttft_s is not None
        assert lv.mean_input_tokens == pytest.approx((11 + 12) / 2)  # bos + one token per char


def test_one_bench_group_shared_with_the_router_commands():
    from routeopt.flows.cli import cli
    from routeopt.flows.commands import gpu

    assert "serving" in gpu.bench.commands
    assert cli.commands["bench"] is gpu.bench  # whichever module registers it last
    if importlib.util.find_spec("routeopt.flows.commands.router") is not None:
        router = importlib.import_module("routeopt.flows.commands.router")
        if hasattr(router, "bench"):
            assert router.bench is gpu.bench


def test_locked_database_is_one_clear_error(tmp_path):
    import subprocess

    from routeopt.flows.cli import cli

    db = tmp_path / "held.duckdb"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text("candidates:\n  - {name: g, provider: local, model: m, gpu_hour_usd: 1.0}\n")
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import duckdb, sys, time; c = duckdb.connect({str(db)!r}); "
            "print('held', flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        res = CliRunner().invoke(cli, ["cost", "compare", "--config", str(cfg), "--db", str(db)])
    finally:
        holder.kill()
        holder.wait()
    assert res.exit_code != 0
    assert "cannot open the database" in res.output and "--db" in res.output


def test_summarize_acceptance_of_a_draft():
    recs = [
        RequestRecord(0.0, 1.0, True, output_tokens=9, draft_tokens=12, accepted_draft_tokens=6),
        RequestRecord(0.0, 1.0, True, output_tokens=5, draft_tokens=6, accepted_draft_tokens=0),
        RequestRecord(0.0, 1.0, False, error_kind="timeout"),
    ]
    lv = summarize(2, recs, 1.0, 2, num_draft=3)
    assert lv.acceptance_rate == pytest.approx(6 / 18)
    assert lv.mean_accepted_length == pytest.approx(1 + 6 / (18 / 3))  # 6 verification steps
    assert summarize(2, recs, 1.0, 2).acceptance_rate is None  # no draft, no figure


def test_cli_bench_a_draft_with_its_baseline(tmp_path, repo_root):
    """`bench serving` on a candidate with a draft: acceptance beside TTFT/TPOT, the same
    candidate without the draft at each concurrency, the speed-up, both stored."""
    pytest.importorskip("transformers")
    import duckdb

    from routeopt.flows.cli import cli

    zoo = repo_root / "evals" / "demo" / "zoo"
    cfg = tmp_path / "cfg.yaml"
    cfg.write_text(
        "candidates:\n"
        f"  - {{name: zoo-s, provider: local, model: {zoo / 'zoo-s'}, gpu_hour_usd: 0.5}}\n"
        f"  - {{name: zoo-l-spec, provider: local, model: {zoo / 'zoo-l'}, gpu_hour_usd: 2.0,"
        " device: cpu, speculative: {model: zoo-s, num_speculative_tokens: 3}}\n"
    )
    db = tmp_path / "db.duckdb"
    from routeopt.evals.selfhost import serving

    old_schema = serving.SCHEMA.replace(
        "acceptance_rate DOUBLE, mean_accepted_length DOUBLE, draft_model VARCHAR,", ""
    )
    assert old_schema != serving.SCHEMA
    con = duckdb.connect(str(db))  # a table from before the speculative columns existed
    con.execute(old_schema)
    con.execute(
        "INSERT INTO serving_runs (bench_id, candidate, concurrency, created_at) "
        "VALUES ('old', 'x', 1, now())"
    )
    con.close()
    res = CliRunner().invoke(
        cli,
        [
            "bench",
            "serving",
            "--candidate",
            "zoo-l-spec",
            "--config",
            str(cfg),
            "--prompts",
            str(repo_root / "evals" / "suites" / "sort.yaml"),
            "--concurrency",
            "1,4",
            "--requests",
            "8",
            "--db",
            str(db),
            "--json-out",
            str(tmp_path / "o.json"),
        ],
    )
    assert res.exit_code == 0, res.output
    assert "draft accept" in res.output and "zoo-l-spec:no-draft" in res.output
    assert "output tok/s with the draft / without: c=1: " in res.output
    assert "stored 4 rows" in res.output
    out = json.loads((tmp_path / "o.json").read_text())
    assert set(out["speedup_by_concurrency"]) == {"1", "4"}
    assert out["without_draft"]["levels"][0]["acceptance_rate"] is None
    con = duckdb.connect(str(db), read_only=True)
    rows = con.execute(
        "SELECT candidate, concurrency, acceptance_rate, mean_accepted_length, "
        "draft_model FROM serving_runs WHERE bench_id != 'old' "
        "ORDER BY candidate, concurrency"
    ).fetchall()
    con.close()
    assert [r[:2] for r in rows] == [
        ("zoo-l-spec", 1),
        ("zoo-l-spec", 4),
        ("zoo-l-spec:no-draft", 1),
        ("zoo-l-spec:no-draft", 4),
    ]
    for name, _, rate, length, draft in rows:
        if name == "zoo-l-spec":
            assert 0 < rate < 1 and 1 < length < 4 and draft == str(zoo / "zoo-s")
        else:
            assert rate is None and length is None and draft is None
