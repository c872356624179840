"""Checks a policy version and a channel pointer exactly as the gateway does before trusting them.

Order matters: the manifest's bytes are hashed (against the pointer's digest and the folder name)
and their signature checked before they are parsed; every file is read once, its size and sha256
checked, and only those checked bytes are written to a private folder that the policy loads from,
so nothing can change between the check and the load.

Unsigned policies: with a public key, a missing or wrong signature is always rejected. Only a
caller that passes no key (the gateway does so only when told `allow_unsigned`) skips signatures;
hashes, expiry and version order are still checked and the result says `signed=False`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

from routeopt.artifacts.serving.backends import Backend, NotFound
from routeopt.artifacts.serving.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Manifest,
    ManifestError,
    Pointer,
    canonical_json,
    check_channel,
    check_file_name,
    parse_manifest,
    parse_pointer,
    sha256_hex,
)
from routeopt.artifacts.serving.signatures import Signature, SigningError, TrustedKeys, verify

_DIR_NAME = re.compile(r"^(\d{6,})-([0-9a-f]{12})$")


class VerificationError(ValueError):
    """A policy that must not be served; the message is the reason, naming file and field.

    `kind` lets callers act on the reason without parsing it: "expired", "unsigned" (no
    signature where one is required), "order" (replayed, rewritten or downgraded pointer),
    "conformance" (this runtime disagrees with the policy's conformance vectors) or "rejected"
    (anything else: tampered, wrong key, malformed)."""

    def __init__(self, message: str, kind: str = "rejected") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class Seen:
    """The newest channel move a gateway accepted; every later pointer is checked against it."""

    seq: int
    version: int
    digest: str

    @classmethod
    def of(cls, pointer: Pointer) -> "Seen":
        return cls(pointer.seq, pointer.version, pointer.digest)


@dataclass(frozen=True)
class VerifiedVersion:
    manifest: Manifest
    digest: str
    location: str
    files: dict[str, bytes]
    signed: bool
    key_id: str | None

    @property
    def version(self) -> int:
        return self.manifest.version


def _key(prefix: str, name: str) -> str:
    return f"{prefix}/{name}" if prefix else name


def _read(backend: Backend, key: str) -> bytes:
    try:
        return backend.get(key)[0]
    except NotFound:
        raise VerificationError(f"{backend.location}: {key} is missing") from None


def _check_signature(
    backend: Backend, prefix: str, data: bytes, public_key: TrustedKeys | None
) -> tuple[bool, str | None]:
    where = f"{backend.location}: {_key(prefix, SIGNATURE_NAME)}"
    try:
        raw_sig = backend.get(_key(prefix, SIGNATURE_NAME))[0]
    except NotFound:
        if public_key is not None:
            raise VerificationError(
                f"{where}: missing, and a public key was given (unsigned policy)", "unsigned"
            ) from None
        return False, None
    try:
        sig = Signature.from_dict(json.loads(raw_sig.decode("utf-8")), where)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise VerificationError(f"{where}: not valid JSON") from None
    except SigningError as exc:
        raise VerificationError(str(exc)) from None
    if public_key is None:
        return False, sig.key_id
    try:
        verify(data, sig, public_key, f"{backend.location}: {_key(prefix, MANIFEST_NAME)}")
    except SigningError as exc:
        raise VerificationError(str(exc)) from None
    return True, sig.key_id


def _check_name(prefix: str, digest: str, manifest: Manifest, where: str) -> None:
    """A content-addressed folder name must agree with the manifest's version and digest."""
    match = _DIR_NAME.match(prefix.rstrip("/").rsplit("/", 1)[-1]) if prefix else None
    if match is None:
        return
    if int(match.group(1)) != manifest.version or match.group(2) != digest[:12]:
        raise VerificationError(
            f"{where}: folder name says version {int(match.group(1))} / {match.group(2)} but the "
            f"manifest is version {manifest.version} / {digest[:12]} (moved or tampered)"
        )


def verify_version(
    backend: Backend,
    prefix: str,
    public_key: TrustedKeys | None,
    *,
    expected_digest: str | None = None,
    now: datetime | None = None,
) -> VerifiedVersion:
    """Read and check one version (signature, digest, folder name, expiry, every file's hash)."""
    where = f"{backend.location}: {_key(prefix, MANIFEST_NAME)}"
    data = _read(backend, _key(prefix, MANIFEST_NAME))
    digest = sha256_hex(data)
    if expected_digest is not None and digest != expected_digest:
        raise VerificationError(
            f"{where}: sha256 {digest[:12]} does not match the channel's "
            f"{expected_digest[:12]} (tampered or replaced)"
        )
    signed, key_id = _check_signature(backend, prefix, data, public_key)
    try:
        manifest = parse_manifest(data, where)
    except ManifestError as exc:
        raise VerificationError(str(exc)) from None
    _check_name(prefix, digest, manifest, where)
    now = now or datetime.now(timezone.utc)
    if manifest.expired(now):
        raise VerificationError(
            f"{where}: version {manifest.version} expired at "
            f"{manifest.raw.get('expires_at')}; publish a fresh policy",
            "expired",
        )
    files = {}
    for entry in manifest.files:
        blob = _read(backend, _key(prefix, entry.path))
        if len(blob) != entry.size or sha256_hex(blob) != entry.sha256:
            raise VerificationError(
                f"{backend.location}: {_key(prefix, entry.path)}: size or sha256 "
                f"does not match manifest.json (tampered or truncated)"
            )
        files[entry.path] = blob
    return VerifiedVersion(
        manifest, digest, f"{backend.location}/{prefix}".rstrip("/"), files, signed, key_id
    )


def materialize(verified: VerifiedVersion, dest: Path) -> Path:
    """Write the checked bytes (and nothing else) into `dest`, a fresh private temporary folder
    the policy loader reads and its caller then deletes: nothing there needs to survive a crash,
    so the files are written plainly (fsyncing 5 MB was a tenth of a cold load)."""
    for name, blob in verified.files.items():
        target = dest / check_file_name(name)
        if dest.resolve() not in target.resolve().parents:
            raise VerificationError(f"{name}: resolves outside the policy folder")
        with open(target, "xb") as f:
            f.write(blob)
    return dest


@dataclass(frozen=True)
class SignedPointer:
    pointer: Pointer
    signed: bool
    etag: str


def read_pointer(
    backend: Backend, channel: str, public_key: TrustedKeys | None, etag: str | None = None
) -> SignedPointer | None:
    """The channel's pointer, checked; None when unchanged since `etag` (cheap polling)."""
    key = f"channels/{check_channel(channel)}.json"
    where = f"{backend.location}: {key}"
    try:
        got = backend.get_if_changed(key, etag)
    except NotFound:
        raise VerificationError(f"{where}: no such channel") from None
    if got is None:
        return None
    data, new_etag = got
    try:
        doc = json.loads(data.decode("utf-8"))
        payload, raw_sig = doc["payload"], doc.get("signature")
    except (UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError):
        raise VerificationError(f"{where}: not a valid channel file (truncated or corrupt)") from None
    signed = False
    if public_key is not None:
        if raw_sig is None:
            raise VerificationError(f"{where}: unsigned, and a public key was given", "unsigned")
        try:
            verify(canonical_json(payload), Signature.from_dict(raw_sig, where), public_key, where)
        except (SigningError, ValueError) as exc:
            raise VerificationError(str(exc)) from None
        signed = True
    try:
        pointer = parse_pointer(payload, where)
    except ManifestError as exc:
        raise VerificationError(str(exc)) from None
    if pointer.channel != channel:
        raise VerificationError(f"{where}: pointer is for channel {pointer.channel!r} (copied?)")
    return SignedPointer(pointer, signed, new_etag)


def check_order(new: Pointer, seen: Seen | None) -> None:
    """Never go back: a pointer older than the newest one accepted is a replay, the same move
    with other contents a forgery, and an older version needs a newer signed 'rollback'."""
    if seen is None:
        return
    if new.seq < seen.seq:
        raise VerificationError(
            f"channel {new.channel}: pointer move #{new.seq} is older than "
            f"#{seen.seq} already seen (replayed)",
            "order",
        )
    if new.seq == seen.seq:
        if (new.version, new.digest) != (seen.version, seen.digest):
            raise VerificationError(
                f"channel {new.channel}: pointer move #{new.seq} now names version "
                f"{new.version}/{new.digest[:12]}, but #{seen.seq} was version "
                f"{seen.version}/{seen.digest[:12]} (rewritten)",
                "order",
            )
        return
    if new.version < seen.version and new.action != "rollback":
        raise VerificationError(
            f"channel {new.channel}: version {new.version} is older than version "
            f"{seen.version} already accepted and is not a rollback (downgrade refused)",
            "order",
        )
