"""Deployment settings that need no server: prefect.yaml, sources, CLI input errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from routeopt.flows.deploy import ENTRYPOINT, REPO_ROOT, DeploySpec, _source


def test_prefect_yaml_deploys_the_nightly_flow_with_the_flow_parameters():
    import inspect

    from routeopt.flows.nightly import nightly

    doc = yaml.safe_load((REPO_ROOT / "prefect.yaml").read_text())
    (dep,) = doc["deployments"]
    assert dep["entrypoint"] == ENTRYPOINT and (REPO_ROOT / ENTRYPOINT.split(":")[0]).exists()
    assert set(dep["parameters"]) <= set(inspect.signature(nightly.fn).parameters)
    assert dep["schedules"][0]["cron"] == "0 2 * * *" and dep["concurrency_limit"] == 1
    assert dep["work_pool"]["name"] == "routeopt"


def test_sources(tmp_path: Path):
    assert _source(DeploySpec(config_path="c")) == str(REPO_ROOT)
    git = _source(DeploySpec(config_path="c", source="https://git.example.com/r.git", branch="main"))
    assert type(git).__name__ == "GitRepository"
    with pytest.raises(FileNotFoundError, match="not a routeopt checkout"):
        _source(DeploySpec(config_path="c", source=str(tmp_path)))
    assert DeploySpec(config_path="c", suites=["a"]).parameters() == {
        "config_path": "c",
        "suites": ["a"],
        "candidates": None,
    }


def test_deploy_cli_rejects_unknown_candidates_before_contacting_prefect(tmp_path: Path):
    from click.testing import CliRunner

    from routeopt.flows.cli import cli

    cfg = tmp_path / "routeopt.yaml"
    cfg.write_text(
        "candidates:\n  - {name: a, provider: openai, model: m, input_price_per_mtok: 1, "
        "output_price_per_mtok: 1}\n"
    )
    res = CliRunner().invoke(cli, ["deploy", "--config", str(cfg), "--candidate", "zz"])
    assert res.exit_code == 1 and "--candidate 'zz': not in" in res.output
    cfg.write_text("candidates: [}")
    res = CliRunner().invoke(cli, ["deploy", "--config", str(cfg)])
    assert res.exit_code == 1 and "not valid YAML" in res.output
