"""The policy registry: publish immutable signed versions, move channels, promote, roll back.

Layout (the same keys in a folder or a bucket):
    versions/000007-<sha12>/   policy files, manifest.sig, manifest.json (written in that order)
    index/000007.json          the commit point: a version exists once its index entry does
    channels/<name>.json       {"payload": pointer, "signature": ...}, moved with a conditional write

A version number is taken with a conditional create of its index entry, so two publishers can
never both get number 7; a channel moves with a compare-and-swap on its ETag, so two promoters
cannot both win. Both retry or fail with a clear message instead. Each publish writes into a
folder no other publish can name (its manifest holds a random `publish_id`), so the loser of a
race deletes only its own files, never the winner's.

Everything is signed: without a signing key (argument or `$ROUTEOPT_SIGNING_KEY`) publishing and
moving channels fail unless `allow_unsigned=True`, since gateways refuse unsigned policies.
"""

from __future__ import annotations

import json
import os
import secrets
import tempfile
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any, Protocol

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from routeopt.artifacts.publish.manifest_writer import build_manifest
from routeopt.artifacts.publish.signing_keys import ensure_signing_key, resolve_signing_key, sign
from routeopt.artifacts.serving.backends import Backend, NotFound, RegistryError, exists, open_backend
from routeopt.artifacts.serving.manifest import (
    MANIFEST_NAME,
    SIGNATURE_NAME,
    Pointer,
    canonical_json,
    check_channel,
    check_file_name,
    format_time,
    parse_manifest,
    pretty_json,
    sha256_hex,
    version_dir,
)
from routeopt.artifacts.serving.signatures import key_id, public_key_path
from routeopt.artifacts.serving.verify import VerificationError, read_pointer, verify_version

DEFAULT_TTL = timedelta(days=30)
MAX_STACK, MAX_HISTORY, MAX_ATTEMPTS = 50, 200, 20


class SavablePolicy(Protocol):
    candidates: list[str]

    def save(self, folder: Path) -> list[str]: ...
    def describe(self) -> dict: ...


@dataclass(frozen=True)
class PublishedVersion:
    version: int
    path: str
    uri: str
    digest: str
    signed: bool
    channel: str | None
    key_id: str | None = None

    @property
    def location(self) -> str:
        """Where the version lives (same as `uri`): a folder path or an s3:// URL."""
        return self.uri


def _backend(registry: Backend | str | os.PathLike) -> Backend:
    return registry if hasattr(registry, "put_if_match") else open_backend(registry)  # type: ignore[return-value]


def _signing_key(
    key: Ed25519PrivateKey | str | os.PathLike | None, allow_unsigned: bool
) -> Ed25519PrivateKey | None:
    found = key if isinstance(key, Ed25519PrivateKey) else resolve_signing_key(key)
    if found is None and not allow_unsigned:
        raise RegistryError(
            "no signing key: give one (--signing-key, publishing.signing_key or "
            "$ROUTEOPT_SIGNING_KEY), or allow unsigned policies explicitly; "
            "gateways refuse unsigned policies unless told to accept them"
        )
    return found


def _policy_files(policy: SavablePolicy) -> dict[str, bytes]:
    with tempfile.TemporaryDirectory(prefix="routeopt-publish-") as tmp:
        names = [check_file_name(n, f"{type(policy).__name__}.save() file") for n in policy.save(Path(tmp))]
        return {name: (Path(tmp) / name).read_bytes() for name in names}


def version_numbers(registry: Backend | str | os.PathLike) -> list[int]:
    backend, nums = _backend(registry), []
    for key in backend.list("index/"):
        stem = key.rsplit("/", 1)[-1].removesuffix(".json")
        if stem.isdigit():
            nums.append(int(stem))
    return sorted(nums)


