"""The HTML dashboard: right numbers, self-contained, escaped; Prefect artifacts; the CLI."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from routeopt.evals.storage.drift import detect_drift
from routeopt.evals.storage.store import Store
from routeopt.reports.dashboard import (
    build_report,
    candidate_stats,
    gather,
    publish_prefect_artifacts,
    render_html,
)
from tests.ops_history import Regression, make_history


@pytest.fixture(scope="module")
def db(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("report") / "db.duckdb"
    make_history(path, runs=4, items=40, regressions=[Regression("mid", "arith", pass_rate=0.2)])
    return path


@pytest.fixture(scope="module")
def trained(db: Path):
    """A real router: train_router on the last run's outcomes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    from routeopt.router_training.train import train_router

    with Store(db, read_only=True) as store:
        frame = store.training_frame(["run-03"])
    return train_router(frame, quality_target=0.9, seed=0)


@pytest.fixture(scope="module")
def metrics(trained) -> dict:
    return trained.metrics


def test_candidate_stats_match_a_direct_computation(db: Path):
    with Store(db, read_only=True) as store:
        rows = {r["candidate"]: r for r in candidate_stats(store, "run-03")}
        raw = store.query("SELECT * FROM outcomes WHERE run_id = 'run-03' AND candidate = 'big'")
    big = rows["big"]
    graded = raw[raw.error_kind.isna()]
    assert big["items"] == len(raw) == 80
    # the history's only errors are rate limits that outlived their retries: failures
    assert set(raw.error_kind.dropna()) <= {"rate_limited"}
    assert big["pass_rate"] == pytest.approx(graded.passed.sum() / len(raw))
    assert big["cost_per_pass"] == pytest.approx(raw.cost_usd.sum() / graded.passed.sum())
    assert big["latency_p95"] == pytest.approx(np.quantile(graded.latency_s, 0.95))
    assert big["ttft_p99"] == pytest.approx(np.quantile(graded.ttft_s, 0.99))
    assert big["output_tokens"] == graded.output_tokens.sum()
    assert big["errors"] == raw.error_kind.notna().sum() and big["excluded"] == 0


def test_errors_and_replayed_answers_count_the_same_way_everywhere(tmp_path: Path):
    """One rule for every statistic: the candidate's errors are failures, errors on our side
    count nowhere, replayed cache rows count in pass rates but not in cost, tokens or time."""
    from routeopt.evals.storage.store import Outcome

    def row(i: int, **kw) -> Outcome:
        base = dict(passed=True, score=1.0, cost_usd=1.0, latency_s=1.0, ttft_s=0.5, output_tokens=10)
        if "error_kind" in kw:
            base = {}
        return Outcome("r", "s", "v", str(i), "c", **{**base, **kw})

    rows = [
        row(0),
        row(1, passed=False, score=0.0),
        row(2, error_kind="timeout"),
        row(3, error_kind="truncated_stream"),
        row(4, error_kind="budget"),
        row(5, error_kind="circuit_open"),
        row(6, cached=True, cost_usd=50.0, latency_s=99.0, ttft_s=99.0, output_tokens=999),
    ]
    with Store(tmp_path / "db.duckdb") as store:
        store.begin_run("r")
        store.write_outcomes(rows)
        stats = candidate_stats(store, "r")[0]
    assert (stats["items"], stats["errors"], stats["excluded"], stats["cached"]) == (7, 2, 2, 1)
    assert stats["pass_rate"] == pytest.approx(2 / 5)  # 0 and 6 pass; 1, 2, 3 fail; 4, 5 left out
    assert stats["cost_usd"] == 2.0 and stats["output_tokens"] == 20  # paid in this run
    assert stats["cost_per_pass"] == 2.0 and stats["latency_p99"] == 1.0


