"""The policy manifest and the channel pointer: what they hold and how they are checked.

A version is a folder of files plus `manifest.json` (every file with its sha256 and size, the
version number, timestamps, lineage, held-out metrics and the policy's own description) and
`manifest.sig` (Ed25519 over the exact bytes of manifest.json). The version's digest is the sha256
of those bytes, and its folder is named `<version:06d>-<digest[:12]>`, so a folder name commits to
its content. A channel pointer names one version by number, folder and digest; its payload is
signed in canonical JSON so a pointer cannot be moved (or rolled back) without the key.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

FORMAT = "routeopt.policy/1"
POINTER_FORMAT = "routeopt.channel/1"
MANIFEST_NAME = "manifest.json"
SIGNATURE_NAME = "manifest.sig"
RESERVED_NAMES = frozenset({MANIFEST_NAME, SIGNATURE_NAME})
_SAFE_PART = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}$")
_VERSION_DIR = re.compile(r"^versions/(\d{6,})-([0-9a-f]{12})$")
_CHANNEL = re.compile(r"^[a-z][a-z0-9_-]{0,63}$")
MAX_FILES = 256


class ManifestError(ValueError):
    """A manifest or pointer that is malformed or unsafe; the message names the field."""


def canonical_json(obj: Any) -> bytes:
    """The one byte form that is signed: sorted keys, no spaces, ASCII, no NaN."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False).encode(
        "ascii"
    )


def pretty_json(obj: Any) -> bytes:
    """Readable, deterministic JSON for files people open (manifest.json is signed as stored)."""
    return (json.dumps(obj, sort_keys=True, indent=2, ensure_ascii=True, allow_nan=False) + "\n").encode(
        "ascii"
    )


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def format_time(t: datetime) -> str:
    return t.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: object, where: str) -> datetime:
    if not isinstance(value, str):
        raise ManifestError(f"{where}: expected a UTC timestamp string, got {value!r}")
    try:
        return datetime.strptime(value, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=timezone.utc)
    except ValueError:
        raise ManifestError(f"{where}: {value!r} is not a timestamp like 2026-01-31T12:00:00Z") from None


def check_file_name(name: object, where: str = "manifest.json files[].path") -> str:
    """Allow only plain relative names (a/b.txt): no '..', absolute paths, backslashes or dotfiles."""
    if not isinstance(name, str) or not name:
        raise ManifestError(f"{where}: file name must be a non-empty string, got {name!r}")
    parts = name.split("/")
    if len(name) > 512 or any(not _SAFE_PART.match(p) for p in parts):
        raise ManifestError(f"{where}: unsafe file name {name!r} (path traversal or odd characters)")
    return name


def check_channel(name: str) -> str:
    if not isinstance(name, str) or not _CHANNEL.match(name):
        raise ManifestError(f"channel {name!r}: use lower-case letters, digits, '-' or '_'")
    return name


def version_dir(version: int, digest: str) -> str:
    return f"versions/{version:06d}-{digest[:12]}"


def check_version_dir(path: object, version: int, digest: str, where: str) -> str:
    """A pointer's folder must be exactly the content-addressed folder of (version, digest)."""
    if not isinstance(path, str) or not _VERSION_DIR.match(path):
        raise ManifestError(f"{where}: folder {path!r} is not versions/<number>-<sha12>")
    if path != version_dir(version, digest):
        raise ManifestError(f"{where}: folder {path!r} does not match version {version} / {digest[:12]}")
    return path


@dataclass(frozen=True)
class FileEntry:
    path: str
    sha256: str
    size: int


@dataclass(frozen=True)
class Manifest:
    """A parsed, structurally valid manifest (hashes and signature are checked elsewhere)."""

    version: int
    created_at: datetime
    expires_at: datetime | None
    files: tuple[FileEntry, ...]
    raw: dict = field(repr=False)

    @property
    def lineage(self) -> dict:
        return self.raw.get("lineage", {})

    @property
    def metrics(self) -> dict:
        return self.raw.get("metrics", {})

    @property
    def policy(self) -> dict:
        return self.raw.get("policy", {})

    @property
    def policy_format(self) -> dict:
        """{"version", "portable", "not_portable", "conformance"}; empty before format 3."""
        value = self.raw.get("policy_format")
        return value if isinstance(value, dict) else {}

    def expired(self, now: datetime) -> bool:
        return self.expires_at is not None and now >= self.expires_at


