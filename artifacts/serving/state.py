"""What a gateway remembers across restarts: the newest channel move it accepted.

A signed pointer is only as fresh as the registry that serves it: whoever can write the registry
(or answer in its place) can replay an older pointer that still carries a valid signature. The
refresher refuses that within one process; this file keeps the refusal across restarts. There is
one small JSON file per (registry, channel) in a folder the gateway owns, written atomically and
only ever moved forward, under a lock, so gateways sharing a host never lower it.

The folder is `load(..., state_dir=...)`, else `$ROUTEOPT_STATE_DIR`, else
`$XDG_STATE_HOME/routeopt/gateway` (by default `~/.local/state/routeopt/gateway`).
Standard library only: the gateway imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
from pathlib import Path
from typing import Iterator

from routeopt.artifacts.serving.verify import Seen, VerificationError
from routeopt.common.io import atomic_write

STATE_DIR_ENV = "ROUTEOPT_STATE_DIR"


def default_state_dir() -> Path:
    env = os.environ.get(STATE_DIR_ENV)
    if env:
        return Path(env)
    base = os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state"
    return Path(base) / "routeopt" / "gateway"


def registry_identity(location: str) -> str:
    """One name per registry, whatever the working directory: URLs as given, folders absolute."""
    return location.rstrip("/") if "://" in location else str(Path(location).resolve())


class SeenFile:
    """The newest accepted move of one channel of one registry, kept in `folder`."""

    def __init__(self, folder: str | os.PathLike, registry: str, channel: str) -> None:
        self.registry, self.channel = registry_identity(registry), channel
        name = hashlib.sha256(f"{self.registry}\n{channel}".encode()).hexdigest()[:24]
        self.path = Path(folder) / f"{name}.json"

    def _unreadable(self, why: str) -> VerificationError:
        return VerificationError(
            f"{self.path}: gateway state {why}; it records the newest policy this host accepted from "
            f"{self.registry} (channel {self.channel}). Delete it to trust the registry's current "
            f"pointer again."
        )

    def read(self) -> Seen | None:
        try:
            doc = json.loads(self.path.read_bytes())
        except (FileNotFoundError, NotADirectoryError):  # nothing recorded (yet) in that folder
            return None
        except (OSError, ValueError) as exc:
            raise self._unreadable(f"cannot be read ({exc})") from None
        if not isinstance(doc, dict) or (doc.get("registry"), doc.get("channel")) != (
            self.registry,
            self.channel,
        ):
            raise self._unreadable("belongs to another registry or channel")
        seq, version, digest = doc.get("seq"), doc.get("version"), doc.get("digest")
        if not (isinstance(seq, int) and isinstance(version, int) and isinstance(digest, str)):
            raise self._unreadable("is malformed")
        return Seen(seq, version, digest)

    @contextlib.contextmanager
    def _locked(self) -> Iterator[None]:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(self.path.parent / ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock.fileno(), fcntl.LOCK_UN)

    def record(self, seen: Seen) -> Seen:
        """Keep `seen` unless the file already holds a newer move (another gateway on this host
        got there first); returns the newest move the file now holds."""
        with self._locked():
            current = self.read()
            if current is not None and current.seq >= seen.seq:
                return current
            doc = {
                "registry": self.registry,
                "channel": self.channel,
                "seq": seen.seq,
                "version": seen.version,
                "digest": seen.digest,
            }
            atomic_write(self.path, json.dumps(doc, indent=1, sort_keys=True) + "\n")
            return seen
