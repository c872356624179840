"""The promotion gate and a champion that no gateway would serve: it is replaced, saying why."""

from __future__ import annotations

import json
import time
from datetime import timedelta
from pathlib import Path

import pytest

from routeopt.artifacts.publish.promotion import champion_policy, decide_promotion
from routeopt.artifacts.publish.registry import move_channel, publish
from routeopt.artifacts.serving.loader import PolicyLoadError, load
from tests.artifacts.policies import make_policy
from tests.fake_llm import FakeLLM, fails_odd_answers, write_arithmetic_suite, write_two_model_config


@pytest.fixture(scope="module")
def policy():
    return make_policy(0)


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    from routeopt.artifacts.publish.signing_keys import generate_keys, load_private_key

    private, public = generate_keys(tmp_path_factory.mktemp("keys"))
    return load_private_key(private), public


@pytest.fixture(scope="module")
def other_keys():
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    return Ed25519PrivateKey.generate()


def _expired_champion(registry: Path, policy, key) -> None:
    """A champion promoted while valid, whose expiry has passed since."""
    v = publish(policy, registry, lineage={}, metrics={}, signing_key=key, expires_in=timedelta(seconds=1.5))
    move_channel(registry, "champion", v.version, signing_key=key)
    time.sleep(2)


def test_a_valid_champion_is_compared_with(tmp_path, policy, keys) -> None:
    key, public = keys
    v = publish(policy, tmp_path, lineage={}, metrics={}, signing_key=key)
    move_channel(tmp_path, "champion", v.version, signing_key=key)
    champion, vacant = champion_policy(tmp_path, public)
    assert champion is not None and champion.candidates == policy.candidates and vacant == ""
    assert champion_policy(tmp_path / "empty", public) == (None, "no champion yet")


def test_an_expired_champion_is_replaceable_saying_so(tmp_path, policy, keys) -> None:
    key, public = keys
    _expired_champion(tmp_path, policy, key)
    with pytest.raises(PolicyLoadError, match="expired"):
        load(tmp_path, public, channel="champion")  # what a gateway sees
    champion, vacant = champion_policy(tmp_path, key.public_key())
    assert champion is None and vacant.startswith("champion version 1 is replaceable (expired:")
    decision = decide_promotion(policy, champion, _no_items(), tolerance=0.0, vacant=vacant)
    assert decision.promoted and decision.reason == vacant


def test_an_unsigned_champion_is_replaceable_and_a_forged_one_stops_the_gate(
    tmp_path, policy, keys, other_keys
) -> None:
    key, public = keys
    v = publish(policy, tmp_path / "legacy", lineage={}, metrics={}, allow_unsigned=True)
    move_channel(tmp_path / "legacy", "champion", v.version, allow_unsigned=True)
    champion, vacant = champion_policy(tmp_path / "legacy", public)
    assert champion is None and "replaceable (unsigned:" in vacant
    v = publish(policy, tmp_path / "forged", lineage={}, metrics={}, signing_key=other_keys)
    move_channel(tmp_path / "forged", "champion", v.version, signing_key=other_keys)
    with pytest.raises(
        PolicyLoadError, match="the champion cannot be verified.*promote a good version by hand"
    ):
        champion_policy(tmp_path / "forged", public)
    assert champion_policy(tmp_path / "forged", [public, other_keys.public_key()])[0] is not None  # rotating


def _no_items():
    import numpy as np

    from routeopt.router_training.fit.data import RoutingData

    return RoutingData(
        request_ids=[], prompts=[], suites=[], candidates=[], Y=np.zeros((0, 0)), C=np.zeros((0, 0))
    )


def test_the_nightly_replaces_an_expired_champion(tmp_path: Path, prefect_harness, monkeypatch) -> None:
    """After `expires_days` without a promotion the nightly must still move the champion: the
    gate treats the expired one as replaceable and says so, and gateways get a valid policy."""
    from routeopt.artifacts.publish.signing_keys import generate_keys, load_private_key
    from routeopt.flows.nightly import close_store, nightly

    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    monkeypatch.setenv("S_KEY", "sk-s")
    monkeypatch.setenv("W_KEY", "sk-w")
    with FakeLLM() as strong, FakeLLM() as weak:
        weak.answer_fn = fails_odd_answers
        write_arithmetic_suite(tmp_path / "suites", 30)
        config = write_two_model_config(
            tmp_path / "routeopt.yaml",
            strong,
            weak,
            key_envs=("S_KEY", "W_KEY"),
            router={"quality_target": 1.0, "holdout_fraction": 0.3},
        )
        private, public = generate_keys(tmp_path / "keys")
        config.write_text(
            json.dumps(
                {
                    **json.loads(config.read_text()),
                    "publishing": {"signing_key": str(private)},
                    # the fake servers' latency moves with the machine's load
                    "alerts": {"latency_p95_increase_pct": 10_000, "ttft_p95_increase_pct": 10_000},
                }
            )
        )
        first = nightly(config_path=str(config), run_id="n1")
        close_store(tmp_path / "out" / "routeopt.duckdb")
        assert first.promotion["promoted"]
        registry = tmp_path / "out" / "registry"
        _expired_champion(registry, make_policy(1), load_private_key(private))  # then nothing for days
        second = nightly(config_path=str(config), run_id="n2")
        close_store(tmp_path / "out" / "routeopt.duckdb")
    promotion = second.promotion
    assert promotion["promoted"], promotion
    assert promotion["reason"].startswith("champion version 2 is replaceable (expired:"), promotion
    gateway = load(registry, public, channel="champion")
    assert gateway.version == second.published["version"] == 3
