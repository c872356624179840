"""The gateway loader: resolving sources, routing like the policy, refreshing, import hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from routeopt.artifacts.publish.registry import move_channel, rollback
from routeopt.artifacts.serving.loader import PolicyLoadError, check, load
from tests.artifacts.policies import PROMPTS
from tests import REPO


def _same_decisions(router, policy) -> None:
    for prompt, suite in PROMPTS:
        got, want = router.route(prompt, suite=suite), policy.decide(prompt, suite=suite)
        assert (got.model, got.fallbacks, got.policy_probability) == (
            want.model,
            want.fallbacks,
            want.propensity,
        )
        assert got.propensity == 1.0  # no exploration: the request's own hash decides
        assert got.pass_probabilities == pytest.approx(want.pass_probabilities)
        assert got.expected_cost_usd == pytest.approx(want.expected_cost_usd)


def test_load_version_folder_routes_like_the_policy(policies, publish_to, registry, keypair) -> None:
    v = publish_to(policies[0])
    router = load(registry / v.path, public_key=keypair[1])
    assert router.version == 1 and router.status().signed and router.status().channel is None
    _same_decisions(router, policies[0])
    assert router.route(*PROMPTS[0]).policy_version == 1
    assert router.refresh() is False  # a version folder never changes


def test_load_registry_prefers_champion_then_latest(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    publish_to(policies[1])
    assert load(registry, keypair[1]).status().channel == "latest"
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    router = load(registry, keypair[1])
    assert (router.status().channel, router.version) == ("champion", 1)
    _same_decisions(router, policies[0])
    assert load(registry, keypair[1], channel="latest").version == 2


def test_quality_target_is_passed_through(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    router = load(registry, keypair[1])
    for q in (0.0, 0.5, 1.0):
        prompt, suite = PROMPTS[1]
        assert (
            router.route(prompt, suite, quality_target=q).model
            == policies[0].decide(prompt, suite, quality_target=q).model
        )


def test_refresh_swaps_to_new_version_and_follows_signed_rollback(
    policies, publish_to, registry, keypair
) -> None:
    events: list[tuple[str, str]] = []
    publish_to(policies[0])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    router = load(registry, keypair[1], on_event=lambda k, m: events.append((k, m)))
    assert router.refresh() is False and router.status().checks == 1
    publish_to(policies[1])
    move_channel(registry, "champion", 2, signing_key=keypair[0])
    assert router.refresh() is True and router.version == 2
    _same_decisions(router, policies[1])
    rollback(registry, "champion", signing_key=keypair[0])
    assert router.refresh() is True and router.version == 1
    _same_decisions(router, policies[0])
    assert [k for k, _ in events] == ["swapped", "swapped"]
    assert router.status().swaps == 2 and router.status().last_error is None


def test_background_refresher_picks_up_a_publish(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    with load(registry, keypair[1], refresh_s=0.05) as router:
        assert router.version == 1
        publish_to(policies[1])
        deadline = time.monotonic() + 10
        while router.version != 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert router.version == 2 and router.status().swaps == 1


def test_missing_source_is_a_clear_error(tmp_path: Path, keypair) -> None:
    with pytest.raises(PolicyLoadError, match="no such policy folder"):
        load(tmp_path / "nope", keypair[1])
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyLoadError, match="champion.json: no such channel"):
        load(tmp_path / "empty", keypair[1])


def test_check_reports_signature_state(policies, publish_to, registry, keypair, monkeypatch) -> None:
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    publish_to(policies[0])
    assert check(registry, keypair[1])["signature"].startswith("valid")
    with pytest.raises(PolicyLoadError, match="no public key"):
        check(registry)
    assert "NOT checked" in check(registry, allow_unsigned=True)["signature"]
    publish_to(policies[1], signing_key=None, allow_unsigned=True)
    assert check(registry, allow_unsigned=True)["signature"] == "unsigned"


GATEWAY_SCRIPT = """
import json, sys
before = set(sys.modules)
from routeopt.artifacts.serving.loader import load
router = load(sys.argv[1], public_key=sys.argv[2])  # records the accepted move in the state folder
decision = router.route("Reverse the string: abcdef", suite="reverse")
router.refresh()
waiting = load(sys.argv[1] + "-not-yet", public_key=sys.argv[2], default_model="fallback")
assert waiting.route("hi").model == "fallback" and waiting.status().serving_default
loaded = sorted({".".join(m.split(".")[:2]) if m.startswith("routeopt.") else m.split(".")[0]
                 for m in set(sys.modules) - before} - set(sys.stdlib_module_names))
print(json.dumps({"model": decision.model, "version": decision.policy_version, "loaded": loaded}))
"""


def test_gateway_imports_only_numpy_cryptography_and_the_standard_library(
    policies, publish_to, registry, keypair
) -> None:
    """A fresh interpreter loads a signed policy (keeping its state file), routes, refreshes and
    serves a default model; what it imported is numpy, cryptography (with its cffi backend), the
    standard library and the gateway's own packages, nothing else."""
    publish_to(policies[0])
    out = subprocess.run(
        [sys.executable, "-c", GATEWAY_SCRIPT, str(registry), str(keypair[1])],
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
    )
    result = json.loads(out.stdout)
    assert result["model"] in policies[0].candidates and result["version"] == 1
    assert list(Path(os.environ["ROUTEOPT_STATE_DIR"]).glob("*.json"))  # the state file was written
    forbidden = {
        "routeopt.evals",
        "routeopt.flows",
        "prefect",
        "duckdb",
        "pandas",
        "sklearn",
        "scipy",
        "torch",
        "lightgbm",
        "pydantic",
        "yaml",
        "boto3",
    }
    assert not forbidden & set(result["loaded"]), result["loaded"]
    allowed = {
        "numpy",
        "cryptography",
        "_cffi_backend",
        "_openssl",  # cryptography's bindings
        "routeopt",
        "routeopt.artifacts",
        "routeopt.router_training",
        "routeopt.common",
        "wasmtime",  # the fast extra's WebAssembly kernel, where installed
    }
    assert set(result["loaded"]) <= allowed, result["loaded"]


