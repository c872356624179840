"""The gateway side: load a verified routing policy and keep it fresh without ever serving a bad one.

Imports stay small on purpose (numpy, lightgbm via the policy, `cryptography`, the standard
library): a gateway embeds this module, so nothing here may pull in prefect, duckdb, pandas,
sklearn or torch, and boto3 is imported only if an `s3://` registry is opened.

    router = load("https://registry.internal:8600", public_key="public_key.pem", refresh_s=30)
    router.route("Reverse the word 'stone'", suite="reverse").model

A refresher thread polls the channel (a cheap conditional GET), checks the pointer's signature
and order, the manifest's signature, digest and expiry and every file's hash, then swaps the
policy in one reference assignment. On any failure it keeps serving the last good policy and
reports why through `status()`, the `on_event` callback and the `routeopt.runtime` logger.
"""

from __future__ import annotations

import logging
import re
import tempfile
import threading
import urllib.parse
from dataclasses import dataclass, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from artifacts.backends import Backend, LocalBackend, RegistryError, exists, open_backend
from artifacts.manifest import MANIFEST_NAME, Manifest, Pointer, format_time
from artifacts.signing import trusted_keys
from artifacts.verify import (
    VerificationError, VerifiedVersion, check_order, materialize, read_pointer, verify_version,
)

log = logging.getLogger("routeopt.runtime")
_VERSION_IN_URL = re.compile(r"^(.*?)/?(versions/\d{6,}-[0-9a-f]{12})/?$")
EventCallback = Callable[[str, str], None]
PolicyLoader = Callable[[Path], Any]


class PolicyLoadError(RuntimeError):
    """No policy could be loaded at all (there is no last good one to fall back to)."""


@dataclass(frozen=True)
class Decision:
    """The policy's choice plus which policy version made it (for logs and audits)."""

    model: str
    fallbacks: tuple[str, ...]
    pass_probabilities: dict[str, float]
    expected_cost_usd: dict[str, float]
    policy_version: int
    propensity: float = 1.0  # probability that this request gets this model (a mixed knob point < 1)


@dataclass(frozen=True)
class _Active:
    policy: Any
    version: int
    digest: str
    signed: bool
    key_id: str | None
    manifest: Manifest
    pointer: Pointer | None
    loaded_at: datetime


@dataclass(frozen=True)
class RouterStatus:
    source: str
    channel: str | None
    version: int
    digest: str
    signed: bool
    expires_at: str | None
    expired: bool
    loaded_at: str
    last_check_at: str | None
    last_error: str | None
    consecutive_failures: int
    checks: int
    swaps: int


def _default_loader(folder: Path) -> Any:
    from router_training.policy import RoutingPolicy

    return RoutingPolicy.load(folder)


