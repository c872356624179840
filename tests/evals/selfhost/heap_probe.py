"""A probe replayed in a process of its own, as `routeopt replay` runs one: it prints how many
objects the collector had frozen at each send, next to the heap counted before the clock.

    python tests/evals/selfhost/heap_probe.py FOLDER     # prints one JSON object
"""

from __future__ import annotations

import asyncio
import gc
import json
import sys
import time
from pathlib import Path

from routeopt.evals.selfhost.arrivals import load_arrivals
from routeopt.evals.selfhost.replay import replay_once


class Recorder:
    """A sender that records the freeze count at each send, and sends nothing."""

    where = "recorder"

    def __init__(self) -> None:
        self.frozen: list[int] = []

    def start(self, rec, text, t0):
        return None

    async def send(self, rec, text, t0, started=None) -> None:
        self.frozen.append(gc.get_freeze_count())
        rec.sent_s = time.perf_counter() - t0
        rec.first_s = rec.end_s = rec.sent_s


def main(folder: Path) -> dict:
    rows = [
        {"timestamp": 1000 + i * 0.001, "model": "m", "input_tokens": 5, "output_tokens": 2}
        for i in range(20)
    ]
    (folder / "t.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    arrivals = load_arrivals([folder / "t.jsonl"], ["m"])
    earlier = [[i] for i in range(100_000)]  # stands for the records of earlier probes
    gc.collect()
    tracked_before = len(gc.get_objects())
    rec = Recorder()
    run = asyncio.run(replay_once(arrivals.items, 1.0, {"m": rec}))
    thawed = gc.get_freeze_count()
    gc.freeze()  # a caller that froze its own heap
    asyncio.run(replay_once(arrivals.items, 1.0, {"m": Recorder()}))
    kept = gc.get_freeze_count()
    del earlier
    return {"status": run.status, "frozen": rec.frozen, "tracked_before": tracked_before,
            "thawed": thawed, "kept": kept}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
