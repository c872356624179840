"""Bad input and attacks: each is refused with a clear reason, and the gateway keeps routing."""

from __future__ import annotations

import base64
import json
import os
import re
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from routeopt.artifacts.serving.backends import LocalBackend, RegistryError
from routeopt.artifacts.serving.manifest import canonical_json, pretty_json, sha256_hex
from routeopt.artifacts.publish.registry import current_pointer, publish
from routeopt.artifacts.serving.loader import PolicyLoadError, Router, load
from routeopt.artifacts.publish.registry_server import serve_in_thread
from routeopt.artifacts.publish.signing_keys import load_private_key, sign
from tests.artifacts.policies import PROMPTS


@pytest.fixture()
def served(policies, publish_to, registry, keypair):
    """A gateway serving signed version 1 from the `latest` channel, recording events."""
    publish_to(policies[0])
    events: list[tuple[str, str]] = []
    router = load(registry, keypair[1], on_event=lambda k, m: events.append((k, m)))
    router.events = events
    return router


def _refused(router, pattern: str) -> None:
    """The refresh is refused for `pattern`, version 1 keeps routing, and the reason is reported."""
    assert router.refresh() is False
    status = router.status()
    assert status.version == 1 and status.consecutive_failures >= 1
    assert status.last_error is not None and re.search(pattern, status.last_error), status.last_error
    assert router.events[-1][0] in ("rejected", "unreachable")
    assert router.route(*PROMPTS[0]).policy_version == 1


def _folder(registry: Path, version: int) -> Path:
    return next((registry / "versions").glob(f"{version:06d}-*"))


def test_tampered_model_file(served, policies, publish_to, registry) -> None:
    publish_to(policies[1])
    target = _folder(registry, 2) / "scorer.json"
    if not target.exists():
        target = _folder(registry, 2) / "policy.json"
    target.write_bytes(target.read_bytes().replace(b"1", b"2", 1))
    _refused(served, r"sha256 does not match manifest\.json \(tampered")


def test_signature_by_another_key(served, policies, publish_to, other_keypair) -> None:
    publish_to(policies[1], signing_key=other_keypair[0])
    _refused(served, r"signed by key \w+, but the trusted key is")


def test_corrupted_signature(served, policies, publish_to, registry, keypair) -> None:
    publish_to(policies[1])
    sig_path = _folder(registry, 2) / "manifest.sig"
    sig = json.loads(sig_path.read_text())
    raw = bytearray(base64.b64decode(sig["signature"]))
    raw[0] ^= 1
    sig["signature"] = base64.b64encode(bytes(raw)).decode()
    sig_path.write_text(json.dumps(sig))
    _refused(served, r"manifest\.json: signature does not match the content")
    with pytest.raises(PolicyLoadError, match="signature does not match"):
        load(_folder(registry, 2), keypair[1])


def test_missing_signature(served, policies, publish_to, monkeypatch) -> None:
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    publish_to(policies[1], signing_key=None, allow_unsigned=True)
    _refused(served, r"unsigned")


def test_truncated_manifest(served, policies, publish_to, registry, keypair) -> None:
    publish_to(policies[1])
    manifest = _folder(registry, 2) / "manifest.json"
    manifest.write_bytes(manifest.read_bytes()[:100])
    _refused(served, r"does not match the channel's")
    with pytest.raises(PolicyLoadError, match="signature does not match"):
        load(_folder(registry, 2), keypair[1])
    with pytest.raises(PolicyLoadError, match="not valid JSON"):
        load(_folder(registry, 2), None, allow_unsigned=True)


def test_expired_policy(served, policies, publish_to, registry, keypair) -> None:
    publish_to(policies[1], now=datetime.now(timezone.utc) - timedelta(days=2), expires_in=timedelta(days=1))
    _refused(served, r"version 2 expired at .*publish a fresh policy")
    with pytest.raises(PolicyLoadError, match="expired"):
        load(_folder(registry, 2), keypair[1])


def test_replayed_old_pointer_is_a_refused_downgrade(served, policies, publish_to, registry) -> None:
    old = (registry / "channels" / "latest.json").read_bytes()
    publish_to(policies[1])
    assert served.refresh() is True and served.version == 2
    (registry / "channels" / "latest.json").write_bytes(old)  # an attacker replays move #1
    assert served.refresh() is False and served.version == 2
    assert "replayed" in served.status().last_error


def _write_pointer(registry: Path, key_path: Path, **changes) -> None:
    """Write a channel file as a (buggy or compromised) publisher holding the key would."""
    pointer, _ = current_pointer(registry, "latest")
    payload = {**pointer.payload(), **changes}
    sig = sign(canonical_json(payload), load_private_key(key_path)).to_dict()
    (registry / "channels" / "latest.json").write_bytes(pretty_json({"payload": payload, "signature": sig}))