def test_report_is_self_contained_and_shows_every_section(db: Path, metrics: dict, tmp_path: Path):
    with Store(db, read_only=True) as store:
        drift = detect_drift(store, "run-03")
        out = build_report(store, "run-03", tmp_path / "r" / "report.html", drift=drift, metrics=metrics)
    html = out.read_text()
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    # no external resource of any kind: only the SVG namespace URI may appear
    urls = set(re.findall(r"""(?:src|href)\s*=\s*["']?([^"' >]+)""", html))
    assert urls == set()
    assert set(re.findall(r"https?://[^\s\"'<>]+", html)) == {"http://www.w3.org/2000/svg"}
    assert html.count("<svg") == 4  # cost-quality + three trends
    assert 'id="cost-quality"' in html and "router @ target" in html and "oracle" in html
    assert "held-out requests" in html
    for cand in ("big", "mid", "small"):
        assert f"<td>{cand}</td>" in html
    assert html.count('class="sortable suite"') == 2
    assert 'class="sev-regression"' in html and "pass_rate" in html
    assert not list((tmp_path / "r").glob(".*"))  # the temporary file was renamed away


def test_the_knob_table_is_what_each_target_gives_and_bounds_are_labelled(
    db: Path, metrics: dict, tmp_path: Path
):
    """Every row of the knob's table is the held-out promise report's, worded as the run summary
    words it; frontier figures (read off points on the same requests) are labelled upper bounds."""
    from routeopt.reports.summary import promise_line

    with Store(db, read_only=True) as store:
        html = build_report(
            store, "run-03", tmp_path / "k.html", metrics=metrics, policy={"version": 3, "promoted": True}
        ).read_text()
    knob = html[html.index('id="knob"') : html.index("</table>", html.index('id="knob"'))]
    rows = re.findall(r"<tr[^>]*><td>([^<]*)</td>\s*<td>(yes|no)</td><td>([^<]*)</td><td>([^<]*)</td>", knob)
    targets = metrics["holdout"]["promise"]["targets"]
    assert [(float(t), c == "yes", float(f), float(q)) for t, c, f, q in rows] == [
        (
            pytest.approx(r["target"]),
            r["certified"],
            pytest.approx(r["floor"], abs=5e-4),
            pytest.approx(r["pass_rate"], abs=5e-4),
        )
        for r in targets
    ]
    assert promise_line(metrics) in html and "<b>v3</b>" in html and "champion" in html
    bounds = html[html.index('id="router"') : html.index("</thead>", html.index('id="router"'))]
    assert bounds.count("(upper bound)") == 3


def test_without_metrics_the_chart_shows_candidates_and_says_so(db: Path):
    with Store(db, read_only=True) as store:
        html = render_html(gather(store, "run-00"))
    assert "Cost vs quality of each candidate on this run" in html
    assert "No published policy metrics" in html and "Drift was not computed" in html


def test_policy_metrics_are_found_in_the_registry(db: Path, trained, tmp_path: Path):
    from routeopt.artifacts.publish.registry import publish
    from routeopt.artifacts.publish.signing_keys import generate_keys

    key, _ = generate_keys(tmp_path / "keys")
    publish(
        trained.policy,
        tmp_path / "reg",
        lineage={"runs": ["run-02"]},
        metrics=trained.metrics,
        signing_key=key,
    )
    publish(trained.policy, tmp_path / "reg", lineage={"runs": ["run-01"]}, metrics={"x": 1}, signing_key=key)
    with Store(db, read_only=True) as store:
        data = gather(store, "run-02", registry=tmp_path / "reg")
        none = gather(store, "run-03", registry=tmp_path / "reg")
        missing = gather(store, "run-03", registry=tmp_path / "nothing-here")
    assert data.policy_version == 1 and data.metrics["holdout"]["per_candidate"]
    assert none.metrics is None and missing.metrics is None


def test_run_ids_are_escaped(tmp_path: Path):
    from routeopt.evals.storage.store import Outcome

    with Store(tmp_path / "db.duckdb") as store:
        store.begin_run("<script>alert(1)</script>")
        store.write_outcomes([Outcome("<script>alert(1)</script>", "s", "v", "1", "c", passed=True)])
        html = render_html(gather(store, "<script>alert(1)</script>"))
    assert "<script>alert(1)" not in html and "&lt;script&gt;alert(1)" in html


