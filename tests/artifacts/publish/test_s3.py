"""The S3 backend against moto's server mode on 127.0.0.1: the real boto3 over real HTTP.

moto implements PutObject's If-None-Match / If-Match preconditions (412 PreconditionFailed), so
these tests exercise the same compare-and-swap that keeps two publishers from colliding on AWS.
"""

from __future__ import annotations

import socket
import threading

import pytest

from routeopt.artifacts.serving.backends import S3Backend, open_backend
from routeopt.artifacts.publish.registry import (
    current_pointer,
    list_versions,
    move_channel,
    publish,
    rollback,
)
from routeopt.artifacts.serving.loader import load
from tests.artifacts.policies import PROMPTS

moto_server = pytest.importorskip("moto.server")


@pytest.fixture(scope="module")
def endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    yield f"http://127.0.0.1:{port}"
    server.stop()


@pytest.fixture()
def bucket(endpoint, monkeypatch, request) -> str:
    for k, v in {
        "AWS_ACCESS_KEY_ID": "test",
        "AWS_SECRET_ACCESS_KEY": "test",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_ENDPOINT_URL": endpoint,
    }.items():
        monkeypatch.setenv(k, v)
    name = "policies-" + request.node.name.lower().replace("_", "-")[:40]
    import boto3

    boto3.client("s3").create_bucket(Bucket=name)
    return f"s3://{name}/team/router"


def test_conditional_writes(bucket: str) -> None:
    backend = open_backend(bucket)
    assert isinstance(backend, S3Backend)
    assert backend.put_if_absent("channels/x.json", b"1") is True
    assert backend.put_if_absent("channels/x.json", b"2") is False
    _, etag = backend.get("channels/x.json")
    assert backend.put_if_match("channels/x.json", b"3", etag) is True
    assert backend.put_if_match("channels/x.json", b"4", etag) is False  # stale ETag loses
    assert backend.get("channels/x.json")[0] == b"3"
    assert backend.get_if_changed("channels/x.json", backend.get("channels/x.json")[1]) is None
    assert backend.list("channels/") == ["channels/x.json"]


def test_publish_promote_rollback_and_load(bucket, policies, keypair) -> None:
    for i in range(2):
        publish(policies[i], bucket, lineage={"runs": [f"r{i}"]}, metrics={}, signing_key=keypair[0])
    move_channel(bucket, "champion", 1, signing_key=keypair[0])
    router = load(bucket, keypair[1])
    assert (router.status().channel, router.version) == ("champion", 1)
    prompt, suite = PROMPTS[1]
    assert router.route(prompt, suite).model == policies[0].decide(prompt, suite).model
    move_channel(bucket, "champion", 2, signing_key=keypair[0])
    assert router.refresh() is True and router.version == 2
    rollback(bucket, "champion", signing_key=keypair[0])
    assert router.refresh() is True and router.version == 1
    assert [r["version"] for r in list_versions(bucket)] == [1, 2]


def test_concurrent_publishers_on_s3(bucket, policies, keypair) -> None:
    results, errors = [], []

    def worker(i: int) -> None:
        try:
            results.append(
                publish(
                    policies[i % 2], bucket, lineage={"runs": [f"r{i}"]}, metrics={}, signing_key=keypair[0]
                )
            )
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert sorted(r.version for r in results) == [1, 2, 3, 4]
    pointer, _ = current_pointer(bucket, "latest")
    assert pointer.version == 4
    manifests = [k for k in open_backend(bucket).list("versions/") if k.endswith("manifest.json")]
    assert len(manifests) == 4  # losing attempts were deleted


def test_a_publisher_that_loses_the_race_never_deletes_the_winners_files(bucket, policies, keypair) -> None:
    from tests.artifacts.racing import assert_every_version_serves, race_two_publishers

    versions = race_two_publishers(open_backend(bucket), policies[0], keypair[0])
    assert [v.version for v in versions] == [1, 2] and versions[0].path != versions[1].path
    assert_every_version_serves(bucket, versions, keypair[1])
    manifests = [k for k in open_backend(bucket).list("versions/") if k.endswith("manifest.json")]
    assert len(manifests) == 2  # the loser's abandoned attempt is gone, the winner's is whole


def test_tampered_object_is_refused(bucket, policies, keypair) -> None:
    publish(policies[0], bucket, lineage={}, metrics={}, signing_key=keypair[0])
    router = load(bucket, keypair[1])
    v2 = publish(policies[1], bucket, lineage={}, metrics={}, signing_key=keypair[0])
    backend = open_backend(bucket)
    backend.put(f"{v2.path}/policy.json", b"{}")
    assert router.refresh() is False and router.version == 1
    assert "policy.json: size or sha256 does not match" in router.status().last_error
