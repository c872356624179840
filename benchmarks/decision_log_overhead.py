"""What decision logging adds to a gateway decision: `Gateway.route` against the bare `Router.route`.

Same policy, same prompts, one thread. Each repeat times `-n` decisions of every setup in turn
(interleaved, so a noisy neighbour hits them alike), and the figures are the medians over the
repeats of each setup's p50 and p99 minus the bare router's. The writer thread runs as it would
in a gateway: it wakes every `flush_s`, builds and writes the records while the routing thread
keeps deciding, so its share of the GIL is in the figures.

    python benchmarks/decision_log_overhead.py [--data routerbench|synthetic|demo] [-n 5000] [--repeats 7]

Setups: `log` (hash + counts only), `log+explore` (1% exploration), `log+explore+text` (the
redaction hook keeps the text), `shadow` (the candidate's decision computed in the writer).
Two clocks: wall time (what a request sees here, preemption by other processes included) and the
routing thread's CPU time (what the call costs on a quiet core; time spent waiting for the GIL
while the writer runs is not in it, but is in wall time). The last line is
`added_p50_us=N added_p99_us=N` (wall) for `log+explore`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import tempfile
from pathlib import Path

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from artifacts.decisions import DecisionLog, Exploration, Gateway, verbatim  # noqa: E402
from artifacts.registry import move_channel, publish  # noqa: E402
from artifacts.runtime import load  # noqa: E402
from route_latency import build_policy, measure  # noqa: E402


def setups(registry: Path, public: Path, logs: Path) -> dict[str, object]:
    champion = load(registry, public, channel="champion")
    candidate = load(registry, public, channel="candidate")
    explore = Exploration(rate=0.01, seed=0)

    def gateway(name: str, **kw: object) -> Gateway:
        log = DecisionLog(logs / name, redact=kw.pop("redact", None), max_queue=100_000)
        return Gateway(champion, log=log, candidate=candidate, **kw)

    return {
        "bare": champion,
        "log": gateway("log"),
        "log+explore": gateway("explore", exploration=explore),
        "log+explore+text": gateway("text", exploration=explore, redact=verbatim),
        "shadow": gateway("shadow", exploration=explore, shadow=True),
    }


def run(n: int, repeats: int, data: str) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="decision-log-") as tmp:
        registry, public, prompts, what = build_policy(Path(tmp), data)
        key = public.parent / "signing_key.pem"
        move_channel(registry, "champion", 1, signing_key=key)
        policy = load(registry, public).policy
        shifted = dataclasses.replace(policy, quality_target=0.8)
        publish(shifted, registry, lineage={"benchmark": "shadow"}, metrics={}, signing_key=key)
        move_channel(registry, "candidate", 2, signing_key=key)
        routes = setups(registry, public, Path(tmp) / "logs")
        print(f"{what}: {len(prompts)} prompts, {len(policy.candidates)} candidates, "
              f"{n} decisions x {repeats} repeats per setup, load average {os.getloadavg()[0]:.1f}")
        for _ in range(repeats):
            for name, target in routes.items():
                wall, cpu = measure(target.route, prompts, n, warmup=200)
                row = figures.setdefault(name, {})
                for clock, xs in (("wall", wall), ("cpu", cpu)):
                    for q, v in zip((50, 99, 99.9), np.percentile(xs, [50, 99, 99.9])):
                        row.setdefault(f"{clock} p{q:g}", []).append(float(v))
        for name, target in routes.items():
            if isinstance(target, Gateway):
                target.log.flush()
                s = target.log.status()
                print(f"  {name}: {s.written} records written, {s.dropped} dropped")
                target.log.close()
    return figures


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=5000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--data", choices=("auto", "demo", "routerbench", "synthetic"), default="auto")
    args = ap.parse_args()
    figures = run(args.n, args.repeats, args.data)
    bare = figures["bare"]

    def added(row: dict, key: str) -> float:
        return float(np.median(np.array(row[key]) - np.array(bare[key])))

    print(f"medians over {args.repeats} repeats, microseconds")
    print(f"{'setup':<18} {'wall p50':>9} {'wall p99':>9} {'p99.9':>8} {'cpu p50':>8} {'cpu p99':>8}"
          f" {'added wall p50/p99':>19} {'added cpu p50/p99':>18}")
    for name, row in figures.items():
        med = {k: float(np.median(v)) for k, v in row.items()}
        print(f"{name:<18} {med['wall p50']:>9.1f} {med['wall p99']:>9.1f} {med['wall p99.9']:>8.1f} "
              f"{med['cpu p50']:>8.1f} {med['cpu p99']:>8.1f} "
              f"{added(row, 'wall p50'):>9.1f}/{added(row, 'wall p99'):<9.1f} "
              f"{added(row, 'cpu p50'):>8.1f}/{added(row, 'cpu p99'):<9.1f}")
    row = figures["log+explore"]
    print(f"added_p50_us={added(row, 'wall p50'):.1f} added_p99_us={added(row, 'wall p99'):.1f} "
          f"added_cpu_p50_us={added(row, 'cpu p50'):.1f} added_cpu_p99_us={added(row, 'cpu p99'):.1f}")


if __name__ == "__main__":
    main()