def publish(
    policy: SavablePolicy,
    registry: Backend | str | os.PathLike,
    *,
    lineage: dict,
    metrics: dict,
    channel: str | None = "latest",
    signing_key: Ed25519PrivateKey | str | os.PathLike | None = None,
    allow_unsigned: bool = False,
    expires_in: timedelta | None = DEFAULT_TTL,
    now: datetime | None = None,
) -> PublishedVersion:
    """Write `policy` as the next version, signed with `signing_key` (else `$ROUTEOPT_SIGNING_KEY`;
    with neither, only `allow_unsigned=True` publishes, unsigned)."""
    backend, key = _backend(registry), _signing_key(signing_key, allow_unsigned)
    files = _policy_files(policy)
    created, publish_id = now or datetime.now(timezone.utc), secrets.token_hex(16)
    for _ in range(MAX_ATTEMPTS):
        number = (version_numbers(backend) or [0])[-1] + 1
        manifest = build_manifest(
            version=number,
            files=files,
            lineage=lineage,
            metrics=metrics,
            policy=policy.describe(),
            created_at=created,
            expires_in=expires_in,
            publish_id=publish_id,
            policy_format=getattr(policy, "format_info", None),
        )
        digest = sha256_hex(manifest)
        folder = version_dir(number, digest)
        written = [f"{folder}/{name}" for name in files] + [f"{folder}/{MANIFEST_NAME}"]
        for name, blob in files.items():
            backend.put(f"{folder}/{name}", blob)
        if key is not None:
            backend.put(f"{folder}/{SIGNATURE_NAME}", pretty_json(sign(manifest, key).to_dict()))
            written.append(f"{folder}/{SIGNATURE_NAME}")
        backend.put(f"{folder}/{MANIFEST_NAME}", manifest)
        entry = {"version": number, "path": folder, "digest": digest, "created_at": format_time(created)}
        if backend.put_if_absent(f"index/{number:06d}.json", pretty_json(entry)):
            break
        backend.delete(written)  # another publisher took this number (its folder is not ours)
    else:
        raise RegistryError(f"{backend.location}: could not take a version number after {MAX_ATTEMPTS} tries")
    if channel is not None:
        move_channel(
            backend,
            channel,
            number,
            action="publish",
            signing_key=key,
            only_forward=True,
            allow_unsigned=allow_unsigned,
        )
    return PublishedVersion(
        number,
        folder,
        f"{backend.location.rstrip('/')}/{folder}",
        digest,
        key is not None,
        channel,
        key_id(key.public_key()) if key else None,
    )


def newest_signer(registry: Backend | str | os.PathLike) -> str | None:
    """The key id that signed the newest version, or None (no versions, or unsigned)."""
    backend = _backend(registry)
    numbers = version_numbers(backend)
    if not numbers:
        return None
    try:
        raw = backend.get(f"{version_entry(backend, numbers[-1])['path']}/{SIGNATURE_NAME}")[0]
        return str(json.loads(raw)["key_id"])
    except NotFound:
        return None
    except (ValueError, KeyError, TypeError):
        raise RegistryError(
            f"{backend.location}: version {numbers[-1]}: {SIGNATURE_NAME} is not a signature"
        ) from None


def registry_signing_key(
    registry: Backend | str | os.PathLike, path: str | os.PathLike
) -> tuple[Ed25519PrivateKey, bool]:
    """The key at `path` for publishing to `registry`, created on first use (True when created).

    A key created now for a registry whose newest version another key signed would sign what no
    gateway trusts: the key was lost, or lives on storage that does not outlast a run. Then the
    new key is removed again and this raises, instead of publishing policies gateways refuse.
    """
    key, created = ensure_signing_key(path)
    previous = newest_signer(registry) if created else None
    if previous is not None and previous != key_id(key.public_key()):
        for p in (Path(path), public_key_path(path)):
            p.unlink(missing_ok=True)
        raise RegistryError(
            f"{path}: no signing key was there, but version {version_numbers(registry)[-1]} in "
            f"{_backend(registry).location} is signed by key {previous}; gateways would refuse "
            f"policies signed by a new key. Restore that key at {path} or point "
            f"publishing.signing_key at it (a key must outlast each run: on Kubernetes, mount it)."
        )
    return key, created


def version_entry(registry: Backend | str | os.PathLike, version: int) -> dict:
    backend = _backend(registry)
    try:
        return json.loads(backend.get(f"index/{version:06d}.json")[0])
    except NotFound:
        have = version_numbers(backend)
        raise RegistryError(f"{backend.location}: no version {version}; versions are {have}") from None


