"""The whole nightly flow on the embedded demo fleet: real tiny models through the local provider."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest
import yaml

from routeopt.evals.config import load_config


@pytest.mark.slow
def test_nightly_on_the_demo_fleet(tmp_path: Path, repo_root: Path, prefect_harness) -> None:
    from routeopt.flows.nightly import close_store, nightly

    suites = tmp_path / "suites"
    suites.mkdir()
    for task in ("add", "reverse", "sort"):  # the repo's suites, 60 seeded items each
        (suites / f"{task}.yaml").write_text(
            f"include: {repo_root / 'evals' / 'suites' / f'{task}.yaml'}\ndataset: {{limit: 60}}\n"
        )
    demo = yaml.safe_load((repo_root / "evals" / "demo" / "routeopt.yaml").read_text())
    for cand in demo["candidates"]:
        cand["model"] = str(repo_root / "evals" / "demo" / cand["model"])
    demo.update(
        suites_dir="suites", db_path="out/db.duckdb", registry_dir="out/registry", cache_dir="out/cache"
    )
    config = tmp_path / "routeopt.yaml"
    config.write_text(yaml.safe_dump(demo))
    names = [c.name for c in load_config(config).candidates]

    result = nightly(config_path=str(config), run_id="demo-1")
    close_store(tmp_path / "out" / "db.duckdb")

    assert result.suite_errors == {}
    con = duckdb.connect(str(tmp_path / "out" / "db.duckdb"), read_only=True)
    rates = dict(
        con.execute(
            "SELECT candidate, avg(passed::INT) FROM outcomes WHERE error_kind IS NULL GROUP BY 1"
        ).fetchall()
    )
    n, errors = con.execute("SELECT count(*), count(error_kind) FROM outcomes").fetchone()
    con.close()
    assert (n, errors) == (3 * 60 * len(names), 0)
    assert rates["zoo-s"] < rates["zoo-m"] < rates["zoo-l"]  # quality differs for real
    assert abs(rates["zoo-l-int8"] - rates["zoo-l"]) < 0.05
    assert rates["zoo-l-spec"] == rates["zoo-l"]  # a draft never changes a greedy answer
    holdout = result.router_metrics["holdout"]
    assert holdout["oracle"]["pass_rate"] >= holdout["best_single"]["pass_rate"]
    manifest = json.loads((Path(result.published["uri"]) / "manifest.json").read_text())
    assert manifest["lineage"]["runs"] == ["demo-1"] and result.promotion["promoted"]
