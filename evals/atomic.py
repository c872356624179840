"""Atomic file writes: a temporary file beside the target, fsync, rename, fsync the folder.

Readers see the old file or the new one, never half of one, even after a crash. Standard
library only, so every layer (the gateway runtime included) can use it.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path
from typing import IO, Iterator


@contextlib.contextmanager
def atomic_writer(path: str | os.PathLike, mode: str = "wb") -> Iterator[IO]:
    """Open a temporary file for writing; on success it replaces `path`, on error it vanishes."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
            yield fh
            fh.flush()
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


def atomic_write(path: str | os.PathLike, data: bytes | str) -> Path:
    """Write bytes or text to `path` atomically; returns the path."""
    with atomic_writer(path, "wb" if isinstance(data, bytes) else "w") as fh:
        fh.write(data)
    return Path(path)