def current_pointer(registry: Backend | str | os.PathLike, channel: str) -> tuple[Pointer | None, str | None]:
    """The channel's pointer (unchecked signature: the writer side) and its ETag, or (None, None)."""
    backend = _backend(registry)
    try:
        got = read_pointer(backend, channel, None)
    except VerificationError as exc:
        if "no such channel" in str(exc):
            return None, None
        raise RegistryError(str(exc)) from None
    assert got is not None
    return got.pointer, got.etag


def _next_pointer(
    current: Pointer | None, channel: str, entry: dict, action: str, pop: bool = False
) -> Pointer:
    ref = {"version": entry["version"], "path": entry["path"], "digest": entry["digest"]}
    stack = list(current.stack) if current else []
    if pop:
        stack = stack[:-1]
    else:
        stack = (stack + [ref])[-MAX_STACK:]
    now = format_time(datetime.now(timezone.utc))
    seq = (current.seq if current else 0) + 1
    history = (list(current.history) if current else []) + [
        {"seq": seq, "version": entry["version"], "action": action, "at": now}
    ]
    return Pointer(
        channel=channel,
        seq=seq,
        version=entry["version"],
        path=entry["path"],
        digest=entry["digest"],
        action=action,
        updated_at=now,
        stack=tuple(stack),
        history=tuple(history[-MAX_HISTORY:]),
    )


def _write_pointer(
    backend: Backend, pointer: Pointer, etag: str | None, key: Ed25519PrivateKey | None
) -> bool:
    payload = pointer.payload()
    signature = sign(canonical_json(payload), key).to_dict() if key is not None else None
    doc = pretty_json({"payload": payload, "signature": signature})
    return backend.put_if_match(f"channels/{pointer.channel}.json", doc, etag)


def move_channel(
    backend: Backend | str | os.PathLike,
    channel: str,
    version: int,
    *,
    action: str = "promote",
    signing_key: Ed25519PrivateKey | str | os.PathLike | None = None,
    only_forward: bool = False,
    allow_downgrade: bool = False,
    allow_unsigned: bool = False,
) -> Pointer | None:
    """Point `channel` at `version` with a compare-and-swap; refuse going backwards unless allowed.

    A deliberate downgrade is recorded as a signed 'rollback' so gateways accept it.
    With `only_forward` (publishing to `latest`) an older version is silently not moved.
    """
    backend, key = _backend(backend), _signing_key(signing_key, allow_unsigned)
    check_channel(channel)
    entry = version_entry(backend, version)
    if action != "publish":
        _check_intact(backend, entry)
    for _ in range(MAX_ATTEMPTS):
        current, etag = current_pointer(backend, channel)
        this_action = action
        if current is not None and version <= current.version:
            if only_forward or version == current.version:
                return current
            if not allow_downgrade:
                raise RegistryError(
                    f"channel {channel} is at version {current.version}; moving it back "
                    f"to {version} needs --allow-downgrade (or use rollback)"
                )
            this_action = "rollback"
        pointer = _next_pointer(current, channel, entry, this_action)
        if _write_pointer(backend, pointer, etag, key):
            return pointer
    raise RegistryError(f"{backend.location}: channel {channel} kept changing; try again")


def _check_intact(backend: Backend, entry: dict) -> None:
    """Refuse to point a channel at a version gateways would reject (hashes, expiry)."""
    try:
        verify_version(backend, entry["path"], None, expected_digest=entry["digest"])
    except VerificationError as exc:
        raise RegistryError(f"version {entry['version']} cannot be served: {exc}") from None


def rollback(
    backend: Backend | str | os.PathLike,
    channel: str,
    *,
    signing_key: Ed25519PrivateKey | str | os.PathLike | None = None,
    allow_unsigned: bool = False,
) -> Pointer:
    """Move `channel` back to the version it held before the current one (signed 'rollback')."""
    backend, key = _backend(backend), _signing_key(signing_key, allow_unsigned)
    current, etag = current_pointer(backend, channel)
    if current is None or len(current.stack) < 2:
        raise RegistryError(f"channel {channel}: no earlier version to roll back to")
    entry = dict(current.stack[-2])
    _check_intact(backend, entry)
    pointer = _next_pointer(current, channel, entry, "rollback", pop=True)
    if not _write_pointer(backend, pointer, etag, key):
        raise RegistryError(f"channel {channel} changed while rolling back; check `policies list` and retry")
    return pointer