def test_signed_but_non_rollback_downgrade_is_refused(
    served, policies, publish_to, registry, keypair
) -> None:
    publish_to(policies[1])
    assert served.refresh() is True
    v1 = _folder(registry, 1)
    digest = sha256_hex((v1 / "manifest.json").read_bytes())
    _write_pointer(
        registry, keypair[0], seq=99, version=1, digest=digest, path=f"versions/{v1.name}", action="promote"
    )
    assert served.refresh() is False and served.version == 2
    assert "downgrade refused" in served.status().last_error


def test_pointer_edited_without_the_key(served, policies, publish_to, registry) -> None:
    publish_to(policies[1])
    path = registry / "channels" / "latest.json"
    doc = json.loads(path.read_text())
    doc["payload"]["history"] = []
    path.write_text(json.dumps(doc))
    _refused(served, r"channels/latest\.json: signature does not match")


def test_path_traversal_in_manifest_and_pointer(served, policies, publish_to, registry, keypair) -> None:
    v = publish_to(policies[1])
    folder = registry / v.path
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"][0]["path"] = "../../../etc/passwd"
    data = pretty_json(manifest)
    (folder / "manifest.json").write_bytes(data)
    sig = sign(data, load_private_key(keypair[0])).to_dict()  # even a validly signed one
    (folder / "manifest.sig").write_text(json.dumps(sig))
    with pytest.raises(PolicyLoadError, match=r"unsafe file name '\.\./\.\./\.\./etc/passwd'"):
        load(folder, keypair[1])
    _write_pointer(registry, keypair[0], path="versions/../../../tmp")
    _refused(served, r"is not versions/<number>-<sha12>")


def test_unsafe_channel_name_is_refused(registry, policies, publish_to, keypair) -> None:
    publish_to(policies[0])
    with pytest.raises(ValueError, match="channel '../latest'"):
        load(registry, keypair[1], channel="../latest")