def test_unknown_run_is_a_clear_error(db: Path):
    with Store(db, read_only=True) as store, pytest.raises(KeyError, match="no run 'nope'"):
        gather(store, "nope")


def test_report_cli(db: Path, tmp_path: Path):
    from click.testing import CliRunner

    from routeopt.flows.cli import cli

    out = tmp_path / "report.html"
    res = CliRunner().invoke(cli, ["report", "--db", str(db), "--out", str(out)])
    assert res.exit_code == 0, res.output
    assert "run-03" in res.output and out.exists()
    html = out.read_text()
    assert 'data-run="run-03"' in html and "sev-regression" in html  # drift is computed by default


@pytest.mark.slow
def test_prefect_artifacts_attach_to_the_flow_run(db: Path, metrics: dict, prefect_harness, tmp_path: Path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterId

    @flow
    def publish_them() -> list:
        with Store(db, read_only=True) as store:
            drift = detect_drift(store, "run-03")
            data = gather(store, "run-03", drift=drift, metrics=metrics, trend_runs=1)
            return publish_prefect_artifacts(data, report_path=tmp_path / "r.html")

    ids = publish_them()
    assert len(ids) == 4
    with get_client(sync_client=True) as client:
        arts = {
            a.key: a
            for a in client.read_artifacts(artifact_filter=ArtifactFilter(id=ArtifactFilterId(any_=ids)))
        }
    assert set(arts) == {"routeopt-candidates", "routeopt-suites", "routeopt-router-drift", "routeopt-report"}
    assert arts["routeopt-candidates"].flow_run_id is not None
    table = arts["routeopt-candidates"].data
    rows = table if isinstance(table, list) else __import__("json").loads(table)
    assert {r["candidate"] for r in rows} == {"big", "mid", "small"}
    router = arts["routeopt-router-drift"].data
    assert "regression" in router and "held-out requests" in router and "| verdict |" in router
    assert arts["routeopt-report"].data.startswith("[HTML report](file://")


def test_charts_log_axis_and_empty_data():
    from routeopt.reports.charts import Axis, Series, chart

    svg = chart(
        "c",
        [Series("a", [1e-6, 1e-4, 1e-2], [0.5, 0.7, 0.9], ["x", "y", "z"])],
        Axis("cost", log=True, fmt=".0e"),
        Axis("q"),
        chart_id="t",
    )
    assert svg.count('class="mark"') == 4  # three points and the legend marker
    assert ">1e-04<" in svg and ">1e-06<" in svg and "z: cost 1e-02, q 0.9" in svg
    assert 'class="chart empty"' in chart(
        "none", [Series("a", [None], [1.0])], Axis("x"), Axis("y"), chart_id="e"
    )


def test_the_latency_budget_table_is_the_held_out_budget_report(db: Path, tmp_path: Path):
    """With timed outcomes the page shows each certified budget's held-out pass rate, cost and
    over-budget share; without latency it shows no such table."""
    from routeopt.router_training.train import train_router
    from tests.router_training.conftest import timed_frame

    metrics = train_router(timed_frame(n_items=80), quality_target=0.9, seed=0).metrics
    with Store(db, read_only=True) as store:
        html = build_report(store, "run-03", tmp_path / "b.html", metrics=metrics).read_text()
        plain = build_report(
            store, "run-03", tmp_path / "p.html", metrics={k: v for k, v in metrics.items() if k != "holdout"}
        ).read_text()
    table = html[html.index('id="budgets"') : html.index("</table>", html.index('id="budgets"'))]
    rows = re.findall(r"<tr[^>]*><td>(\w+) ([\d.e-]+) s</td>\s*<td>([^<]*)</td><td>(yes|no)</td>", table)
    want = metrics["holdout"]["latency"]["rows"]
    assert [(k, float(b), float(t), c == "yes") for k, b, t, c in rows] == [
        (r["kind"], pytest.approx(r["budget_s"]), pytest.approx(r["target"]), r["certified"]) for r in want
    ]
    assert 'id="budgets"' not in plain


def test_the_dashboard_shows_how_items_were_answered_as_the_summary_does(db: Path, tmp_path: Path):
    """Batches and carried rows: per candidate the summary's counts, batch states and the
    night's cost against a full synchronous night; a night of synchronous calls shows nothing new."""
    from datetime import datetime, timezone

    from rich.console import Console

    from routeopt.evals.execution.batch import batch_summary
    from routeopt.evals.storage.batches import BatchRecords, Job, Line
    from routeopt.evals.storage.store import Outcome
    from routeopt.reports.summary import modes_table

    def row(i: int, cand: str, mode: str, cost: float, sync: float | None = None) -> Outcome:
        timed = {"latency_s": 1.0, "ttft_s": 0.1} if mode == "sync" else {}
        return Outcome(
            "n", "s", "v", str(i), cand, passed=True, score=1.0, cost_usd=cost, sync_cost_usd=sync,
            call_mode=mode, cached=mode == "carried", batch_id="b-1" if mode == "batch" else None, **timed,
        )  # fmt: skip

    with Store(tmp_path / "db.duckdb") as store:
        store.begin_run("n", batch_option=["gpt"])
        store.write_outcomes(
            [row(i, "gpt", "batch", 0.5, 1.0) for i in range(6)]
            + [row(i, "gpt", "sync", 1.0) for i in range(6, 8)]
            + [row(i, "claude", "carried", 2.0) for i in range(5)]
            + [row(i, "claude", "sync", 2.0) for i in range(5, 8)]
        )
        records = BatchRecords(store)
        now = datetime.now(timezone.utc)
        for sid, state in (("sub-1", "completed"), ("sub-2", "expired")):
            job = Job(sid, "n", "gpt", "openai", 1, "planned", None, None, None, 1, 10, now, None)
            records.plan(job, [Line(f"c-{sid}", "s", "0", 1, 10)], 100)
            records.update(sid, state="harvested", provider_state=state, batch_id=f"b-{sid}")
        summary = batch_summary(store, "n")
        html = build_report(store, "n", tmp_path / "n.html").read_text()
        with Store(db, read_only=True) as old:
            plain = build_report(old, "run-03", tmp_path / "plain.html").read_text()
            assert gather(old, "run-03").modes == []
    section = html[html.index('id="modes"') : html.index("</table>", html.index('id="modes"'))]
    cells = re.findall(r"<tr><td>(\w+)</td>(.*?)</tr>", section, re.S)
    shown = {c: re.findall(r"<td>([^<]*)</td>", rest) for c, rest in cells}
    by = {r["candidate"]: r for r in summary}
    assert shown == {
        c: [
            str(by[c]["batch"]),
            str(by[c]["sync"]),
            str(by[c]["carried"]),
            str(by[c]["latency_rows"]),
            ", ".join(f"{s} {n}" for s, n in sorted(by[c]["batches"].items())) or "-",
            format(by[c]["cost_usd"], ".4g"),
            format(by[c]["full_sync_usd"], ".4g"),
        ]
        for c in ("claude", "gpt")
    }
    assert shown["gpt"] == ["6", "2", "0", "2", "completed 1, expired 1", "5", "8"]
    assert shown["claude"][:4] == ["0", "3", "5", "3"]
    total = re.sub(r"\s+", " ", html[html.index('id="modes-total"') :].split("</p>")[0])
    assert "This night cost 11 USD against 24 USD for a full synchronous night (45.8%)" in total
    assert "by <code>--batch</code>: gpt." in total
    out = Console(record=True, width=200)
    out.print(modes_table(summary))
    assert "completed 1, expired 1" in out.export_text()  # the same states as the summary's
    assert 'id="modes"' not in plain and "How items were answered" not in plain