def list_channels(backend: Backend | str | os.PathLike) -> dict[str, Pointer]:
    backend = _backend(backend)
    out = {}
    for key in backend.list("channels/"):
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        pointer, _ = current_pointer(backend, name)
        if pointer is not None:
            out[name] = pointer
    return out


def list_versions(registry: Backend | str | os.PathLike) -> list[dict]:
    """One row per version: number, created_at, digest, channels on it, headline metrics."""
    backend = _backend(registry)
    channels = list_channels(backend)
    rows = []
    for number in version_numbers(backend):
        entry = version_entry(backend, number)
        manifest = parse_manifest(backend.get(f"{entry['path']}/{MANIFEST_NAME}")[0])
        rows.append(
            {
                **entry,
                "expires_at": manifest.raw.get("expires_at"),
                "signed": exists(backend, f"{entry['path']}/{SIGNATURE_NAME}"),
                "channels": sorted(c for c, p in channels.items() if p.version == number),
                "metrics": headline(manifest.metrics),
            }
        )
    return rows


def show(registry: Backend | str | os.PathLike, version: int) -> dict:
    """The full manifest of one version."""
    backend = _backend(registry)
    entry = version_entry(backend, version)
    return json.loads(backend.get(f"{entry['path']}/{MANIFEST_NAME}")[0])


def _flatten(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for k, v in obj.items():
            out.update(_flatten(v, f"{prefix}.{k}" if prefix else str(k)))
        return out
    return {prefix: obj}


def diff(registry: Backend | str | os.PathLike, a: int, b: int) -> dict[str, dict]:
    """What changed from version a to b: candidates, headline metrics, the policy's decision
    parameters (rule, thresholds/lambda table, target), all metrics and lineage."""
    ma, mb = show(registry, a), show(registry, b)
    pa, pb = ma.get("policy", {}), mb.get("policy", {})
    ca, cb = set(pa.get("candidates") or []), set(pb.get("candidates") or [])
    out: dict[str, dict] = {"candidates": {"added": sorted(cb - ca), "removed": sorted(ca - cb)}}
    ha, hb = headline(ma.get("metrics", {})), headline(mb.get("metrics", {}))
    out["headline"] = {k: [ha[k], hb[k]] for k in ha if ha[k] != hb[k]}
    sections = {
        "policy": (
            {k: v for k, v in pa.items() if k != "metrics"},
            {k: v for k, v in pb.items() if k != "metrics"},
        ),
        "metrics": (ma.get("metrics", {}), mb.get("metrics", {})),
        "lineage": (ma.get("lineage", {}), mb.get("lineage", {})),
    }
    for section, (old, new) in sections.items():
        fa, fb = _flatten(old), _flatten(new)
        out[section] = {
            k: [fa.get(k), fb.get(k)] for k in sorted(set(fa) | set(fb)) if fa.get(k) != fb.get(k)
        }
    return out


_PASS_KEYS = ("pass_rate", "router_pass_rate", "quality")
_COST_KEYS = ("cost_usd", "router_cost_usd", "cost", "mean_cost_usd")


def _scopes(metrics: dict) -> list[dict]:
    """Where training reports the router's own figures: top level, `router`, or
    `holdout.router_at_target` (routeopt.router_training.train)."""
    holdout = metrics.get("holdout")
    found = [
        metrics,
        metrics.get("router"),
        holdout.get("router_at_target") if isinstance(holdout, dict) else None,
    ]
    return [s for s in found if isinstance(s, dict)]


def _metric(metrics: dict, names: tuple[str, ...]) -> float | None:
    for scope in _scopes(metrics):
        for name in names:
            value = scope.get(name)
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
    return None


def headline(metrics: dict) -> dict:
    return {"pass_rate": _metric(metrics, _PASS_KEYS), "cost_usd": _metric(metrics, _COST_KEYS)}