def test_key_rotation_trusts_any_listed_key(
    policies, publish_to, registry, keypair, other_keypair, monkeypatch
) -> None:
    publish_to(policies[0], signing_key=other_keypair[0])
    move_channel(registry, "latest", 1, signing_key=other_keypair[0])
    with pytest.raises(PolicyLoadError, match="trusted key is"):
        load(registry, keypair[1])
    router = load(registry, [keypair[1], other_keypair[1]])
    assert router.status().signed
    publish_to(policies[1])  # the new key signs from now on
    assert router.refresh() is True and router.version == 2
    monkeypatch.setenv("ROUTEOPT_PUBLIC_KEY", f"{keypair[1]}{os.pathsep}{other_keypair[1]}")
    assert load(registry).status().signed


def _expired(publish_to, policy):
    """Publish `policy` as a version that expired yesterday (`latest` moves to it as it would)."""
    return publish_to(
        policy, now=datetime.now(timezone.utc) - timedelta(days=2), expires_in=timedelta(days=1)
    )


def test_gateway_with_only_an_expired_policy_serves_the_default_model(
    policies, publish_to, registry, keypair, caplog
) -> None:
    """A restart with nothing valid is not an outage: the default model serves, and the gateway
    says why in status(), on_event and the log, then swaps to the next valid policy."""
    _expired(publish_to, policies[0])
    with pytest.raises(PolicyLoadError, match=r"expired at .*give default_model=") as info:
        load(registry, keypair[1])
    assert info.value.kind == "expired"
    events: list[tuple[str, str]] = []
    router = load(
        registry, keypair[1], default_model="gpt-4o-mini", on_event=lambda k, m: events.append((k, m))
    )
    d = router.route(*PROMPTS[0])
    assert (d.model, d.fallbacks, d.policy_version) == ("gpt-4o-mini", (), 0)
    assert "version 1 expired at" in d.default_reason
    s = router.status()
    assert s.serving_default and s.default_model == "gpt-4o-mini" and s.version == 0
    assert "version 1 expired at" in s.default_reason and router.policy is None
    assert events == [("default", f"serving the default model gpt-4o-mini: {s.default_reason}")]
    assert "serving the default model gpt-4o-mini" in caplog.text
    assert router.refresh() is False and "expired" in router.status().last_error  # still refused
    publish_to(policies[1])
    assert router.refresh() is True and router.version == 2
    assert not router.status().serving_default and router.status().default_reason is None
    _same_decisions(router, policies[1])
    assert events[-1] == ("swapped", "version 2")


def test_default_model_from_the_environment(policies, publish_to, registry, keypair, monkeypatch) -> None:
    _expired(publish_to, policies[0])
    monkeypatch.setenv("ROUTEOPT_DEFAULT_MODEL", "claude-haiku")
    assert load(registry, keypair[1]).route("hi").model == "claude-haiku"


def test_policy_expiring_while_served_hands_over_to_the_default_model(
    policies, publish_to, registry, keypair, loader_later
) -> None:
    publish_to(policies[0], expires_in=timedelta(minutes=10))
    events: list[tuple[str, str]] = []
    router = load(
        registry, keypair[1], default_model="gpt-4o-mini", on_event=lambda k, m: events.append((k, m))
    )
    assert router.route(*PROMPTS[0]).policy_version == 1
    loader_later(timedelta(minutes=11))
    d = router.route(*PROMPTS[0])
    assert (d.model, d.policy_version) == ("gpt-4o-mini", 0) and "version 1 expired" in d.default_reason
    assert router.refresh() is False
    assert events[-1][0] == "expired" and "serving the default model gpt-4o-mini" in events[-1][1]
    assert router.status().serving_default and router.version == 0


def test_gateway_started_before_the_first_publish_waits_on_the_champion(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    router = load(registry, keypair[1], default_model="gpt-4o-mini")  # the folder does not exist yet
    assert router.route("hi").model == "gpt-4o-mini" and router.status().channel == "champion"
    assert "champion.json: no such channel" in router.status().default_reason
    publish_to(policies[0])
    assert router.refresh() is False  # `latest` is not the gated channel
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    assert router.refresh() is True and router.route(*PROMPTS[0]).policy_version == 1


def test_a_registry_unreachable_at_start_is_not_an_outage(keypair) -> None:
    with pytest.raises(PolicyLoadError, match="registry unreachable") as info:
        load("http://127.0.0.1:9/", keypair[1])
    assert info.value.kind == "unreachable"
    router = load("http://127.0.0.1:9/", keypair[1], default_model="gpt-4o-mini")
    assert (
        router.route("hi").model == "gpt-4o-mini" and "registry unreachable" in router.status().default_reason
    )
    assert router.refresh() is False and router.status().consecutive_failures == 2
