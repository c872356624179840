"""The decision service's metrics in the Prometheus text format (version 0.0.4), standard library only.

Counters and the latency histogram are updated by the event loop thread that serves requests;
policy events (swaps, refused versions) arrive from the refresher thread and take a lock. Figures
that the gateway already keeps (the policy version, swaps, the decision log's counters) are read
from `Gateway.status()` when scraped, so they cannot drift from what the gateway reports.
"""

from __future__ import annotations

import bisect
import mmap
import struct
import threading
from typing import Any, Iterable

from routeopt.common import tracing

# seconds; a decision takes ~0.1 ms, the HTTP round trip a few tenths of a millisecond
BUCKETS = (0.0001, 0.00025, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1.0)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(pairs: Iterable[tuple[str, str]]) -> str:
    inner = ",".join(f'{k}="{_escape(v)}"' for k, v in pairs)
    return "{" + inner + "}" if inner else ""


class Metrics:
    """Counts decisions (by model), refused requests (by reason), policy events (by kind) and
    the time each routing request spent in the service."""

    def __init__(self) -> None:
        self.decisions: dict[tuple[str, str], int] = {}
        self.passthrough = 0
        self.refused: dict[str, int] = {}
        self.events: dict[str, int] = {}
        self._bucket_counts = [0] * (len(BUCKETS) + 1)
        self._sum = 0.0
        self._count = 0
        self._lock = threading.Lock()

    def decided(self, model: str, default: bool, seconds: float) -> None:
        key = (model, "true" if default else "false")
        self.decisions[key] = self.decisions.get(key, 0) + 1
        self.observe(seconds)

    def observe(self, seconds: float) -> None:
        self._bucket_counts[bisect.bisect_left(BUCKETS, seconds)] += 1
        self._sum += seconds
        self._count += 1

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1

    def event(self, kind: str, _message: str = "") -> None:
        """An `on_event` callback of the runtime: swapped, rejected, unreachable, expired, default."""
        with self._lock:
            self.events[kind] = self.events.get(kind, 0) + 1

    def render(self, status: Any, ready: bool) -> str:
        """The exposition text; `status` is `Gateway.status()` (None while no gateway is open)."""
        out: list[str] = []

        def family(name: str, kind: str, help_text: str, samples: Iterable[tuple[str, float]]) -> None:
            out.append(f"# HELP {name} {help_text}")
            out.append(f"# TYPE {name} {kind}")
            out.extend(f"{name}{labels} {value:.17g}" for labels, value in samples)

        family(
            "routeopt_decisions_total",
            "counter",
            "Requests routed, by the model chosen.",
            [
                (_labels([("model", m), ("default_model", d)]), n)
                for (m, d), n in sorted(self.decisions.items())
            ],
        )
        family(
            "routeopt_passthrough_total",
            "counter",
            "Requests that named a model other than the alias (not routed).",
            [("", self.passthrough)],
        )
        family(
            "routeopt_refused_requests_total",
            "counter",
            "Routing requests answered with an error, by reason.",
            [(_labels([("reason", r)]), n) for r, n in sorted(self.refused.items())],
        )
        with self._lock:
            events = sorted(self.events.items())
        family(
            "routeopt_policy_events_total",
            "counter",
            "Policy refresher events: swapped, rejected (a version refused), unreachable, expired, default.",
            [(_labels([("kind", k)]), n) for k, n in events],
        )
        self._render_status(family, status, ready)
        spans = tracing.status()
        family(
            "routeopt_tracing_spans_total",
            "counter",
            "Decision spans by outcome: exported, export_failed (the collector refused them), "
            "dropped (the queue was full: the collector is down or slow).",
            [
                (_labels([("outcome", k)]), getattr(spans, k))
                for k in ("exported", "export_failed", "dropped")
            ],
        )
        self._render_histogram(out)
        return "\n".join(out) + "\n"

    def _render_status(self, family: Any, status: Any, ready: bool) -> None:
        champion = status.champion if status is not None else None
        family(
            "routeopt_ready",
            "gauge",
            "1 when a verified policy or the default model serves.",
            [("", 1 if ready else 0)],
        )
        family(
            "routeopt_policy_version",
            "gauge",
            "The champion version serving (0: none or the default model).",
            [("", champion.version if champion else 0)],
        )
        family(
            "routeopt_serving_default_model",
            "gauge",
            "1 while the default model serves every request.",
            [("", 1 if champion is not None and champion.serving_default else 0)],
        )
        family(
            "routeopt_policy_swaps_total",
            "counter",
            "New policy versions swapped in.",
            [("", champion.swaps if champion else 0)],
        )
        family(
            "routeopt_policy_checks_total",
            "counter",
            "Registry polls.",
            [("", champion.checks if champion else 0)],
        )
        unknown: dict[str, int] = {}
        for router in (champion, status.candidate if status is not None else None):
            for name, n in (router.unknown_suites if router is not None else {}).items():
                unknown[name] = unknown.get(name, 0) + n
        family(
            "routeopt_unknown_suite_requests_total",
            "counter",
            "Requests naming a suite the serving policy was not trained on, by suite (the first "
            "100 names; routeopt_unknown_suite_requests_all_total counts every one).",
            [(_labels([("suite", name)]), n) for name, n in sorted(unknown.items())],
        )
        family(
            "routeopt_unknown_suite_requests_all_total",
            "counter",
            "Requests naming a suite the serving policy was not trained on.",
            [
                (
                    "",
                    sum(
                        r.unknown_suite_requests
                        for r in (champion, status.candidate if status else None)
                        if r is not None
                    ),
                )
            ],
        )
        log = status.log if status is not None else None
        family(
            "routeopt_decision_log_written_total",
            "counter",
            "Decision log records written.",
            [("", log.written if log else 0)],
        )
        family(
            "routeopt_decision_log_dropped_total",
            "counter",
            "Decision log records dropped (queue full or write failed).",
            [("", log.dropped if log else 0)],
        )

    def _render_histogram(self, out: list[str]) -> None:
        name = "routeopt_route_seconds"
        out.append(f"# HELP {name} Time a routing request spent in the service, body read to answer.")
        out.append(f"# TYPE {name} histogram")
        running = 0
        for bound, n in zip((*BUCKETS, float("inf")), self._bucket_counts):
            running += n
            le = "+Inf" if bound == float("inf") else f"{bound:g}"
            out.append(f'{name}_bucket{{le="{le}"}} {running}')
        out.append(f"{name}_sum {self._sum:.17g}")
        out.append(f"{name}_count {self._count}")


