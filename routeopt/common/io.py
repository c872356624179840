"""Writing results safely: atomic files and JSON-safe values.

An atomic write goes to a temporary file beside the target, is fsynced, renamed over the target,
and the folder is fsynced, so readers see the old file or the new one, never half of one, even
after a crash. `jsonable` turns metrics that hold numpy scalars, tuples, NaN or datetimes into
plain JSON values. Standard library only, so every layer (the gateway runtime included) can use it.
"""

from __future__ import annotations

import contextlib
import math
import os
import tempfile
from collections.abc import Mapping
from datetime import datetime, timezone
from pathlib import Path
from typing import IO, Any, Iterator


@contextlib.contextmanager
def atomic_writer(
    path: str | os.PathLike[str], mode: str = "wb", permissions: int | None = None
) -> Iterator[IO[Any]]:
    """Open a temporary file for writing; on success it replaces `path`, on error it vanishes.

    The file is private to its owner (0600) unless `permissions` says otherwise (0o644 for files
    that readers running as other users need, such as published policies)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, encoding=None if "b" in mode else "utf-8") as fh:
            yield fh
            fh.flush()
            if permissions is not None:
                os.fchmod(fh.fileno(), permissions)
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def make_dirs(folder: str | os.PathLike[str], mode: int = 0o755) -> Path:
    """Create `folder` and its missing parents with exactly `mode`, whatever the umask (a umask of
    077 would otherwise hide published files from readers running as other users)."""
    folder = Path(folder)
    missing = []
    probe = folder
    while not probe.exists():
        missing.append(probe)
        probe = probe.parent
    for d in reversed(missing):
        with contextlib.suppress(FileExistsError):  # another process made it meanwhile
            d.mkdir()
            os.chmod(d, mode)
    return folder


def atomic_write(path: str | os.PathLike[str], data: bytes | str, permissions: int | None = None) -> Path:
    """Write bytes or text to `path` atomically (mode 0600 unless `permissions`); returns the path."""
    with atomic_writer(path, "wb" if isinstance(data, bytes) else "w", permissions) as fh:
        fh.write(data)
    return Path(path)


def jsonable(obj: Any) -> Any:
    """Plain JSON values: numpy scalars and arrays become numbers and lists, tuples and sets
    lists, NaN and infinities None, datetimes UTC ISO-8601 ('...Z'), anything else its str()."""
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if isinstance(obj, bool) or obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, int):
        return int(obj)
    if hasattr(obj, "item") and callable(obj.item):  # numpy scalars (and 0-d arrays)
        try:
            return jsonable(obj.item())
        except (TypeError, ValueError):
            pass
    if hasattr(obj, "tolist") and callable(obj.tolist):  # numpy arrays
        return jsonable(obj.tolist())
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, datetime):
        return obj.astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return str(obj)
