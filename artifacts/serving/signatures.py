"""Ed25519 signatures of policy manifests and channel pointers, and the public keys that check them.

`cryptography` is the one dependency the gateway needs beyond numpy: it is the reference
binding to OpenSSL's constant-time Ed25519, which a hand-written verifier would not match.
Public keys are PEM files (SubjectPublicKeyInfo); the private keys that sign are publishing's
(routeopt.artifacts.publish.signing_keys).
"""

from __future__ import annotations

import base64
import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey


PUBLIC_KEY_ENV = "ROUTEOPT_PUBLIC_KEY"
ALGORITHM = "ed25519"


class SigningError(ValueError):
    """A key that cannot be read or a signature that does not verify; the message says which."""


@dataclass(frozen=True)
class Signature:
    """A detached signature and the id of the key that made it."""

    key_id: str
    value: bytes

    def to_dict(self) -> dict:
        return {
            "alg": ALGORITHM,
            "key_id": self.key_id,
            "signature": base64.b64encode(self.value).decode("ascii"),
        }

    @classmethod
    def from_dict(cls, raw: object, where: str) -> "Signature":
        if not isinstance(raw, dict):
            raise SigningError(f"{where}: signature must be a JSON object")
        if raw.get("alg") != ALGORITHM:
            raise SigningError(f"{where}: unsupported signature algorithm {raw.get('alg')!r}")
        try:
            value = base64.b64decode(str(raw["signature"]), validate=True)
            key_id = str(raw["key_id"])
        except (KeyError, ValueError) as exc:
            raise SigningError(f"{where}: malformed signature field ({exc})") from None
        if len(value) != 64:
            raise SigningError(f"{where}: an Ed25519 signature is 64 bytes, got {len(value)}")
        return cls(key_id=key_id, value=value)


def key_id(public_key: Ed25519PublicKey) -> str:
    """A short stable name for a public key, so a signature says which key to check it with."""
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


PUBLIC_KEY_NAME = "public_key.pem"


def public_key_path(private_path: str | os.PathLike) -> Path:
    """Where the public half of a signing key lives: `public_key.pem` in the same folder."""
    return Path(private_path).parent / PUBLIC_KEY_NAME


def load_public_key(source: str | os.PathLike | bytes | Ed25519PublicKey) -> Ed25519PublicKey:
    """Accept a key object, PEM bytes or a path to a PEM public key."""
    if isinstance(source, Ed25519PublicKey):
        return source
    where = "public key"
    if isinstance(source, bytes):
        data = source
    else:
        where = str(source)
        try:
            data = Path(source).read_bytes()
        except FileNotFoundError:
            raise SigningError(f"{source}: public key not found") from None
    try:
        key = serialization.load_pem_public_key(data)
    except ValueError as exc:
        raise SigningError(f"{where}: not a PEM public key ({exc})") from None
    if not isinstance(key, Ed25519PublicKey):
        raise SigningError(f"{where}: expected an Ed25519 key, got {type(key).__name__}")
    return key


TrustedKeys = Mapping[str, Ed25519PublicKey]


def trusted_keys(given: Any) -> dict[str, Ed25519PublicKey] | None:
    """The keys to verify with, by key id: one key (object, PEM bytes or path) or a list of them
    (to rotate keys, trust old and new for a while). Default `$ROUTEOPT_PUBLIC_KEY` (paths joined
    by os.pathsep); None means signatures are not checked."""
    if given is None:
        env = os.environ.get(PUBLIC_KEY_ENV)
        if not env:
            return None
        given = [p for p in env.split(os.pathsep) if p]
    items = list(given) if isinstance(given, (list, tuple)) else [given]
    if not items:
        return None
    keys = [load_public_key(x) for x in items]
    return {key_id(k): k for k in keys}


def verify(data: bytes, signature: Signature, public_key: Ed25519PublicKey | TrustedKeys, what: str) -> None:
    """Raise SigningError naming `what` unless `signature` is a valid signature of `data` by a
    trusted key."""
    keys = public_key if isinstance(public_key, Mapping) else {key_id(public_key): public_key}
    key = keys.get(signature.key_id)
    if key is None:
        trusted = ", ".join(sorted(keys))
        raise SigningError(
            f"{what}: signed by key {signature.key_id}, but the trusted "
            f"key{' is' if len(keys) == 1 else 's are'} {trusted}"
        )
    try:
        key.verify(signature.value, data)
    except InvalidSignature:
        raise SigningError(f"{what}: signature does not match the content (tampered or truncated)") from None
