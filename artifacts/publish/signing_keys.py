"""The private keys that sign policies and channel moves: created, read, found, used.

Keys are PEM files (PKCS#8 private, with `public_key.pem` beside it); the private key path comes
from the caller (config `signing_key`) or the `ROUTEOPT_SIGNING_KEY` environment variable, never
from an artifact. Gateways never hold one: they verify with routeopt.artifacts.serving.signatures.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from routeopt.artifacts.serving.signatures import (
    PUBLIC_KEY_NAME,
    Signature,
    SigningError,
    key_id,
    load_public_key,
    public_key_path,
)
from routeopt.common.io import atomic_write, make_dirs

SIGNING_KEY_ENV = "ROUTEOPT_SIGNING_KEY"


def _write_public(key: Ed25519PrivateKey, path: Path) -> None:
    pem = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    atomic_write(path, pem, permissions=0o644)  # gateways running as other users read it


def _create_private(path: Path) -> bool:
    """Write a new private key at `path` (0600) unless one is there; False if another process
    created it first. The key is written in full under a temporary name and then hard-linked into
    place, so no reader ever sees half a key and two creators never overwrite each other."""
    make_dirs(path.parent)  # 0755: the public key beside it is for others to read
    pem = Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
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


def resolve_signing_key(configured: str | os.PathLike | None = None) -> Ed25519PrivateKey | None:
    """The key to publish with: the configured path, else `$ROUTEOPT_SIGNING_KEY`, else None."""
    path = configured or os.environ.get(SIGNING_KEY_ENV)
    return load_private_key(path) if path else None


def sign(data: bytes, key: Ed25519PrivateKey) -> Signature:
    return Signature(key_id=key_id(key.public_key()), value=key.sign(data))
