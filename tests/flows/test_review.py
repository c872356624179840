"""review_run (drift, alerts) and report_run (the dashboard and Prefect artifacts), as the flow calls them."""

from __future__ import annotations

from pathlib import Path

import pytest

from routeopt.evals.config import AlertSettings, Candidate, Config
from routeopt.evals.storage.store import Store
from routeopt.flows.review import default_report_path, report_run, review_run
from tests.ops_history import Regression, make_history
from tests.ops_receiver import receiver  # noqa: F401 (a fixture)

pytestmark = pytest.mark.slow  # needs the session Prefect server


def test_review_run_alerts_reports_and_blocks(tmp_path: Path, prefect_harness, receiver):  # noqa: F811
    from prefect import flow

    url, handler = receiver
    db = tmp_path / "db.duckdb"
    make_history(db, runs=4, items=60, regressions=[Regression("mid", "arith", pass_rate=0.2)])
    cfg = Config(
        candidates=[Candidate(name="x", provider="openai", model="m", input_price_per_mtok=1.0)],
        db_path=db,
        registry_dir=tmp_path / "reg",
        alerts=AlertSettings(webhook_url=url),
    )

    @flow
    def nightly_like():
        with Store(db, read_only=True) as store:
            review = review_run(cfg, store, "run-03", policy_candidates=["mid", "small"])
            return review, report_run(
                cfg,
                store,
                "run-03",
                drift=review.drift,
                policy={"version": 7, "promoted": False, "reason": "drift"},
            )

    review, (path, artifacts) = nightly_like()
    assert [(f.candidate, f.metric) for f in review.blocking] == [("mid", "pass_rate")]
    assert review.alerts["webhook"] is True and review.alerts["events"] == len(review.drift.findings) + 1
    assert handler.received[0]["body"]["run_id"] == "run-03"
    assert path == default_report_path(cfg, "run-03") == tmp_path / "reports" / "run-03.html"
    html = path.read_text()
    assert "sev-regression" in html and "<b>v7</b>" in html and "not promoted: drift" in html
    assert len(artifacts) == 4
