"""What decision logging adds to a gateway decision: `Gateway.route` against the bare `Router.route`.

Same policy, same prompts, one thread. Each repeat times `-n` decisions of every setup in turn
(interleaved, so a noisy neighbour hits them alike), and the figures are the medians over the
repeats of each setup's p50 and p99 minus the bare router's. The writer thread runs as it would
in a gateway: it wakes every `flush_s`, builds and writes the records while the routing thread
keeps deciding, so its share of the GIL is in the figures.

    python benchmarks/decision_log_overhead.py [--data routerbench|synthetic|demo] [-n 5000] [--repeats 7]

`isolated` times the gateway's own work alone: `Gateway.route` (1% exploration, logging, the
writer thread running) around a router that returns the real policy's precomputed decision at
once. A call of a few microseconds is rarely preempted, so its p99 is what logging adds to a
decision's p99 even on a busy machine, where the full decision's p99 is mostly preemption.

Setups: `log` (hash + counts only), `log+explore` (1% exploration), `log+explore+text` (the
redaction hook keeps the text), `shadow` (the candidate's decision computed in the writer).
Two clocks: wall time (what a request sees here, preemption by other processes included) and the
routing thread's CPU time (what the call costs on a quiet core; time spent waiting for the GIL
while the writer runs is not in it, but is in wall time). The last lines are
`isolated_p50_us=N isolated_p99_us=N` and `added_p50_us=N added_p99_us=N` (wall, `log+explore`).
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

from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway, verbatim  # noqa: E402
from routeopt.artifacts.publish.registry import move_channel, publish  # noqa: E402
from routeopt.artifacts.serving.loader import load  # noqa: E402
from route_latency import build_policy, measure  # noqa: E402
import traffic_replay  # noqa: E402


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


class _Instant:
    """A router that returns precomputed decisions (one per prompt) without deciding."""

    def __init__(self, router: object, prompts: list) -> None:
        self.router = router
        self.decisions = {p: router.route(p, s) for p, s in prompts}

    def route(self, prompt: str, suite: object = None, quality_target: object = None) -> object:
        return self.decisions[prompt]

    def status(self) -> object:
        return self.router.status()

    def close(self) -> None:
        pass


def isolated(router: object, prompts: list, folder: Path, n: int, repeats: int) -> dict[str, list[float]]:
    """The gateway's own per-call cost: p50/p99 of Gateway.route around an instant router."""
    gw = Gateway(
        _Instant(router, prompts),
        log=DecisionLog(folder, max_queue=100_000),
        exploration=Exploration(rate=0.01, seed=0),
    )
    row: dict[str, list[float]] = {}
    for _ in range(repeats):
        wall, cpu = measure(gw.route, prompts, n, warmup=200)
        for clock, xs in (("wall", wall), ("cpu", cpu)):
            for q, v in zip((50, 99, 99.9), np.percentile(xs, [50, 99, 99.9])):
                row.setdefault(f"{clock} p{q:g}", []).append(float(v))
    gw.log.close()
    return row


def policy_for(folder: Path, data: str) -> tuple[Path, Path, list, str]:
    """route_latency's policy, or one trained on RouterBench's train split wherever ../shared is."""
    if data != "routerbench":
        return build_policy(folder, data)
    from routeopt.artifacts.publish.registry import publish as publish_
    from routeopt.artifacts.publish.signing_keys import generate_keys
    from routeopt.router_training.train import train_router

    train, fleet, what = traffic_replay.load_data("routerbench")
    private, public = generate_keys(folder / "keys")
    publish_(
        train_router(train, quality_target=0.95, seed=0).policy,
        folder / "registry",
        lineage={"benchmark": what},
        metrics={},
        signing_key=private,
    )
    return folder / "registry", public, list(zip(fleet.prompts, fleet.suites)), what


def run(n: int, repeats: int, data: str) -> dict[str, dict[str, list[float]]]:
    figures: dict[str, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory(prefix="decision-log-") as tmp:
        registry, public, prompts, what = policy_for(Path(tmp), data)
        key = public.parent / "signing_key.pem"
        move_channel(registry, "champion", 1, signing_key=key)
        policy = load(registry, public).policy
        shifted = dataclasses.replace(policy, quality_target=0.8)
        publish(shifted, registry, lineage={"benchmark": "shadow"}, metrics={}, signing_key=key)
        move_channel(registry, "candidate", 2, signing_key=key)
        routes = setups(registry, public, Path(tmp) / "logs")
        print(
            f"{what}: {len(prompts)} prompts, {len(policy.candidates)} candidates, "
            f"{n} decisions x {repeats} repeats per setup, load average {os.getloadavg()[0]:.1f}"
        )
        for _ in range(repeats):
            for name, target in routes.items():
                wall, cpu = measure(target.route, prompts, n, warmup=200)
                row = figures.setdefault(name, {})
                for clock, xs in (("wall", wall), ("cpu", cpu)):
                    for q, v in zip((50, 99, 99.9), np.percentile(xs, [50, 99, 99.9])):
                        row.setdefault(f"{clock} p{q:g}", []).append(float(v))
        figures["isolated"] = isolated(routes["bare"], prompts, Path(tmp) / "logs" / "isolated", n, repeats)
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
    print(
        f"{'setup':<18} {'wall p50':>9} {'wall p99':>9} {'p99.9':>8} {'cpu p50':>8} {'cpu p99':>8}"
        f" {'added wall p50/p99':>19} {'added cpu p50/p99':>18}"
    )
    for name, row in figures.items():
        if name == "isolated":
            continue
        med = {k: float(np.median(v)) for k, v in row.items()}
        print(
            f"{name:<18} {med['wall p50']:>9.1f} {med['wall p99']:>9.1f} {med['wall p99.9']:>8.1f} "
            f"{med['cpu p50']:>8.1f} {med['cpu p99']:>8.1f} "
            f"{added(row, 'wall p50'):>9.1f}/{added(row, 'wall p99'):<9.1f} "
            f"{added(row, 'cpu p50'):>8.1f}/{added(row, 'cpu p99'):<9.1f}"
        )
    iso = {k: float(np.median(v)) for k, v in figures["isolated"].items()}
    print(
        f"isolated (the gateway's own work per call, 1% exploration, logging): wall p50 "
        f"{iso['wall p50']:.1f}, p99 {iso['wall p99']:.1f}, p99.9 {iso['wall p99.9']:.1f}; "
        f"CPU p50 {iso['cpu p50']:.1f}, p99 {iso['cpu p99']:.1f}"
    )
    print(f"isolated_p50_us={iso['wall p50']:.1f} isolated_p99_us={iso['wall p99']:.1f}")
    row = figures["log+explore"]
    print(
        f"added_p50_us={added(row, 'wall p50'):.1f} added_p99_us={added(row, 'wall p99'):.1f} "
        f"added_cpu_p50_us={added(row, 'cpu p50'):.1f} added_cpu_p99_us={added(row, 'cpu p99'):.1f}"
    )


if __name__ == "__main__":
    main()
