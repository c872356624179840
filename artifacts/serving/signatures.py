"""Ed25519 keys and signatures for policy manifests and channel pointers.

`cryptography` is the one dependency the gateway needs beyond numpy: it is the reference
binding to OpenSSL's constant-time Ed25519, which a hand-written verifier would not match.
Keys are PEM files (PKCS#8 private, SubjectPublicKeyInfo public); the private key path comes from
the caller (config `signing_key`) or the `ROUTEOPT_SIGNING_KEY` environment variable, never from
an artifact.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from routeopt.common.io import atomic_write, make_dirs

SIGNING_KEY_ENV = "ROUTEOPT_SIGNING_KEY"
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
        return {"alg": ALGORITHM, "key_id": self.key_id,
                "signature": base64.b64encode(self.value).decode("ascii")}

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


def _write_public(key: Ed25519PrivateKey, path: Path) -> None:
    pem = key.public_key().public_bytes(serialization.Encoding.PEM,
                                        serialization.PublicFormat.SubjectPublicKeyInfo)
    atomic_write(path, pem, permissions=0o644)  # gateways running as other users read it


def _create_private(path: Path) -> bool:
    """Write a new private key at `path` (0600) unless one is there; False if another process
    created it first. The key is written in full under a temporary name and then hard-linked into
    place, so no reader ever sees half a key and two creators never overwrite each other."""
    make_dirs(path.parent)  # 0755: the public key beside it is for others to read
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")  # 0600
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(pem)
            f.flush()
            os.fsync(f.fileno())
        os.link(tmp, path)
        return True
    except FileExistsError:
        return False
    finally:
        os.unlink(tmp)


def generate_keys(out_dir: Path) -> tuple[Path, Path]:
    """Write a new `signing_key.pem` (mode 0600) and `public_key.pem` (0644); refuse to overwrite."""
    private_path, public_path = out_dir / "signing_key.pem", out_dir / PUBLIC_KEY_NAME
    for p in (private_path, public_path):
        if p.exists():
            raise SigningError(f"{p}: already exists; move it away or choose another --out")
    if not _create_private(private_path):
        raise SigningError(f"{private_path}: already exists; move it away or choose another --out")
    _write_public(load_private_key(private_path), public_path)
    return private_path, public_path


def ensure_signing_key(path: str | os.PathLike) -> tuple[Ed25519PrivateKey, bool]:
    """The private key at `path`, created (0600) if there is none yet; True when it was created
    now. `public_key.pem` beside it (0644) is kept equal to its public half."""
    path = Path(path)
    created = not path.exists() and _create_private(path)
    key = load_private_key(path)
    public = public_key_path(path)
    try:
        current = load_public_key(public)
    except SigningError:
        current = None
    if current is None or key_id(current) != key_id(key.public_key()):
        _write_public(key, public)
    return key, created


def load_private_key(path: str | os.PathLike) -> Ed25519PrivateKey:
    """Read a PEM Ed25519 private key, naming the file on any problem."""
    path = Path(path)
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except FileNotFoundError:
        raise SigningError(f"{path}: signing key not found") from None
    except (ValueError, TypeError) as exc:
        raise SigningError(f"{path}: not a PEM private key without password ({exc})") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise SigningError(f"{path}: expected an Ed25519 key, got {type(key).__name__}")
    return key


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


def resolve_signing_key(configured: str | os.PathLike | None = None) -> Ed25519PrivateKey | None:
    """The key to publish with: the configured path, else `$ROUTEOPT_SIGNING_KEY`, else None."""
    path = configured or os.environ.get(SIGNING_KEY_ENV)
    return load_private_key(path) if path else None


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


def sign(data: bytes, key: Ed25519PrivateKey) -> Signature:
    return Signature(key_id=key_id(key.public_key()), value=key.sign(data))


def verify(data: bytes, signature: Signature, public_key: Ed25519PublicKey | TrustedKeys,
           what: str) -> None:
    """Raise SigningError naming `what` unless `signature` is a valid signature of `data` by a
    trusted key."""
    keys = public_key if isinstance(public_key, Mapping) else {key_id(public_key): public_key}
    key = keys.get(signature.key_id)
    if key is None:
        trusted = ", ".join(sorted(keys))
        raise SigningError(f"{what}: signed by key {signature.key_id}, but the trusted "
                           f"key{' is' if len(keys) == 1 else 's are'} {trusted}")
    try:
        key.verify(signature.value, data)
    except InvalidSignature:
        raise SigningError(f"{what}: signature does not match the content (tampered or truncated)") from None
