"""How faithfully `routeopt bench replay` offers a rate: constant arrivals against the fake
OpenAI-compatible server (its own process, answering at once), and how late the generator sent.

For each rate, `--duration` seconds of arrivals 1/rate apart go through `replay_once`, exactly as
the command sends them (the lean HTTP client, streaming, open loop); each repeat is a fresh
replay. Fidelity holds when send lateness p99 <= 2 ms and the achieved send rate >= 0.98 x the
offered one. Figures are medians over `--repeats`; the last line names the highest rate that held.

    python benchmarks/replay_fidelity.py --rates 500 --duration 60 --repeats 3
    python benchmarks/replay_fidelity.py --rates 100,200,300,400,500,700,1000 --duration 20
"""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from routeopt.evals.config import Candidate  # noqa: E402
from routeopt.evals.selfhost.arrivals import Arrival  # noqa: E402
from routeopt.evals.selfhost.replay import Slo, make_sender, replay_once, summarize  # noqa: E402
from tests.fake_llm import FakeLLMProcess  # noqa: E402


def constant(rate: float, duration_s: float) -> list[Arrival]:
    return [
        Arrival(i / rate, "fake", 16, 8, None, f"constant:{i + 1}") for i in range(int(rate * duration_s) + 1)
    ]


async def once(base_url: str, rate: float, duration_s: float) -> dict:
    cand = Candidate(
        name="fake",
        provider="openai",
        model="fake",
        base_url=base_url,
        input_price_per_mtok=1.0,
        output_price_per_mtok=1.0,
    )
    sender = make_sender(cand)
    try:
        run = await replay_once(constant(rate, duration_s), 1.0, {"fake": sender}, timeout_s=30)
    finally:
        sender.close()
    return summarize(run.records, 1.0, Slo(), max_lateness_s=0.002)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rates", default="500")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--repeats", type=int, default=3)
    a = ap.parse_args()
    rates = [float(r) for r in a.rates.split(",")]
    held = []
    print(
        f"{'rate':>6} {'late p50 ms':>11} {'late p99 ms':>11} {'late max ms':>11} {'achieved/offered':>16} "
        f"{'done':>6} {'errors':>6}  load average"
    )
    with FakeLLMProcess() as server:
        for rate in rates:
            runs = [asyncio.run(once(server.openai_base_url, rate, a.duration)) for _ in range(a.repeats)]
            p50 = np.median([r["lateness_s"]["p50"] for r in runs]) * 1000
            p99 = np.median([r["lateness_s"]["p99"] for r in runs]) * 1000
            mx = np.median([r["lateness_s"]["max"] for r in runs]) * 1000
            ratio = np.median([r["achieved_rps"] / r["offered_rps"] for r in runs])
            done = np.median([r["completed"] / r["arrivals"] for r in runs])
            errors = sum(r["errors"] for r in runs)
            ok = p99 <= 2.0 and ratio >= 0.98
            held += [rate] if ok else []
            print(
                f"{rate:>6g} {p50:>11.2f} {p99:>11.2f} {mx:>11.1f} {ratio:>16.3f} {done:>6.1%} {errors:>6}  "
                f"{os.getloadavg()[0]:.1f}  {'held' if ok else 'NOT held'} "
                f"(p99 per repeat: {', '.join(format(r['lateness_s']['p99'] * 1000, '.2f') for r in runs)})"
            )
    print(f"highest_rate_held={max(held) if held else 0:g}")


if __name__ == "__main__":
    main()