class Router:
    """Routes requests with the current verified policy; `refresh()` polls once, `start()` keeps polling."""

    def __init__(self, backend: Backend, *, prefix: str = "", channel: str | None = None,
                 public_key: Any = None, on_event: EventCallback | None = None,
                 policy_loader: PolicyLoader | None = None) -> None:
        self._backend, self._prefix, self._channel = backend, prefix, channel
        self._key = trusted_keys(public_key)
        self._on_event, self._loader = on_event, policy_loader or _default_loader
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None
        self._last_check: datetime | None = None
        self._last_error: str | None = None
        self._failures = self._checks = self._swaps = 0
        try:
            self._active = self._initial()
        except (VerificationError, RegistryError) as exc:
            raise PolicyLoadError(f"cannot load a policy: {exc}") from None

    def route(self, prompt: str, suite: str | None = None,
              quality_target: float | None = None) -> Decision:
        active = self._active  # one read: a concurrent swap never mixes two policies
        d = active.policy.decide(prompt, suite=suite, quality_target=quality_target)
        return Decision(d.model, tuple(d.fallbacks), d.pass_probabilities, d.expected_cost_usd,
                        active.version, getattr(d, "propensity", 1.0))

    @property
    def policy(self) -> Any:
        return self._active.policy

    @property
    def version(self) -> int:
        return self._active.version

    def _build(self, verified: VerifiedVersion, pointer: Pointer | None) -> _Active:
        """Load the checked files (the loader must read eagerly: the folder is then deleted) and
        make one trial decision, so a signed but broken policy never replaces a working one."""
        with tempfile.TemporaryDirectory(prefix="routeopt-policy-") as tmp:
            try:
                policy = self._loader(materialize(verified, Path(tmp)))
                trial = policy.decide("routeopt load check: 2 + 2 = ?")
                if trial.model not in policy.candidates:
                    raise ValueError(f"chose {trial.model!r}, which is not a candidate")
            except VerificationError:
                raise
            except Exception as exc:  # a verified but unusable policy must not crash the gateway
                raise VerificationError(f"{verified.location}: policy does not load or decide: {exc}") from None
        return _Active(policy, verified.version, verified.digest, verified.signed, verified.key_id,
                       verified.manifest, pointer, datetime.now(timezone.utc))

    def _initial(self) -> _Active:
        if self._channel is None:
            return self._build(verify_version(self._backend, self._prefix, self._key), None)
        got = read_pointer(self._backend, self._channel, self._key)
        assert got is not None
        verified = verify_version(self._backend, got.pointer.path, self._key,
                                  expected_digest=got.pointer.digest)
        self._etag = got.etag
        return self._build(verified, got.pointer)

    def _poll(self) -> bool:
        if self._channel is None:
            return False  # a version folder is immutable: nothing to refresh
        got = read_pointer(self._backend, self._channel, self._key, etag=self._etag)
        if got is None:
            return False
        pointer, current = got.pointer, self._active
        if pointer.version == current.version:
            if pointer.digest != current.digest:
                raise VerificationError(f"channel {self._channel}: version {pointer.version} now has "
                                        f"digest {pointer.digest[:12]}, served {current.digest[:12]} (rewritten)")
            check_order(pointer, current.pointer, current.version)
            self._active = replace(current, pointer=pointer)
            self._etag = got.etag
            return False
        check_order(pointer, current.pointer, current.version)
        verified = verify_version(self._backend, pointer.path, self._key, expected_digest=pointer.digest)
        self._active = self._build(verified, pointer)
        self._etag = got.etag
        return True

    def refresh(self) -> bool:
        """Poll once; True if a new policy was swapped in. Failures are recorded, never raised."""
        with self._lock:
            self._checks += 1
            self._last_check = datetime.now(timezone.utc)
            try:
                swapped = self._poll()
            except (VerificationError, RegistryError, OSError) as exc:
                self._failures += 1
                self._last_error = str(exc)
                kind = "unreachable" if isinstance(exc, (RegistryError, OSError)) else "rejected"
                log.warning("policy refresh %s, still serving version %d: %s",
                            kind, self._active.version, exc)
                self._emit(kind, str(exc))
                return False
            self._failures, self._last_error = 0, None
            if swapped:
                self._swaps += 1
                log.info("policy version %d now serving", self._active.version)
                self._emit("swapped", f"version {self._active.version}")
            elif self._active.manifest.expired(datetime.now(timezone.utc)):
                message = (f"serving version {self._active.version}, which expired at "
                           f"{self._active.manifest.raw.get('expires_at')}; no newer valid policy")
                log.warning(message)
                self._emit("expired", message)
            return swapped

    def _emit(self, kind: str, message: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(kind, message)
            except Exception:  # a broken callback must not stop the refresher
                log.exception("on_event callback failed")

    def start(self, interval_s: float) -> "Router":
        """Poll every `interval_s` seconds in a daemon thread until `close()`."""
        if self._thread is None:
            def loop() -> None:
                while not self._stop.wait(interval_s):
                    self.refresh()

            self._thread = threading.Thread(target=loop, name="routeopt-policy-refresher", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def status(self) -> RouterStatus:
        a = self._active
        return RouterStatus(
            source=self._backend.location, channel=self._channel, version=a.version,
            digest=a.digest, signed=a.signed, expires_at=a.manifest.raw.get("expires_at"),
            expired=a.manifest.expired(datetime.now(timezone.utc)), loaded_at=format_time(a.loaded_at),
            last_check_at=format_time(self._last_check) if self._last_check else None,
            last_error=self._last_error, consecutive_failures=self._failures,
            checks=self._checks, swaps=self._swaps)


def _default_channel(backend: Backend) -> str:
    return "champion" if exists(backend, "channels/champion.json") else "latest"


def resolve(source: str | Path) -> tuple[Backend, str, bool]:
    """(backend, prefix, is_version): a version folder/URL, or a registry root."""
    text = str(source)
    if text.startswith(("http://", "https://", "s3://")):
        parsed = urllib.parse.urlsplit(text)
        match = _VERSION_IN_URL.match(parsed.path)
        if match:
            root = urllib.parse.urlunsplit(parsed._replace(path=match.group(1) or "/"))
            return open_backend(root), match.group(2), True
        return open_backend(text), "", False
    path = Path(text)
    if (path / MANIFEST_NAME).is_file():
        name = path.resolve().name
        if re.fullmatch(r"\d{6,}-[0-9a-f]{12}", name) and path.resolve().parent.name == "versions":
            return LocalBackend(path.resolve().parent.parent), f"versions/{name}", True
        return LocalBackend(path), "", True
    if not path.is_dir():
        raise PolicyLoadError(f"{path}: no such policy folder or registry")
    return LocalBackend(path), "", False


def load(source: str | Path, public_key: Any = None, *, channel: str | None = None,
         refresh_s: float | None = None, on_event: EventCallback | None = None,
         policy_loader: PolicyLoader | None = None) -> Router:
    """Load a policy from a version folder, a registry folder/bucket/URL (+ channel), verified.

    `public_key` (a PEM path, bytes or key, or a list of them while rotating keys; default
    `$ROUTEOPT_PUBLIC_KEY`) makes signatures mandatory. `channel` defaults to `champion` if the registry has one, else `latest`. With
    `refresh_s` a background thread keeps the policy fresh.
    """
    try:
        backend, prefix, is_version = resolve(source)
        if not is_version and channel is None:
            channel = _default_channel(backend)
    except RegistryError as exc:
        raise PolicyLoadError(f"cannot load a policy: {exc}") from None
    router = Router(backend, prefix=prefix, channel=None if is_version else channel,
                    public_key=public_key, on_event=on_event, policy_loader=policy_loader)
    if refresh_s:
        router.start(refresh_s)
    return router


def check(source: str | Path, public_key: Any = None, *, channel: str | None = None,
          policy_loader: PolicyLoader | None = None) -> dict:
    """What `routeopt policies verify` prints: load exactly as a gateway would, then describe it."""
    router = load(source, public_key, channel=channel, policy_loader=policy_loader)
    s, key_id = router.status(), router._active.key_id
    if s.signed:
        signature = f"valid (key {key_id})"
    else:
        signature = f"present, NOT checked (no public key given; key {key_id})" if key_id else "unsigned"
    return {"source": s.source, "channel": s.channel, "version": s.version, "digest": s.digest,
            "signature": signature,
            "expires_at": s.expires_at,
            "files": [f.path for f in router._active.manifest.files]}