def parse_manifest(data: bytes, where: str = MANIFEST_NAME) -> Manifest:
    """Parse and structurally validate manifest bytes, naming the first bad field."""
    try:
        raw = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ManifestError(f"{where}: not valid JSON (truncated or corrupt): {exc}") from None
    if not isinstance(raw, dict):
        raise ManifestError(f"{where}: expected a JSON object")
    if raw.get("format") != FORMAT:
        raise ManifestError(f"{where}: format {raw.get('format')!r} is not {FORMAT!r}")
    version = raw.get("version")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise ManifestError(f"{where}: version must be a positive integer, got {version!r}")
    files = raw.get("files")
    if not isinstance(files, list) or not files or len(files) > MAX_FILES:
        raise ManifestError(f"{where}: files must be a non-empty list of at most {MAX_FILES}")
    entries, seen = [], set()
    for i, f in enumerate(files):
        fw = f"{where}: files[{i}]"
        if not isinstance(f, dict):
            raise ManifestError(f"{fw}: expected an object")
        name = check_file_name(f.get("path"), f"{fw}.path")
        digest, size = f.get("sha256"), f.get("size")
        if name in seen or name in RESERVED_NAMES:
            raise ManifestError(f"{fw}.path: {name!r} is duplicated or reserved")
        if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
            raise ManifestError(f"{fw}.sha256: expected 64 hex digits")
        if not isinstance(size, int) or size < 0:
            raise ManifestError(f"{fw}.size: expected a non-negative integer")
        seen.add(name)
        entries.append(FileEntry(name, digest, size))
    expires = raw.get("expires_at")
    return Manifest(
        version=version,
        created_at=parse_time(raw.get("created_at"), f"{where}: created_at"),
        expires_at=None if expires is None else parse_time(expires, f"{where}: expires_at"),
        files=tuple(entries),
        raw=raw,
    )


@dataclass(frozen=True)
class Pointer:
    """Where a channel points, with its move counter and the stack of versions it held."""

    channel: str
    seq: int
    version: int
    path: str
    digest: str
    action: str
    updated_at: str
    stack: tuple[dict, ...] = ()
    history: tuple[dict, ...] = ()

    def payload(self) -> dict:
        return {
            "format": POINTER_FORMAT,
            "channel": self.channel,
            "seq": self.seq,
            "version": self.version,
            "path": self.path,
            "digest": self.digest,
            "action": self.action,
            "updated_at": self.updated_at,
            "stack": list(self.stack),
            "history": list(self.history),
        }


def parse_pointer(payload: object, where: str) -> Pointer:
    """Validate a pointer payload (the signed part of a channel file)."""
    if not isinstance(payload, dict) or payload.get("format") != POINTER_FORMAT:
        raise ManifestError(f"{where}: not a {POINTER_FORMAT} channel pointer")
    ints = {k: payload.get(k) for k in ("seq", "version")}
    for k, v in ints.items():
        if not isinstance(v, int) or isinstance(v, bool) or v < 1:
            raise ManifestError(f"{where}: {k} must be a positive integer, got {v!r}")
    digest = payload.get("digest")
    if not isinstance(digest, str) or not re.fullmatch(r"[0-9a-f]{64}", digest):
        raise ManifestError(f"{where}: digest must be 64 hex digits")
    action = payload.get("action")
    if action not in ("publish", "promote", "rollback"):
        raise ManifestError(f"{where}: action {action!r} is not publish, promote or rollback")
    path = check_version_dir(payload.get("path"), ints["version"], digest, f"{where}: path")
    return Pointer(
        channel=check_channel(str(payload.get("channel"))),
        seq=ints["seq"],
        version=ints["version"],
        path=path,
        digest=digest,
        action=action,
        updated_at=str(payload.get("updated_at")),
        stack=tuple(payload.get("stack") or ()),
        history=tuple(payload.get("history") or ()),
    )
