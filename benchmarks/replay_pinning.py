"""Does `routeopt bench replay` measure the local engine more steadily with the generator and the
engine on CPUs of their own (`--pin`, the default) than left to the scheduler (`--no-pin`)?

A constant-rate arrival trace (prompts of at most 48 characters from a shared set's test split,
as `replay_diurnal.py` draws them) is replayed at `--rate` requests/s for `--seconds`, several
probes per command (`--speed 1,1,...`), by alternating commands with `--pin` and `--no-pin`
(`--rounds` of each). Above the engine's capacity, each probe's completed requests/s is the
engine's throughput at that moment; the spread of those over probes, per mode, is how much the
measurement moves with nothing changed.

    python benchmarks/replay_pinning.py [--rate 1600] [--seconds 7] [--probes 5] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from replay_diurnal import REPO, draw_prompts


def write_trace(path: Path, rate: float, seconds: float, dataset: str, seed: int = 0) -> int:
    n = int(rate * seconds)
    with path.open("w") as f:
        for i, (prompt, out) in enumerate(draw_prompts(dataset, n, np.random.default_rng(seed))):
            f.write(
                json.dumps(
                    {
                        "timestamp": i / rate,
                        "model": "zoo-s",
                        "input_tokens": len(prompt),
                        "output_tokens": out,
                        "text": prompt,
                    }
                )
                + "\n"
            )
    return n


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=float, default=1600.0)
    ap.add_argument("--seconds", type=float, default=7.0)
    ap.add_argument("--probes", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--dataset", default="alpacaeval")
    a = ap.parse_args()
    folder = Path(tempfile.mkdtemp(prefix="replay-pinning-"))
    trace = folder / "trace.jsonl"
    n = write_trace(trace, a.rate, a.seconds, a.dataset)
    print(
        f"{trace}: {n} arrivals at {a.rate:g}/s; {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    got: dict[str, list[tuple[float, float]]] = {"--pin": [], "--no-pin": []}
    for rnd in range(a.rounds):
        for mode in got:
            out = folder / f"{mode[2:]}{rnd}.json"
            cmd = [
                sys.executable,
                "-m",
                "routeopt.flows.cli",
                "bench",
                "replay",
                str(trace),
                "--candidate",
                "zoo-s",
                "--speed",
                ",".join(["1"] * a.probes),
                "--ttft-target-s",
                "1",
                mode,
                "--no-store",
                "--json-out",
                str(out),
            ]
            env = {"ROUTEOPT_TORCH_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO)}
            subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, env=env)
            for s in json.loads(out.read_text())["speeds"]:
                f = s["figures"]["*"]
                got[mode].append((f["completed_rps"], (f["ttft_s"] or {}).get("p95", float("nan"))))
            print(
                f"round {rnd + 1} {mode:>8}: completed/s "
                + " ".join(f"{c:6.0f}" for c, _ in got[mode][-a.probes :])
                + f"; load average {os.getloadavg()[0]:.1f}",
                flush=True,
            )
    for mode, xs in got.items():
        done = np.array([c for c, _ in xs])
        p95 = np.array([t for _, t in xs]) * 1000
        print(
            f"{mode:>8}: completed/s median {np.median(done):.0f}, min {done.min():.0f}, max {done.max():.0f}, "
            f"spread {(done.max() - done.min()) / np.median(done):.1%}, CV {done.std() / done.mean():.1%}; "
            f"TTFT p95 ms median {np.median(p95):.0f} (min {p95.min():.0f}, max {p95.max():.0f})"
        )


if __name__ == "__main__":
    main()
