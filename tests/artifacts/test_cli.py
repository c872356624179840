"""`routeopt keys`, `routeopt policies ...`: what an operator types, end to end on a real registry."""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path

import pytest
from click.testing import CliRunner

from routeopt.flows.cli import cli


def _run(*args: str, ok: bool = True) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert (result.exit_code == 0) is ok, result.output
    return result.output


@pytest.fixture(autouse=True)
def _no_ambient_keys(monkeypatch, tmp_path) -> None:
    """Keys come only from what each test gives: not the environment, and not the key pair that
    `routeopt run` may have made beside the repository's own config."""
    for name in ("ROUTEOPT_SIGNING_KEY", "ROUTEOPT_PUBLIC_KEY", "ROUTEOPT_REGISTRY"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("ROUTEOPT_CONFIG", str(tmp_path / "no-config-here.yaml"))


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
    assert "champion -> version 1" in _run(
        "policies", "promote", "1", "--registry", reg, "--signing-key", key
    )
    assert "champion -> version 2" in _run(
        "policies", "promote", "2", "--registry", reg, "--signing-key", key
    )
    assert "allow-downgrade" in _run(
        "policies", "promote", "1", "--registry", reg, "--signing-key", key, ok=False
    )
    assert "version 1 (rollback" in _run("policies", "rollback", "--registry", reg, "--signing-key", key)
    verified = _run("policies", "verify", reg, "--public-key", pub)
    assert "channel: champion" in verified and "version: 1" in verified and verified.endswith("OK\n")


def test_verify_exits_nonzero_with_the_reason(policies, publish_to, registry: Path, other_keypair) -> None:
    v = publish_to(policies[0])
    out = _run("policies", "verify", str(registry / v.path), "--public-key", str(other_keypair[1]), ok=False)
    assert "but the trusted key is" in out
    (registry / v.path / "policy.json").write_text("{}")
    out = _run("policies", "verify", str(registry / v.path), "--allow-unsigned", ok=False)
    assert "policy.json: size or sha256 does not match" in out  # hashes are checked regardless


def test_errors_name_the_problem(registry: Path, policies, publish_to, keypair) -> None:
    publish_to(policies[0])
    assert "no version 7" in _run("policies", "show", "7", "--registry", str(registry), ok=False)
    assert "no earlier version" in _run(
        "policies", "rollback", "--registry", str(registry), "--signing-key", str(keypair[0]), ok=False
    )


def _config_with_keys(tmp_path: Path) -> Path:
    """A config whose key pair sits where `routeopt run` creates it: .routeopt/keys/ beside it."""
    from routeopt.artifacts.publish.signing_keys import ensure_signing_key

    config = tmp_path / "routeopt.yaml"
    config.write_text(
        "candidates:\n  - {name: small, provider: openai, model: m, "
        "input_price_per_mtok: 1, output_price_per_mtok: 1}\nregistry_dir: registry\n"
    )
    ensure_signing_key(tmp_path / ".routeopt" / "keys" / "signing_key.pem")
    return config


def test_commands_verify_with_the_key_beside_the_config_by_default(
    policies, tmp_path: Path, other_keypair
) -> None:
    from routeopt.artifacts.publish.registry import publish

    config = _config_with_keys(tmp_path)
    key = tmp_path / ".routeopt" / "keys" / "signing_key.pem"
    reg, cfg = str(tmp_path / "registry"), str(config)
    publish(policies[0], reg, lineage={}, metrics={}, signing_key=key)
    publish(policies[1], reg, lineage={}, metrics={}, signing_key=key)
    assert "champion -> version 2" in _run("policies", "promote", "2", "--registry", reg, "--config", cfg)
    verified = _run("policies", "verify", reg, "--config", cfg)
    assert "signature: valid (key" in verified and "version: 2" in verified
    routed = json.loads(_run("route", "--policy", reg, "--config", cfg, "add 2 and 3"))
    assert routed["model"] in policies[1].candidates
    # Signed by another key: refused, whatever is beside the config.
    publish(policies[0], reg, lineage={}, metrics={}, signing_key=other_keypair[0])
    assert "but the trusted key is" in _run(
        "policies", "verify", reg, "--config", cfg, "--channel", "latest", ok=False
    )


def test_route_with_a_channel_routes_with_that_channels_policy(policies, tmp_path: Path) -> None:
    """`route --channel candidate` routes with the candidate channel's policy, as a gateway
    loading that channel would; the default stays the champion."""
    from routeopt.artifacts.publish.registry import move_channel, publish

    config = _config_with_keys(tmp_path)
    key = tmp_path / ".routeopt" / "keys" / "signing_key.pem"
    reg, cfg = str(tmp_path / "registry"), str(config)
    publish(policies[0], reg, lineage={}, metrics={}, signing_key=key)
    publish(policies[1], reg, lineage={}, metrics={}, signing_key=key)
    _run("policies", "promote", "1", "--registry", reg, "--config", cfg)
    move_channel(reg, "candidate", 2, signing_key=key)
    prompt = "sort task difficulty 5: gamma delta gamma"
    by_default = json.loads(_run("route", "--policy", reg, "--config", cfg, prompt))
    by_candidate = json.loads(
        _run("route", "--policy", reg, "--config", cfg, "--channel", "candidate", prompt)
    )
    assert by_default["pass_probabilities"] == pytest.approx(policies[0].decide(prompt).pass_probabilities)
    assert by_candidate["pass_probabilities"] == pytest.approx(policies[1].decide(prompt).pass_probabilities)
    assert by_default["pass_probabilities"] != by_candidate["pass_probabilities"]
    assert "nope" in _run("route", "--policy", reg, "--config", cfg, "--channel", "nope", prompt, ok=False)
    version = next((tmp_path / "registry" / "versions").iterdir())
    assert "is one policy, not a registry" in _run(
        "route", "--policy", str(version), "--config", cfg, "--channel", "candidate", prompt, ok=False
    )


def test_commands_without_any_key_refuse_unless_told(policies, tmp_path: Path) -> None:
    """No key given, none in the environment, no config (the fixture points ROUTEOPT_CONFIG at
    nothing): loading and moving channels need an explicit --allow-unsigned."""
    from routeopt.artifacts.publish.registry import publish

    reg = str(tmp_path / "registry")
    publish(policies[0], reg, lineage={}, metrics={}, allow_unsigned=True)
    out = _run("policies", "verify", reg, ok=False)
    assert "no public key to verify the policy with" in out and "--allow-unsigned" in out
    assert "signature: unsigned" in _run("policies", "verify", reg, "--allow-unsigned")
    assert "no public key" in _run("route", "--policy", reg, "hi", ok=False)
    assert json.loads(_run("route", "--policy", reg, "--allow-unsigned", "hi"))["model"]
    assert "no signing key" in _run("policies", "promote", "1", "--registry", reg, ok=False)
    assert "champion -> version 1" in _run("policies", "promote", "1", "--registry", reg, "--allow-unsigned")
    assert f"{tmp_path / 'x.yaml'}: file not found" in _run(
        "policies", "verify", reg, "--config", str(tmp_path / "x.yaml"), ok=False
    )


def test_route_with_an_expired_policy_needs_a_default_model(policies, tmp_path: Path) -> None:
    from datetime import datetime, timedelta, timezone

    from routeopt.artifacts.publish.registry import publish

    config = _config_with_keys(tmp_path)
    reg, cfg = str(tmp_path / "registry"), str(config)
    publish(
        policies[0],
        reg,
        lineage={},
        metrics={},
        signing_key=tmp_path / ".routeopt" / "keys" / "signing_key.pem",
        now=datetime.now(timezone.utc) - timedelta(days=2),
        expires_in=timedelta(days=1),
    )
    out = _run("route", "--policy", reg, "--config", cfg, "hi", ok=False)
    assert "version 1 expired at" in out and "default_model" in out
    requests = tmp_path / "in.jsonl"
    requests.write_text('{"id": "a", "prompt": "add 2 and 3"}\n{"id": "b", "prompt": "sort c b a"}\n')
    result = CliRunner().invoke(
        cli,
        [
            "route",
            "--policy",
            reg,
            "--config",
            cfg,
            "--input",
            str(requests),
            "--default-model",
            "gpt-4o-mini",
        ],
    )
    assert result.exit_code == 0, result.output
    assert "warning: routing everything to the default model gpt-4o-mini: no valid policy" in result.stderr
    assert [json.loads(line) for line in result.stdout.splitlines()] == [
        {"id": "a", "model": "gpt-4o-mini"},
        {"id": "b", "model": "gpt-4o-mini"},
    ]
