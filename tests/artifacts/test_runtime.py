"""The gateway loader: resolving sources, routing like the policy, refreshing, import hygiene."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from artifacts.registry import move_channel, rollback
from artifacts.runtime import PolicyLoadError, check, load
from tests.artifacts.policies import PROMPTS
from tests import REPO


def _same_decisions(router, policy) -> None:
    for prompt, suite in PROMPTS:
        got, want = router.route(prompt, suite=suite), policy.decide(prompt, suite=suite)
        assert (got.model, got.fallbacks, got.propensity) == (want.model, want.fallbacks, want.propensity)
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


def test_quality_target_is_passed_through(policies, publish_to, registry) -> None:
    publish_to(policies[0])
    router = load(registry)
    for q in (0.0, 0.5, 1.0):
        prompt, suite = PROMPTS[1]
        assert router.route(prompt, suite, quality_target=q).model == \
            policies[0].decide(prompt, suite, quality_target=q).model


def test_refresh_swaps_to_new_version_and_follows_signed_rollback(
        policies, publish_to, registry, keypair) -> None:
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


def test_missing_source_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(PolicyLoadError, match="no such policy folder"):
        load(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(PolicyLoadError, match="no such channel"):
        load(tmp_path / "empty")


def test_check_reports_signature_state(policies, publish_to, registry, keypair, monkeypatch) -> None:
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    publish_to(policies[0])
    assert check(registry, keypair[1])["signature"].startswith("valid")
    assert "NOT checked" in check(registry)["signature"]
    publish_to(policies[1], signing_key=None)
    assert check(registry)["signature"] == "unsigned"


GATEWAY_SCRIPT = """
import json, sys
before = set(sys.modules)
from artifacts.runtime import load
router = load(sys.argv[1], public_key=sys.argv[2])
decision = router.route("Reverse the string: abcdef", suite="reverse")
loaded = sorted({m.split(".")[0] for m in set(sys.modules) - before} - set(sys.stdlib_module_names))
print(json.dumps({"model": decision.model, "version": decision.policy_version, "loaded": loaded}))
"""


def test_gateway_imports_only_numpy_cryptography_and_the_standard_library(
        policies, publish_to, registry, keypair) -> None:
    """A fresh interpreter loads a signed policy and routes one request; what it imported is
    numpy, cryptography (with its cffi backend) and the gateway's own packages, nothing else."""
    publish_to(policies[0])
    out = subprocess.run([sys.executable, "-c", GATEWAY_SCRIPT, str(registry), str(keypair[1])],
                         capture_output=True, text=True, check=True, cwd=REPO)
    result = json.loads(out.stdout)
    assert result["model"] in policies[0].candidates and result["version"] == 1
    forbidden = {"evals", "flows", "prefect", "duckdb", "pandas", "sklearn", "scipy", "torch",
                 "lightgbm", "pydantic", "yaml", "boto3"}
    assert not forbidden & set(result["loaded"]), result["loaded"]
    allowed = {"numpy", "cryptography", "_cffi_backend", "_openssl",  # cryptography's bindings
               "artifacts", "router_training", "common"}
    assert set(result["loaded"]) <= allowed, result["loaded"]


def test_key_rotation_trusts_any_listed_key(policies, publish_to, registry, keypair, other_keypair,
                                            monkeypatch) -> None:
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
