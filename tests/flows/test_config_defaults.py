"""Every command that takes --db, --registry, --public-key or a source defaults to what the
config names, as `routeopt run` does; reports are readable (0644) unless the config says."""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from routeopt.evals.storage.store import Outcome, Store
from routeopt.flows.cli import cli
from tests.router_training.conftest import demo_frame


def _invoke(*args: str) -> "object":
    result = CliRunner().invoke(cli, list(args))
    assert result.exit_code == 0, result.output
    return result


@pytest.fixture
def project(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for var in ("ROUTEOPT_SIGNING_KEY", "ROUTEOPT_PUBLIC_KEY", "ROUTEOPT_REGISTRY", "ROUTEOPT_CONFIG"):
        monkeypatch.delenv(var, raising=False)
    config = tmp_path / "team" / "routeopt.yaml"
    config.parent.mkdir()
    config.write_text(
        json.dumps(
            {
                "candidates": [
                    {
                        "name": n,
                        "provider": "openai",
                        "model": n,
                        "input_price_per_mtok": 1,
                        "output_price_per_mtok": 1,
                    }
                    for n in ("tiny", "small", "medium", "large")
                ],
                "db_path": "state/outcomes.duckdb",
                "registry_dir": "state/policies",
            }
        )
    )
    monkeypatch.chdir(tmp_path)  # not beside the config: the paths come from it
    return config


def test_import_train_verify_list_and_route_with_the_config_alone(project: Path, tmp_path: Path) -> None:
    data = tmp_path / "outcomes.parquet"
    demo_frame(n_items=60).to_parquet(data)
    state = project.parent / "state"
    _invoke("import", "outcomes", str(data), "--config", str(project))
    assert (state / "outcomes.duckdb").exists()
    trained = _invoke("train", "--config", str(project), "--quality-target", "0.9")
    assert f"to {state / 'policies'}" in trained.output  # "published version 1 (signed, ...) to ..."
    verified = _invoke("policies", "verify", "--config", str(project))  # the registry, the key beside it
    assert verified.output.startswith(f"source: {state / 'policies'}\n") and "(key " in verified.output
    assert verified.output.rstrip().endswith("OK")
    listed = _invoke("policies", "list", "--config", str(project))
    assert listed.output.splitlines()[1].split()[0] == "1"
    routed = _invoke(
        "route", "--config", str(project), "Task: add the input. difficulty: 1.", "--suite", "add"
    )
    assert json.loads(routed.output)["model"] in {"tiny", "small", "medium", "large"}


def test_without_a_store_train_says_what_to_do(project: Path) -> None:
    result = CliRunner().invoke(cli, ["train", "--config", str(project)])
    db = project.parent / "state" / "outcomes.duckdb"
    assert result.exit_code == 1
    assert f"{db}: no outcome database; run `routeopt run` or import outcomes first" in result.output


@pytest.mark.parametrize("configured,mode", [(None, 0o644), ("0600", 0o600)])
def test_reports_are_readable_unless_the_config_says(
    project: Path, tmp_path: Path, configured: str | None, mode: int
) -> None:
    if configured:
        cfg = json.loads(project.read_text())
        project.write_text(json.dumps({**cfg, "reports": {"permissions": configured}}))
    with Store(project.parent / "state" / "outcomes.duckdb") as store:
        store.begin_run("r1")
        store.register_suite("s", "v1", {}, [("1", "p", {})])
        store.write_outcomes([Outcome("r1", "s", "v1", "1", "tiny", passed=True, score=1.0)])
    out = tmp_path / "report.html"
    _invoke("report", "--config", str(project), "--out", str(out), "--no-drift")
    assert stat.S_IMODE(out.stat().st_mode) == mode


def test_a_file_mode_that_is_not_octal_is_named(project: Path) -> None:
    cfg = json.loads(project.read_text())
    project.write_text(json.dumps({**cfg, "reports": {"permissions": 644}}))
    result = CliRunner().invoke(cli, ["report", "--config", str(project)])
    assert result.exit_code == 1
    assert (
        "reports.permissions: Value error, 644 is not a file mode; write it in octal, quoted: '0644'"
        in result.output
    )
