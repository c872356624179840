"""What decision logging adds to a gateway decision: `Gateway.route` against the bare `Router.route`.

Same policy, same prompts, one thread. Each repeat times `-n` decisions of every setup in turn
(interleaved, so a noisy neighbour hits them alike), and the figures are the medians over the
repeats of each setup's p50 and p99 minus the bare router's. The writer thread runs as it would
in a gateway: it wakes every `flush_s`, builds and writes the records while the routing thread
keeps deciding, so its share of the GIL is in the figures.

    python benchmarks/decision_log_overhead.py [--data routerbench|synthetic|demo] [-n 5000] [--repeats 7]

Setups: `log` (hash + counts only), `log+explore` (1% exploration), `log+explore+text` (the
redaction hook keeps the text), `shadow` (the candidate's decision computed in the writer).
The last line is `added_p50_us=N added_p99_us=N` for `log+explore`.
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
                wall, _ = measure(target.route, prompts, n, warmup=200)
                p50, p99, p999 = np.percentile(wall, [50, 99, 99.9])
                row = figures.setdefault(name, {"p50": [], "p99": [], "p99.9": []})
                row["p50"].append(p50)
                row["p99"].append(p99)
                row["p99.9"].append(p999)
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
    bare = {k: float(np.median(v)) for k, v in figures["bare"].items()}
    print(f"{'setup':<18} {'p50 us':>8} {'p99 us':>8} {'p99.9 us':>9} {'added p50':>10} {'added p99':>10}")
    for name, row in figures.items():
        added50 = np.median(np.array(row["p50"]) - np.array(figures["bare"]["p50"]))
        added99 = np.median(np.array(row["p99"]) - np.array(figures["bare"]["p99"]))
        print(f"{name:<18} {np.median(row['p50']):>8.1f} {np.median(row['p99']):>8.1f} "
              f"{np.median(row['p99.9']):>9.1f} {added50:>10.1f} {added99:>10.1f}")
    row = figures["log+explore"]
    print(f"bare router: p50 {bare['p50']:.1f} us, p99 {bare['p99']:.1f} us")
    print(f"added_p50_us={np.median(np.array(row['p50']) - np.array(figures['bare']['p50'])):.1f} "
          f"added_p99_us={np.median(np.array(row['p99']) - np.array(figures['bare']['p99'])):.1f}")


if __name__ == "__main__":
    main()
