"""`routeopt keys`, `routeopt policies ...`: what an operator types, end to end on a real registry."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from flows.cli import cli


def _run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code == 0) is ok, result.output
    return result.output


@pytest.fixture(autouse=True)
def _no_env_keys(monkeypatch) -> None:
    for name in ("ROUTEOPT_SIGNING_KEY", "ROUTEOPT_PUBLIC_KEY", "ROUTEOPT_REGISTRY"):
        monkeypatch.delenv(name, raising=False)


def test_keys_generate(tmp_path: Path) -> None:
    out = _run("keys", "generate", "--out", str(tmp_path / "k"))
    private = tmp_path / "k" / "signing_key.pem"
    assert "ROUTEOPT_SIGNING_KEY" in out and private.exists()
    assert stat.S_IMODE(os.stat(private).st_mode) == 0o600
    assert "already exists" in _run("keys", "generate", "--out", str(tmp_path / "k"), ok=False)


def test_policies_workflow(policies, publish_to, registry: Path, keypair) -> None:
    publish_to(policies[0], metrics={"pass_rate": 0.9, "cost_usd": 0.03})
    publish_to(policies[1], metrics={"pass_rate": 0.93, "cost_usd": 0.02})
    reg, key, pub = str(registry), str(keypair[0]), str(keypair[1])
    listing = _run("policies", "list", "--registry", reg)
    assert "0.9300" in listing and "latest" in listing.splitlines()[-1]
    rows = json.loads(_run("policies", "list", "--registry", reg, "--json"))
    assert [r["version"] for r in rows] == [1, 2]
    assert json.loads(_run("policies", "show", "1", "--registry", reg))["version"] == 1
    assert "pass_rate: 0.9 -> 0.93" in _run("policies", "diff", "1", "2", "--registry", reg)
    assert "champion -> version 1" in _run("policies", "promote", "1", "--registry", reg, "--signing-key", key)
    assert "champion -> version 2" in _run("policies", "promote", "2", "--registry", reg, "--signing-key", key)
    assert "allow-downgrade" in _run("policies", "promote", "1", "--registry", reg, ok=False)
    assert "version 1 (rollback" in _run("policies", "rollback", "--registry", reg, "--signing-key", key)
    verified = _run("policies", "verify", reg, "--public-key", pub)
    assert "channel: champion" in verified and "version: 1" in verified and verified.endswith("OK\n")


def test_verify_exits_nonzero_with_the_reason(policies, publish_to, registry: Path, other_keypair) -> None:
    v = publish_to(policies[0])
    out = _run("policies", "verify", str(registry / v.path), "--public-key", str(other_keypair[1]), ok=False)
    assert "but the trusted key is" in out
    (registry / v.path / "policy.json").write_text("{}")
    out = _run("policies", "verify", str(registry / v.path), ok=False)
    assert "policy.json: size or sha256 does not match" in out


def test_errors_name_the_problem(registry: Path, policies, publish_to) -> None:
    publish_to(policies[0])
    assert "no version 7" in _run("policies", "show", "7", "--registry", str(registry), ok=False)
    assert "no earlier version" in _run("policies", "rollback", "--registry", str(registry), ok=False)