def test_registry_unreachable_mid_poll(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    server, url = serve_in_thread(registry)
    events: list[tuple[str, str]] = []
    router = load(url, keypair[1], on_event=lambda k, m: events.append((k, m)))
    router.events = events
    assert router.version == 1 and router.refresh() is False
    server.shutdown()
    server.server_close()
    _refused(router, r"registry unreachable")
    assert events[-1][0] == "unreachable"


def test_recovers_after_a_bad_version(served, policies, publish_to, other_keypair) -> None:
    publish_to(policies[1], signing_key=other_keypair[0])
    _refused(served, "trusted key")
    publish_to(policies[1])
    assert served.refresh() is True and served.version == 3
    assert served.status().last_error is None and served.status().consecutive_failures == 0


def test_unsigned_registry_is_refused_when_a_key_is_given(policies, registry, keypair, monkeypatch) -> None:
    monkeypatch.delenv("ROUTEOPT_SIGNING_KEY", raising=False)
    publish(policies[0], registry, lineage={}, metrics={}, allow_unsigned=True)
    with pytest.raises(PolicyLoadError, match="unsigned") as info:
        load(registry, keypair[1], allow_unsigned=True)  # a trusted key makes signatures mandatory
    assert info.value.kind == "unsigned"
    assert load(registry, None, allow_unsigned=True).version == 1


class _FlakyBackend(LocalBackend):
    """A registry whose version files become unreachable after the channel was read."""

    down = False

    def get(self, key: str) -> tuple[bytes, str]:
        if self.down and key.startswith("versions/"):
            raise RegistryError(f"{self.location}: {key}: connection reset")
        return super().get(key)


def test_registry_fails_between_pointer_and_files(policies, publish_to, registry, keypair) -> None:
    publish_to(policies[0])
    backend = _FlakyBackend(registry)
    events: list[tuple[str, str]] = []
    router = Router(
        backend, channel="latest", public_key=keypair[1], on_event=lambda k, m: events.append((k, m))
    )
    router.events = events
    publish_to(policies[1])
    backend.down = True
    _refused(router, r"connection reset")
    assert events[-1][0] == "unreachable"
    backend.down = False
    assert router.refresh() is True and router.version == 2  # the same pointer is retried


def test_serving_an_expired_policy_is_reported(policies, publish_to, registry, keypair, loader_later) -> None:
    publish_to(policies[0], expires_in=timedelta(minutes=10))
    events: list[tuple[str, str]] = []
    router = load(registry, keypair[1], on_event=lambda k, m: events.append((k, m)))
    assert not router.status().expired
    loader_later(timedelta(minutes=11))
    assert router.status().expired
    assert router.refresh() is False and router.status().expired
    assert events[-1][0] == "expired" and "version 1, which expired" in events[-1][1]
    assert router.route(*PROMPTS[0]).policy_version == 1  # still serving: availability first


def test_signed_but_broken_policy_is_refused(served, policies, publish_to, registry, keypair) -> None:
    class Broken:
        """Valid files, signed by the trusted key, whose scorer has the wrong shape."""

        candidates = policies[1].candidates

        def save(self, folder: Path) -> list[str]:
            names = policies[1].save(folder)
            head = json.loads((folder / "policy.json").read_text())
            head["scorer"]["rank"] += 1  # the weight matrix no longer has the columns it says
            (folder / "policy.json").write_text(json.dumps(head))
            return names

        def describe(self) -> dict:
            return policies[1].describe()

    publish_to(Broken())
    _refused(served, r"policy does not load or decide")


def test_gateway_without_a_key_refuses_to_load_unless_told(
    policies, publish_to, registry, monkeypatch
) -> None:
    """Secure by default: no public key means no load, not an unverified one."""
    monkeypatch.delenv("ROUTEOPT_PUBLIC_KEY", raising=False)
    publish_to(policies[0])
    with pytest.raises(PolicyLoadError, match="no public key.*allow_unsigned=True") as info:
        load(registry)
    assert info.value.kind == "config"
    with pytest.raises(PolicyLoadError, match="no public key"):
        load(registry, default_model="gpt-4o-mini")  # a default model is no way around it
    router = load(registry, allow_unsigned=True)
    assert router.version == 1 and not router.status().signed


GATEWAY_AS_NOBODY = """
import json, os, sys
from routeopt.artifacts.serving.loader import load
import _strptime, routeopt.router_training.policy.routing  # imported as root: the interpreter lives in root's home
os.setgroups([]); os.setgid(65534); os.setuid(65534)
router = load(sys.argv[1], public_key=sys.argv[2], state_dir=False)
print(json.dumps({"uid": os.getuid(), "version": router.route("add 2 and 3").policy_version}))
"""


@pytest.mark.skipif(
    not hasattr(os, "geteuid") or os.geteuid() != 0, reason="starting a gateway as another user needs root"
)
def test_a_gateway_running_as_another_user_can_read_what_was_published(policies, keypair) -> None:
    """Published files are 0644 and folders 0755 even under a umask of 077; the private key
    stays 0600. A gateway process running as `nobody` loads and verifies the policy."""
    import shutil
    import stat
    import subprocess
    import sys
    import tempfile

    from routeopt.artifacts.publish.signing_keys import generate_keys
    from tests import REPO

    shared = Path(tempfile.mkdtemp(prefix="routeopt-shared-"))
    try:
        shared.chmod(0o755)  # the operator's shared folder
        old_umask = os.umask(0o077)
        try:
            generate_keys(shared / "keys")
            publish(
                policies[0],
                shared / "registry",
                lineage={},
                metrics={},
                signing_key=shared / "keys" / "signing_key.pem",
            )
        finally:
            os.umask(old_umask)
        modes = {
            str(p.relative_to(shared)): stat.S_IMODE(p.stat().st_mode)
            for p in shared.rglob("*")
            if not p.name.startswith(".")
        }
        assert modes.pop("keys/signing_key.pem") == 0o600
        assert all(m == (0o755 if (shared / p).is_dir() else 0o644) for p, m in modes.items()), modes
        out = subprocess.run(
            [
                sys.executable,
                "-c",
                GATEWAY_AS_NOBODY,
                str(shared / "registry"),
                str(shared / "keys" / "public_key.pem"),
            ],
            capture_output=True,
            text=True,
            cwd=REPO,
            timeout=120,
        )
        assert out.returncode == 0, out.stderr[-2000:]
        assert json.loads(out.stdout) == {"uid": 65534, "version": 1}
    finally:
        shutil.rmtree(shared)


def test_first_runs_at_once_end_with_one_key(tmp_path) -> None:
    """Two nightlies starting together on a fresh install both create 'the' key: one wins, the
    other uses it, and neither ever reads half a key."""
    import threading

    from routeopt.artifacts.serving.signatures import key_id, load_public_key, public_key_path
    from routeopt.artifacts.publish.signing_keys import ensure_signing_key

    path, results, start = tmp_path / "keys" / "signing_key.pem", [], threading.Barrier(8)

    def first_run() -> None:
        start.wait()
        key, created = ensure_signing_key(path)
        results.append((key_id(key.public_key()), created))

    threads = [threading.Thread(target=first_run) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len({k for k, _ in results}) == 1 and sum(c for _, c in results) == 1, results
    assert key_id(load_public_key(public_key_path(path))) == results[0][0]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temporary left
