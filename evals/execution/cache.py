"""On-disk response cache: a re-run of a deterministic call neither waits nor pays again.

Keyed by a SHA-256 of (provider, base URL, model, variant, messages, generation settings); only
deterministic calls (temperature 0) are cached, and only complete answers, never errors. The
API key is not part of the key or the value. Stored in one SQLite file (WAL mode) in
`config.cache_dir`, safe for several threads and processes.

A cache hit is recorded with `cached=True`, the original token counts and timings (they
describe the model, not the cache) and `cost_usd = 0`: a resumed or repeated run must not pay
twice.
"""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from dataclasses import asdict, fields
from pathlib import Path

from evals.config import Candidate
from evals.providers.base import Completion, Request

CACHE_FILE = "responses.sqlite"
_COMPLETION_FIELDS = {f.name for f in fields(Completion)}


def cache_key(candidate: Candidate, request: Request) -> str:
    """The identity of a call: what decides the answer, nothing secret, nothing incidental."""
    s = request.settings
    payload = {
        "provider": candidate.provider,
        "base_url": candidate.base_url,
        "model": candidate.model,
        "variant": candidate.variant,
        "messages": [[m.role, m.content] for m in request.messages],
        "settings": [s.max_tokens, s.temperature, list(s.stop), s.top_p],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


class ResponseCache:
    """A SQLite file of completions; `get`/`put` are fast enough to call from the event loop."""

    def __init__(self, path: str | Path):
        path = Path(path)
        if path.suffix != ".sqlite":
            path = path / CACHE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(path), timeout=30, check_same_thread=False,
                                    isolation_level=None)
        self._con.execute("PRAGMA journal_mode=WAL")
        self._con.execute("PRAGMA synchronous=NORMAL")
        self._con.execute(
            "CREATE TABLE IF NOT EXISTS responses (key TEXT PRIMARY KEY, completion TEXT NOT NULL,"
            " created_at REAL NOT NULL)"
        )
        self.hits = 0
        self.misses = 0

    def get(self, key: str) -> Completion | None:
        with self._lock:
            row = self._con.execute(
                "SELECT completion FROM responses WHERE key = ?", (key,)).fetchone()
        if row is None:
            self.misses += 1
            return None
        data = json.loads(row[0])
        self.hits += 1
        return Completion(**{k: v for k, v in data.items() if k in _COMPLETION_FIELDS})

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            self._con.execute(
                "INSERT OR REPLACE INTO responses (key, completion, created_at) VALUES (?, ?, ?)",
                (key, json.dumps(asdict(completion)), time.time()),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._con.execute("SELECT count(*) FROM responses").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._con.close()
