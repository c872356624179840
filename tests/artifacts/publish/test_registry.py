"""Publishing: immutable content-addressed versions, signed manifests, channels, promotion."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from routeopt.artifacts.serving.backends import RegistryError
from routeopt.artifacts.serving.manifest import parse_manifest, sha256_hex
from routeopt.artifacts.publish.registry import (
    current_pointer,
    diff,
    list_versions,
    move_channel,
    publish,
    rollback,
    show,
)


def test_publish_writes_content_addressed_signed_version(policies, publish_to, registry: Path) -> None:
    v = publish_to(
        policies[0],
        lineage={"runs": ["r1"], "suites": {"sort": "abc"}},
        metrics={"pass_rate": 0.91, "cost_usd": 0.02, "nan": float("nan")},
    )
    folder = registry / v.path
    data = (folder / "manifest.json").read_bytes()
    assert v.version == 1 and v.digest == sha256_hex(data) and v.location == str(folder)
    assert folder.name == f"000001-{v.digest[:12]}"
    m = parse_manifest(data)
    assert m.lineage == {"runs": ["r1"], "suites": {"sort": "abc"}}
    assert m.metrics["pass_rate"] == 0.91 and m.metrics["nan"] is None
    assert m.policy["candidates"] == policies[0].candidates
    assert m.expires_at is not None and m.expires_at > m.created_at
    names = {f.path for f in m.files}
    assert "policy.json" in names
    for f in m.files:
        assert sha256_hex((folder / f.path).read_bytes()) == f.sha256
    sig = json.loads((folder / "manifest.sig").read_text())
    assert sig["alg"] == "ed25519" and v.signed
    assert not list(folder.rglob("*.pkl")) and not list(folder.rglob("*.pickle"))


def test_versions_are_monotonic_and_latest_follows(policies, publish_to, registry: Path) -> None:
    versions = [publish_to(policies[i % 2]).version for i in range(3)]
    assert versions == [1, 2, 3]
    pointer, _ = current_pointer(registry, "latest")
    assert pointer is not None and pointer.version == 3 and pointer.seq == 3
    rows = list_versions(registry)
    assert [r["version"] for r in rows] == [1, 2, 3]
    assert rows[-1]["channels"] == ["latest"] and all(r["signed"] for r in rows)


def test_concurrent_publishers_never_share_a_number(policies, publish_to, registry: Path) -> None:
    results, errors = [], []

    def worker(i: int) -> None:
        try:
            results.append(publish_to(policies[i % 2], lineage={"runs": [f"r{i}"]}))
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.version for r in results) == [1, 2, 3, 4, 5, 6]
    assert len({r.path for r in results}) == 6
    assert len(list((registry / "versions").iterdir())) == 6  # losers cleaned up their folders
    assert current_pointer(registry, "latest")[0].version == 6


def test_a_publisher_that_loses_the_race_never_deletes_the_winners_files(
    policies, registry: Path, keypair
) -> None:
    from routeopt.artifacts.serving.backends import LocalBackend
    from tests.artifacts.racing import assert_every_version_serves, race_two_publishers

    versions = race_two_publishers(LocalBackend(registry), policies[0], keypair[0])
    assert [v.version for v in versions] == [1, 2] and versions[0].path != versions[1].path
    assert_every_version_serves(str(registry), versions, keypair[1])
    assert sorted(p.name for p in (registry / "versions").iterdir()) == sorted(
        v.path.split("/")[1] for v in versions
    )  # the loser's abandoned attempt is gone


def test_promote_rollback_and_downgrade_rules(policies, publish_to, registry: Path, keypair) -> None:
    for i in range(3):
        publish_to(policies[i % 2])
    key = keypair[0]
    move_channel(registry, "champion", 1, signing_key=key)
    move_channel(registry, "champion", 3, signing_key=key)
    with pytest.raises(RegistryError, match="allow-downgrade"):
        move_channel(registry, "champion", 2, signing_key=key)
    back = rollback(registry, "champion", signing_key=key)
    assert (back.version, back.action, back.seq) == (1, "rollback", 3)
    with pytest.raises(RegistryError, match="no earlier version"):
        rollback(registry, "champion", signing_key=key)
    down = move_channel(registry, "champion", 2, signing_key=key, allow_downgrade=True)
    assert down.action == "promote"  # 2 > 1: moving forward again
    forced = move_channel(registry, "champion", 1, signing_key=key, allow_downgrade=True)
    assert forced.action == "rollback" and [h["version"] for h in forced.history] == [1, 3, 1, 2, 1]
    with pytest.raises(RegistryError, match="no version 9"):
        move_channel(registry, "champion", 9, signing_key=key)


def test_show_and_diff(policies, publish_to, registry: Path) -> None:
    publish_to(policies[0], metrics={"pass_rate": 0.9, "cost_usd": 0.03})
    publish_to(policies[1], metrics={"pass_rate": 0.92, "cost_usd": 0.02})
    assert show(registry, 2)["version"] == 2
    d = diff(registry, 1, 2)
    assert d["metrics"]["pass_rate"] == [0.9, 0.92]
    assert d["candidates"] == {"added": [], "removed": []}
    assert d["policy"], "two differently trained policies must differ in their description"


def test_publishing_without_a_key_is_refused_unless_unsigned_is_allowed(
    policies, registry: Path, keypair, monkeypatch
) -> None:
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    with pytest.raises(RegistryError, match="no signing key"):
        publish(policies[0], registry, lineage={}, metrics={})
    assert not (registry / "versions").exists() or not list((registry / "versions").iterdir())
    v = publish(policies[0], registry, lineage={}, metrics={}, allow_unsigned=True)
    assert not v.signed and v.key_id is None and not (registry / v.path / "manifest.sig").exists()
    assert list_versions(registry)[0]["signed"] is False
    with pytest.raises(RegistryError, match="no signing key"):
        move_channel(registry, "champion", 1)
    with pytest.raises(RegistryError, match="no signing key"):
        rollback(registry, "latest")


def test_signing_key_from_env(policies, registry: Path, keypair, monkeypatch) -> None:
    monkeypatch.setenv("ROUTEOPT_SIGNING_KEY", str(keypair[0]))
    assert publish(policies[0], registry, lineage={}, metrics={}).signed


def test_policy_file_names_are_checked_before_writing(registry: Path) -> None:
    class Evil:
        candidates = ["a"]

        def save(self, folder: Path) -> list[str]:
            (folder / "sub").mkdir()
            (folder / "sub" / "x.json").write_text("{}")
            return ["sub/../../escape.json"]

        def describe(self) -> dict:
            return {}

    with pytest.raises(ValueError, match="unsafe file name"):
        publish(Evil(), registry, lineage={}, metrics={}, signing_key=None, allow_unsigned=True)
    assert not (registry / "versions").exists()


def test_promote_refuses_a_damaged_or_expired_version(policies, publish_to, registry: Path, keypair) -> None:
    from datetime import datetime, timedelta, timezone

    v1 = publish_to(policies[0])
    publish_to(policies[1], now=datetime.now(timezone.utc) - timedelta(days=3), expires_in=timedelta(days=1))
    with pytest.raises(RegistryError, match="version 2 cannot be served: .*expired"):
        move_channel(registry, "champion", 2, signing_key=keypair[0])
    (registry / v1.path / "policy.json").write_text("{}")
    with pytest.raises(RegistryError, match="version 1 cannot be served: .*policy.json: size or sha256"):
        move_channel(registry, "champion", 1, signing_key=keypair[0])


def test_a_lost_signing_key_is_not_silently_replaced(policies, publish_to, registry: Path, tmp_path) -> None:
    """The first publish creates the key; a key created later for a registry another key signed
    (lost, or on storage that does not outlast a run) would sign what no gateway trusts."""
    from routeopt.artifacts.publish.registry import registry_signing_key
    from routeopt.artifacts.serving.signatures import load_public_key, public_key_path

    key_path = tmp_path / "keys" / "signing_key.pem"
    (tmp_path / "keys").mkdir()
    public_key_path(key_path).write_text("stale")  # left over: replaced by the new key's half
    key, created = registry_signing_key(registry, key_path)
    assert (
        created
        and load_public_key(public_key_path(key_path)).public_bytes_raw()
        == key.public_key().public_bytes_raw()
    )
    assert registry_signing_key(registry, key_path)[1] is False  # the same key from now on
    publish(policies[0], registry, lineage={}, metrics={}, signing_key=key)
    key_path.unlink()  # lost
    with pytest.raises(RegistryError, match=r"version 1 in .* is signed by key \w+; gateways would refuse"):
        registry_signing_key(registry, key_path)
    assert not key_path.exists() and not public_key_path(key_path).exists()
    legacy = tmp_path / "legacy"
    publish(policies[0], legacy, lineage={}, metrics={}, allow_unsigned=True)
    assert registry_signing_key(legacy, key_path)[1]  # an unsigned registry starts being signed
