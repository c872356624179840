"""Manifest and signature primitives: safe names, canonical bytes, parsing errors that name the field."""

from __future__ import annotations

import json
import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.artifacts.serving.manifest import (
    ManifestError,
    canonical_json,
    check_file_name,
    parse_manifest,
)
from routeopt.artifacts.serving.signatures import Signature, SigningError, load_public_key, verify
from routeopt.artifacts.publish.manifest_writer import build_manifest
from routeopt.artifacts.publish.signing_keys import load_private_key, sign

NOW = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)


@settings(max_examples=300, deadline=None)
@given(st.text(alphabet=st.sampled_from(list("ab./\\-_~:%\x00 ")), min_size=1, max_size=12))
def test_accepted_names_stay_inside_the_folder(name: str) -> None:
    root = Path("/srv/policy")
    try:
        check_file_name(name)
    except ManifestError:
        return
    resolved = Path(os.path.normpath(root / name))
    assert root in resolved.parents and ".." not in name.split("/") and not name.startswith("/")


@pytest.mark.parametrize(
    "name",
    ["../x", "a/../../x", "/etc/passwd", "a\\..\\b", ".hidden", "a//b", "", "a/", "C:x", "x\x00y", "é.json"],
)
def test_unsafe_names_are_refused(name: str) -> None:
    with pytest.raises(ManifestError, match="file name"):
        check_file_name(name)


def test_canonical_json_is_stable_and_strict() -> None:
    assert canonical_json({"b": 1, "a": [1.5, "é"]}) == b'{"a":[1.5,"\\u00e9"],"b":1}'
    with pytest.raises(ValueError):
        canonical_json({"x": float("nan")})


def _manifest(**kw) -> bytes:
    args = dict(
        version=3,
        files={"policy.json": b"{}"},
        lineage={"runs": ["r"]},
        metrics={},
        policy={"candidates": ["a"]},
        created_at=NOW,
        expires_in=timedelta(days=1),
    )
    return build_manifest(**{**args, **kw})


def test_manifest_round_trip() -> None:
    m = parse_manifest(_manifest())
    assert (m.version, m.created_at, m.expires_at) == (3, NOW, NOW + timedelta(days=1))
    assert m.files[0].path == "policy.json" and m.files[0].size == 2
    assert not m.expired(NOW) and m.expired(NOW + timedelta(days=1))
    assert parse_manifest(_manifest(expires_in=None)).expires_at is None
    with pytest.raises(ManifestError, match="reserved"):
        _manifest(files={"manifest.json": b""})


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d.update(version=0), "version must be a positive integer"),
        (lambda d: d.update(format="other/1"), "format"),
        (lambda d: d.update(files=[]), "files must be a non-empty list"),
        (lambda d: d["files"][0].update(sha256="zz"), r"files\[0\].sha256"),
        (lambda d: d["files"][0].update(size=-1), r"files\[0\].size"),
        (lambda d: d["files"].append(dict(d["files"][0])), "duplicated"),
        (lambda d: d.update(created_at="yesterday"), "created_at"),
        (lambda d: d["files"][0].update(path="../../x"), r"files\[0\].path: unsafe file name"),
    ],
)
def test_bad_manifests_name_the_field(edit, message: str) -> None:
    doc = json.loads(_manifest())
    edit(doc)
    with pytest.raises(ManifestError, match=message):
        parse_manifest(json.dumps(doc).encode())


def test_truncated_manifest() -> None:
    with pytest.raises(ManifestError, match="not valid JSON"):
        parse_manifest(_manifest()[:-20])


def test_sign_and_verify(keypair, other_keypair) -> None:
    key, pub = load_private_key(keypair[0]), load_public_key(keypair[1])
    sig = sign(b"payload", key)
    verify(b"payload", Signature.from_dict(sig.to_dict(), "x"), pub, "x")
    with pytest.raises(SigningError, match="does not match the content"):
        verify(b"payload!", sig, pub, "x")
    with pytest.raises(SigningError, match="trusted key is"):
        verify(b"payload", sig, load_public_key(other_keypair[1]), "x")
    with pytest.raises(SigningError, match="64 bytes"):
        Signature.from_dict({**sig.to_dict(), "signature": "AAAA"}, "x")
    with pytest.raises(SigningError, match="unsupported signature algorithm"):
        Signature.from_dict({**sig.to_dict(), "alg": "rsa"}, "x")


def test_key_files_errors(tmp_path: Path, keypair) -> None:
    with pytest.raises(SigningError, match="signing key not found"):
        load_private_key(tmp_path / "missing.pem")
    with pytest.raises(SigningError, match="not a PEM public key"):
        load_public_key(keypair[0])
    (tmp_path / "junk.pem").write_text("junk")
    with pytest.raises(SigningError, match="not a PEM private key"):
        load_private_key(tmp_path / "junk.pem")