class SharedMetrics:
    """What each worker of one service last counted, in memory shared across the fork, so that
    `/metrics`, whichever worker answers it, counts the whole service (Prometheus would see a
    counter reset at every scrape that reached another worker).

    Each worker writes its own slot (its exposition text, under a sequence number that is odd
    while it writes) and reads the others' without a lock, retrying a slot caught mid-write.
    """

    SLOT_BYTES = 1 << 18
    _HEAD = struct.Struct("<qq")  # sequence, length

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._memory = mmap.mmap(-1, workers * self.SLOT_BYTES)

    def publish(self, index: int, text: str) -> None:
        data = text.encode("utf-8")[: self.SLOT_BYTES - self._HEAD.size]
        at = index * self.SLOT_BYTES
        seq = self._HEAD.unpack_from(self._memory, at)[0]
        self._HEAD.pack_into(self._memory, at, seq + 1, 0)
        self._memory[at + self._HEAD.size : at + self._HEAD.size + len(data)] = data
        self._HEAD.pack_into(self._memory, at, seq + 2, len(data))

    def others(self, index: int) -> list[str]:
        """The other workers' last published texts (a worker that has published none: none)."""
        out = []
        for i in range(self.workers):
            if i == index:
                continue
            at = i * self.SLOT_BYTES
            for _ in range(100):
                seq, size = self._HEAD.unpack_from(self._memory, at)
                if seq % 2:
                    continue
                data = self._memory[at + self._HEAD.size : at + self._HEAD.size + size]
                if self._HEAD.unpack_from(self._memory, at)[0] == seq:
                    if seq:
                        out.append(data.decode("utf-8"))
                    break
        return out


def merge(own: str, others: list[str]) -> str:
    """`own` exposition text with every counter and histogram sample summed over `others` too
    (samples only another worker has are added to their family); gauges stay this worker's."""
    families: dict[str, dict[str, float]] = {}
    kinds: dict[str, str] = {}
    for text in others:
        family = ""
        for line in text.splitlines():
            if line.startswith("# TYPE "):
                _, _, family, kind = line.split(" ", 3)
                kinds[family] = kind
            elif line and not line.startswith("#"):
                key, value = line.rsplit(" ", 1)
                samples = families.setdefault(family, {})
                samples[key] = samples.get(key, 0.0) + float(value)
    out: list[str] = []
    family, seen = "", set()

    def extra() -> None:  # what others counted under the family just ended, and this worker did not
        if kinds.get(family) in ("counter", "histogram"):
            out.extend(f"{k} {v:.17g}" for k, v in families.get(family, {}).items() if k not in seen)

    for line in own.splitlines():
        if line.startswith("# TYPE "):
            extra()
            family, seen = line.split(" ", 3)[2], set()
            out.append(line)
        elif line and not line.startswith("#"):
            key, value = line.rsplit(" ", 1)
            seen.add(key)
            if kinds.get(family) in ("counter", "histogram"):
                total = float(value) + families.get(family, {}).get(key, 0.0)
                out.append(f"{key} {total:.17g}")
            else:
                out.append(line)
        else:
            out.append(line)
    extra()
    return "\n".join(out) + "\n"
