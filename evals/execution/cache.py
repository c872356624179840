"""On-disk response cache: what each call answered, for resuming its run and for dev runs.

Two uses, and neither lets a nightly replay old answers (API aliases change behind the same
name: a nightly that replays yesterday cannot see a model get better, worse or slower):

- **Resuming a run** (the same run id), always on: an answer that was finished but not yet
  flushed to DuckDB when the run died is taken from here, so it is not paid twice. It is a
  measurement of that run and is recorded as one (`cached=False`, its own timings and cost).
- **Development runs that opt in** (`routeopt run --cache` or `--cache-max-age 1d`): answers
  that earlier runs recorded at most `max_age_s` ago are replayed. Such a row has
  `cached=True`: it counts in pass rates (it is graded again) but not in cost, tokens, latency
  or spend, which belong to the run that made the call (`routeopt.evals.storage.labels`).

Keyed by (SHA-256 of provider, base URL, model, variant, messages and generation settings;
scope). The scope is the run that made the call: its run id, and the flow adds its database,
so that two stores never take each other's runs' answers as their own. Only deterministic calls (temperature 0) and complete answers are stored, never errors,
never the API key. Entries older than `KEEP_S` are dropped when the cache is opened. One SQLite
file (WAL mode) in `config.cache_dir`, safe for several threads and processes.
"""

from __future__ import annotations

import hashlib
import json
import re
import sqlite3
import threading
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Callable

from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import Completion, Request

CACHE_FILE = "responses.sqlite"
KEEP_S = 30 * 86400.0
_COMPLETION_FIELDS = {f.name for f in fields(Completion)}
_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}


def parse_age(text: str) -> float:
    """'90s', '30m', '12h', '1d' or '2w' -> seconds; a clear error for anything else."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw])\s*", str(text))
    if m is None:
        raise ValueError(
            f"cache max age {text!r}: give a number and a unit (s, m, h, d or w), e.g. 12h or 1d"
        )
    seconds = float(m.group(1)) * _UNITS[m.group(2)]
    if seconds > KEEP_S:
        raise ValueError(
            f"cache max age {text!r} is longer than the cache keeps answers ({format_age(KEEP_S)})"
        )
    return seconds


def format_age(seconds: float) -> str:
    """The largest whole unit: 86400 -> '1d', 5400 -> '90m'."""
    for unit in ("w", "d", "h", "m"):
        if seconds >= _UNITS[unit] and seconds % _UNITS[unit] == 0:
            return f"{int(seconds // _UNITS[unit])}{unit}"
    return f"{seconds:g}s"


def cache_key(candidate: Candidate, request: Request) -> str:
    """The identity of a call: whose call it is and what decides the answer, nothing secret,
    nothing incidental.

    The candidate's name is part of it: two candidates serving the same checkpoint (zoo-l and
    zoo-l verified with a draft, a model behind two endpoints) give the same greedy answers at
    another speed and cost, and each row must be its own candidate's measurement, not a copy of
    the other's taken from the cache as if this run had made it."""
    s = request.settings
    payload = {
        "candidate": candidate.name,
        "speculative": None
        if candidate.speculative is None
        else candidate.speculative.model_dump(mode="json"),
        "provider": candidate.provider,
        "base_url": candidate.base_url,
        "model": candidate.model,
        "variant": candidate.variant,
        "messages": [[m.role, m.content] for m in request.messages],
        "settings": [s.max_tokens, s.temperature, list(s.stop), s.top_p],
    }
    return hashlib.sha256(json.dumps(payload, sort_keys=True).encode()).hexdigest()


@dataclass(frozen=True)
class Hit:
    completion: Completion
    scope: str  # the run that made the call
    attempts: int
    age_s: float


_BUSY_S = 30.0


def _set_up(con: sqlite3.Connection, drop_before: float) -> None:
    """WAL mode, the table, and the expiry sweep, safe against other threads and processes
    opening the same file at the same moment.

    SQLite answers "database is locked" at once, without waiting on its busy timeout, when two
    connections both hold a read lock and want to write (switching to WAL is such a write): one
    of them must back off. So the switch is retried for the busy timeout, and the rest runs in
    a `BEGIN IMMEDIATE` transaction, which takes the write lock first and so does wait.
    """
    deadline = time.monotonic() + _BUSY_S
    delay = 0.005
    while True:
        try:
            if con.execute("PRAGMA journal_mode").fetchone()[0].lower() != "wal":
                con.execute("PRAGMA journal_mode=WAL")
            break
        except sqlite3.OperationalError as e:
            if "locked" not in str(e) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.25)
    con.execute("PRAGMA synchronous=NORMAL")
    con.execute("BEGIN IMMEDIATE")
    try:
        con.execute("DROP TABLE IF EXISTS responses")  # the unscoped cache of older versions
        con.execute(
            "CREATE TABLE IF NOT EXISTS calls (key TEXT NOT NULL, scope TEXT NOT NULL,"
            " completion TEXT NOT NULL, attempts INTEGER NOT NULL, created_at REAL NOT NULL,"
            " PRIMARY KEY (key, scope))"
        )
        con.execute("CREATE INDEX IF NOT EXISTS calls_created ON calls (created_at)")
        con.execute("DELETE FROM calls WHERE created_at < ?", (drop_before,))
    except BaseException:
        con.execute("ROLLBACK")
        raise
    con.execute("COMMIT")


class ResponseCache:
    """A SQLite file of completions; `get`/`put` are fast enough to call from the event loop.

    `max_age_s`: how old an answer from another run may be to be replayed; None (the default)
    replays none, and only the same run's answers are found.
    """

    def __init__(
        self, path: str | Path, *, max_age_s: float | None = None, clock: Callable[[], float] = time.time
    ):
        path = Path(path)
        if path.suffix != ".sqlite":
            path = path / CACHE_FILE
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path, self.max_age_s, self._clock = path, max_age_s, clock
        self._lock = threading.Lock()
        self._con = sqlite3.connect(str(path), timeout=_BUSY_S, check_same_thread=False, isolation_level=None)
        _set_up(self._con, clock() - KEEP_S)
        self.hits = 0
        self.misses = 0

    def get(self, key: str, scope: str) -> Hit | None:
        """This run's (scope's) answer to the call, else (when allowed) the newest one young
        enough."""
        now = self._clock()
        oldest = now - self.max_age_s if self.max_age_s is not None else None
        with self._lock:
            row = self._con.execute(
                "SELECT completion, scope, attempts, created_at FROM calls WHERE key = ? "
                "AND (scope = ? OR created_at >= ?) ORDER BY scope = ? DESC, created_at DESC "
                "LIMIT 1",
                (key, scope, oldest if oldest is not None else float("inf"), scope),
            ).fetchone()
        if row is None:
            self.misses += 1
            return None
        self.hits += 1
        data = json.loads(row[0])
        completion = Completion(**{k: v for k, v in data.items() if k in _COMPLETION_FIELDS})
        return Hit(completion, row[1], int(row[2]), max(0.0, now - row[3]))

    def put(self, key: str, scope: str, completion: Completion, attempts: int = 1) -> None:
        with self._lock:
            self._con.execute(
                "INSERT OR REPLACE INTO calls (key, scope, completion, attempts, created_at) "
                "VALUES (?, ?, ?, ?, ?)",
                (key, scope, json.dumps(asdict(completion)), attempts, self._clock()),
            )

    def __len__(self) -> int:
        with self._lock:
            return self._con.execute("SELECT count(*) FROM calls").fetchone()[0]

    def close(self) -> None:
        with self._lock:
            self._con.close()
