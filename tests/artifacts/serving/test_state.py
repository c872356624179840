"""Downgrade protection that survives a restart: a gateway remembers the newest channel move it
accepted, so a replayed older signed pointer is refused by the next process too."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from routeopt.artifacts.publish.registry import move_channel, rollback
from routeopt.artifacts.serving.loader import PolicyLoadError, load
from tests import REPO
from tests.artifacts.policies import PROMPTS

GATEWAY = """
import json, sys
from routeopt.artifacts.serving.loader import PolicyLoadError, load
try:
    router = load(sys.argv[1], public_key=sys.argv[2])
except PolicyLoadError as exc:
    print(json.dumps({"error": str(exc), "kind": exc.kind}))
else:
    print(json.dumps({"version": router.route("Reverse the string: abc", suite="reverse").policy_version}))
"""


def _gateway_process(source: str, public_key: Path, state_dir: Path) -> dict:
    """Start a gateway in a fresh interpreter (a restart), load once, report what it serves."""
    env = {**os.environ, "ROUTEOPT_STATE_DIR": str(state_dir)}
    out = subprocess.run(
        [sys.executable, "-c", GATEWAY, source, str(public_key)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        cwd=REPO,
        timeout=120,
    )
    return json.loads(out.stdout)


def _two_versions_and_the_old_pointer(policies, publish_to, registry: Path) -> bytes:
    publish_to(policies[0])
    old = (registry / "channels" / "latest.json").read_bytes()  # move #1, validly signed
    publish_to(policies[1])
    return old


def test_restarted_gateway_refuses_a_replayed_pointer(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    old = _two_versions_and_the_old_pointer(policies, publish_to, registry)
    state = tmp_path / "state"
    assert _gateway_process(str(registry), keypair[1], state) == {"version": 2}
    (registry / "channels" / "latest.json").write_bytes(old)  # an attacker replays move #1
    refused = _gateway_process(str(registry), keypair[1], state)
    assert refused.get("kind") == "order", refused  # before: {"version": 1}, the replay was served
    assert "move #1 is older than #2 already seen (replayed)" in refused["error"]
    assert "delete it only if the registry was deliberately recreated" in refused["error"]
    # The state is the only thing that stops it: a host that never saw move #2 accepts move #1.
    assert _gateway_process(str(registry), keypair[1], tmp_path / "new-host") == {"version": 1}


def test_restarted_gateway_over_registry_serve_refuses_a_replay(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    old = _two_versions_and_the_old_pointer(policies, publish_to, registry)
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "routeopt.flows.cli",
            "registry",
            "serve",
            "--registry",
            str(registry),
            "--port",
            "0",
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        url = server.stdout.readline().split(" at ")[1].split()[0]  # "serving R at http://h:p/ (...)"
        state = tmp_path / "state"
        assert _gateway_process(url, keypair[1], state) == {"version": 2}
        (registry / "channels" / "latest.json").write_bytes(old)
        refused = _gateway_process(url, keypair[1], state)
        assert refused.get("kind") == "order" and "(replayed)" in refused["error"], refused
        router = load(url, keypair[1], state_dir=state, default_model="gpt-4o-mini")
        assert router.route(*PROMPTS[0]).model == "gpt-4o-mini"  # served, and says why
        assert "(replayed)" in router.status().default_reason
    finally:
        server.terminate()
        server.wait(timeout=10)


def test_a_signed_rollback_is_still_accepted_after_a_restart(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    publish_to(policies[0])
    publish_to(policies[1])
    move_channel(registry, "champion", 1, signing_key=keypair[0])
    move_channel(registry, "champion", 2, signing_key=keypair[0])
    assert load(registry, keypair[1], state_dir=tmp_path).version == 2
    rollback(registry, "champion", signing_key=keypair[0])  # move #3: back to version 1
    assert load(registry, keypair[1], state_dir=tmp_path).version == 1


def test_gateways_sharing_a_host_never_lower_the_record(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    from routeopt.artifacts.serving.state import SeenFile
    from routeopt.artifacts.serving.verify import Seen

    publish_to(policies[0])
    lagging = load(registry, keypair[1], state_dir=tmp_path)
    publish_to(policies[1])
    ahead = load(registry, keypair[1], state_dir=tmp_path)
    assert (lagging.version, ahead.version) == (1, 2)
    record = SeenFile(tmp_path, str(registry), "latest")
    assert record.record(Seen(1, 1, "0" * 64)).seq == 2  # an older move never overwrites
    assert record.read().seq == 2 and record.path.stat().st_mode & 0o777 == 0o600


def test_corrupt_or_foreign_state_is_refused_not_ignored(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    publish_to(policies[0])
    router = load(registry, keypair[1], state_dir=tmp_path)
    path = Path(router.status().state_file)
    path.write_text("{not json")
    with pytest.raises(PolicyLoadError, match="gateway state cannot be read.*Delete it"):
        load(registry, keypair[1], state_dir=tmp_path)
    path.write_text(
        json.dumps(
            {"registry": "/elsewhere", "channel": "latest", "seq": 1, "version": 1, "digest": "0" * 64}
        )
    )
    with pytest.raises(PolicyLoadError, match="belongs to another registry"):
        load(registry, keypair[1], state_dir=tmp_path)
    path.unlink()
    assert load(registry, keypair[1], state_dir=tmp_path).version == 1


def test_unwritable_state_keeps_serving_and_says_so(
    policies, publish_to, registry, keypair, tmp_path
) -> None:
    publish_to(policies[0])
    blocker = tmp_path / "not-a-folder"
    blocker.write_text("")
    router = load(registry, keypair[1], state_dir=blocker)
    assert router.version == 1 and "cannot record the accepted move" in router.status().state_error
