"""A 10-minute decision log with a diurnal and bursty arrival process, replayed at several speeds
against a local demo candidate through `routeopt bench replay`, several times.

The log is made here, seeded: prompts (text kept, as a redaction hook that keeps text would log
them) from a shared set's test split (`../shared/data/alpacaeval/test.parquet` by default);
arrivals from a non-homogeneous Poisson process whose rate follows one compressed "day" over the
window (`mean * (1 - 0.7 cos(2 pi t / T))`: quiet at the ends, 1.7x the mean mid-way) plus bursts
(a Poisson process of bursts, every `--burst-every-s` on average, each of a geometric number of
requests, mean `--burst-size`, within half a second). Usage records carry the set's recorded input
tokens and its output tokens divided by 20, clipped to [2, 16]: the demo models are tiny, with 64
positions and a tokenizer of one token per character, so only the set's prompts of at most 48
characters are drawn, and their input length is their length in characters.

Each run is two `routeopt bench replay` commands as a user types them, with their JSON output:
`--speed 1,2,5` (the figures per speed), then the sweep (no `--speed`: doubling from
`--sweep-start` until the SLO breaks, then `--sweep-steps` bisections) for the speed where the SLO
breaks: the lowest speed above the highest that met it whose verdict (the majority of up to three
probes, `--sweep-probes`) was that it broke it, a few percent above that highest. Both with `ROUTEOPT_TORCH_THREADS=1` unless set: on a busy 2-core machine
torch's second intra-op thread waits at every operator's barrier for a core (a 1-minute trial at
load average 6-14: end-to-end p95 3.7 s with two threads, 0.09 s with one); the summary gives TTFT and end-to-end p95/p99 per speed and run, their
spread over runs ((max - min) / median), and where the SLO broke.

The log's density decides how long a probe near the break lasts, and so what the break measures.
At 20 requests/s (the default) the SLO breaks near 30x, where a probe replays the 10 minutes in
about 20 s: the compressed day's peak overloads the server for seconds, long enough for the queue
to pass the SLO's targets, so the break is the server's capacity at the peak. At 1 to 2
requests/s it broke near 700x, where the whole log went by in under a second: whether a backlog
that short crossed the targets, and whether the generator kept up at that instant, decided it,
and three runs spread by 32%.

    python benchmarks/replay_diurnal.py --runs 3 --speeds 1,2,5 [--mean-rps 20] [--sweep-only]
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
MIN_GOOD = 0.9  # `routeopt bench replay --min-good`'s default, which the runs here keep
SHARED = next(
    (p for p in (REPO.parent / "shared", REPO.parent.parent / "shared") if p.is_dir()), REPO.parent / "shared"
)


def arrivals(
    seed: int, minutes: float, mean_rps: float, burst_every_s: float, burst_size: float
) -> np.ndarray:
    """Arrival times (seconds from the start), sorted."""
    rng = np.random.default_rng(seed)
    T = minutes * 60.0
    peak = mean_rps * 1.7
    n = rng.poisson(peak * T)
    t = np.sort(rng.uniform(0, T, n))
    rate = mean_rps * (1 - 0.7 * np.cos(2 * math.pi * t / T))
    base = t[rng.uniform(0, peak, n) < rate]  # thinning
    bursts = []
    for start in np.sort(rng.uniform(0, T, rng.poisson(T / burst_every_s))):
        k = rng.geometric(1 / burst_size)
        bursts.append(start + rng.uniform(0, 0.5, k))
    return np.sort(np.concatenate([base, *bursts]))


def machine_ms(reps: int = 7) -> float:
    """Median milliseconds of a fixed pure-Python loop: how fast this shared machine runs just then,
    so runs whose breaks differ can be told apart from a machine that ran at another speed."""
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        total = 0
        for i in range(1_000_000):
            total += i * i % 7
        times.append((time.perf_counter() - start) * 1000)
    return float(np.median(times))


def draw_prompts(
    dataset: str, n: int, rng: np.random.Generator, max_chars: int = 48
) -> list[tuple[str, int]]:
    """n (prompt, output tokens) drawn from the set's test split: prompts the demo models fit (64
    positions, one per character), output tokens the recorded ones / 20, clipped to [2, 16]."""
    import pandas as pd

    df = pd.read_parquet(SHARED / "data" / dataset / "test.parquet").drop_duplicates("request_id")
    df = df[df.prompt.str.len() <= max_chars]
    rows = df.iloc[rng.integers(0, len(df), n)]
    return [(r.prompt, int(np.clip(int(r.output_tokens) // 20, 2, 16))) for r in rows.itertuples()]


def write_log(
    path: Path,
    seed: int,
    model: str,
    minutes: float,
    mean_rps: float,
    burst_every_s: float,
    burst_size: float,
    dataset: str,
) -> int:
    rng = np.random.default_rng(seed + 1)
    times = arrivals(seed, minutes, mean_rps, burst_every_s, burst_size)
    start = 1_767_225_600.0  # 2026-01-01T00:00:00Z
    lines = []
    for i, (t, (prompt, out)) in enumerate(zip(times, draw_prompts(dataset, len(times), rng))):
        stamp = np.datetime_as_string(np.datetime64(int((start + t) * 1e6), "us"), unit="us") + "Z"
        rid = f"diurnal-{seed}-{i}"
        lines.append(
            {
                "v": 1,
                "kind": "decision",
                "time": stamp,
                "request_id": rid,
                "suite": dataset,
                "prompt_chars": len(prompt),
                "text": prompt,
                "channel": "champion",
                "policy_version": 1,
                "model": model,
                "propensity": 1.0,
            }
        )
        lines.append(
            {
                "v": 1,
                "kind": "usage",
                "time": stamp,
                "request_id": rid,
                "model": model,
                "input_tokens": len(prompt),
                "output_tokens": out,
            }
        )
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return len(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--speeds", default="1,2,5")
    ap.add_argument("--candidate", default="zoo-s")
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--mean-rps", type=float, default=20.0)
    ap.add_argument("--burst-every-s", type=float, default=40.0)
    ap.add_argument("--burst-size", type=float, default=8.0)
    ap.add_argument("--dataset", default="alpacaeval")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--ttft-target-s", type=float, default=1.0)
    ap.add_argument("--latency-target-s", type=float, default=3.0)
    ap.add_argument("--sweep-start", type=float, default=16.0)
    ap.add_argument("--max-speed", type=float, default=1024.0)
    ap.add_argument("--sweep-steps", type=int, default=4)
    ap.add_argument("--sweep-only", action="store_true", help="Skip the runs at --speeds: only the sweeps.")
    ap.add_argument("--keep", type=Path, default=None, help="Write the log and the JSON results here.")
    a = ap.parse_args()
    folder = a.keep or Path(tempfile.mkdtemp(prefix="replay-diurnal-"))
    folder.mkdir(parents=True, exist_ok=True)
    log = folder / "decisions.jsonl"
    n = write_log(log, a.seed, a.candidate, a.minutes, a.mean_rps, a.burst_every_s, a.burst_size, a.dataset)
    print(
        f"{log}: {n} arrivals over {a.minutes:g} min ({n / a.minutes / 60:.2f}/s mean) from {a.dataset}; "
        f"load average {os.getloadavg()[0]:.1f}",
        flush=True,
    )
    results, sweeps, speed = [], [], []
    for run in range(a.runs):
        before = machine_ms()
        for what, speeds, into in (
            (f"run{run}", ["--speed", a.speeds], results),
            (
                f"sweep{run}",
                [
                    "--sweep-start",
                    str(a.sweep_start),
                    "--max-speed",
                    str(a.max_speed),
                    "--sweep-steps",
                    str(a.sweep_steps),
                ],
                sweeps,
            ),
        ):
            if a.sweep_only and what.startswith("run"):
                continue
            out = folder / f"{what}.json"
            cmd = [
                sys.executable,
                "-m",
                "routeopt.flows.cli",
                "bench",
                "replay",
                str(log),
                "--candidate",
                a.candidate,
                *speeds,
                "--ttft-target-s",
                str(a.ttft_target_s),
                "--latency-target-s",
                str(a.latency_target_s),
                "--json-out",
                str(out),
                "--db",
                str(folder / "replay.duckdb"),
            ]
            env = {"ROUTEOPT_TORCH_THREADS": "1", **os.environ, "PYTHONPATH": str(REPO)}
            subprocess.run(cmd, cwd=REPO, check=True, stdout=subprocess.DEVNULL, env=env)
            into.append(json.loads(out.read_text()))
        speed.append((before, machine_ms()))
        print(
            f"run {run + 1}: done, load average {os.getloadavg()[0]:.1f}; a fixed Python loop took "
            f"{speed[-1][0]:.0f} ms before the run and {speed[-1][1]:.0f} ms after it",
            flush=True,
        )
    if results:
        report(results, a)
    report_sweeps(sweeps)
    print(
        f"machine: a fixed Python loop, ms before / after each run: "
        f"{[(round(b), round(e)) for b, e in speed]} (a slower machine takes longer)"
    )


def report(results: list[dict], a: argparse.Namespace) -> None:
    speeds = [s["speed"] for s in results[0]["speeds"]]
    print(
        f"{'speed':>5} {'metric':<10} "
        + " ".join(f"{'run ' + str(i + 1):>9}" for i in range(len(results)))
        + f" {'median':>9} {'spread':>7}"
    )
    for k, speed in enumerate(speeds):
        for metric, key, q in (
            ("TTFT p95", "ttft_s", "p95"),
            ("TTFT p99", "ttft_s", "p99"),
            ("E2E p95", "e2e_s", "p95"),
            ("E2E p99", "e2e_s", "p99"),
            ("good", "good_share", None),
            ("late p99", "lateness_s", "p99"),
        ):
            vals = []
            for r in results:
                f = r["speeds"][k]["figures"]["*"]
                v = f[key] if q is None else (f[key] or {}).get(q)
                vals.append(float("nan") if v is None else v)
            med = float(np.nanmedian(vals))
            spread = (max(vals) - min(vals)) / med if med else float("nan")
            scale = 1 if q is None else 1000
            print(
                f"{speed:>5g} {metric:<10} "
                + " ".join(f"{v * scale:>9.1f}" if q else f"{v:>9.3f}" for v in vals)
                + (f" {med * scale:>9.1f}" if q else f" {med:>9.3f}")
                + f" {spread:>7.1%}"
            )
    broke = [
        next((s["speed"] for s in r["speeds"] if not s["figures"]["*"]["meets_slo"]), None) for r in results
    ]
    print(
        f"(ms; SLO: {a.ttft_target_s:g} s TTFT and {a.latency_target_s:g} s end to end for 90% of requests)"
    )
    print(
        f"SLO first broken at speed, per run: {broke}; highest speed meeting it, per run: "
        f"{[r['highest_speed_meeting_slo'] for r in results]}; load average {os.getloadavg()[0]:.1f}"
    )


def report_sweeps(sweeps: list[dict]) -> None:
    """Where each run's sweep found the SLO breaking (the command's verdicts: the majority of a
    speed's probes), and the highest speed meeting it."""

    def spread(xs: list) -> str:
        xs = [x for x in xs if x is not None]
        return f"{(max(xs) - min(xs)) / float(np.median(xs)):.1%}" if len(xs) > 1 else "n/a"

    best = [r["highest_speed_meeting_slo"] for r in sweeps]
    broke = [r["slo_broken_at_speed"] for r in sweeps]
    tried = [[s["speed"] for s in r["speeds"]] for r in sweeps]
    print(f"sweep: speeds tried per run {tried}")
    for i, r in enumerate(sweeps):
        for s in r["speeds"]:
            f = s["figures"]["*"]
            late = (f["lateness_s"] or {}).get("p99")
            rate = (
                f["achieved_rps"] / f["offered_rps"]
                if f["achieved_rps"] and f["offered_rps"]
                else float("nan")
            )
            why = (
                "meets"
                if f["meets_slo"]
                else ", ".join(
                    w
                    for w, yes in (
                        ("SLO broken", (f["good_share"] or 0) < MIN_GOOD),
                        ("generator-limited", f["generator_limited"]),
                    )
                    if yes
                )
            )
            print(
                f"  run {i + 1} speed {s['speed']:>8g} probe {s['probe'] + 1}: good {f['good_share'] or 0:.3f}, "
                f"E2E p95 {(f['e2e_s'] or {}).get('p95', float('nan')) * 1000:8.1f} ms, lateness p99 "
                f"{(late or float('nan')) * 1000:6.1f} ms, achieved/offered {rate:.3f}, completed "
                f"{f['completed_rps']:.0f}/s: {why}"
            )
    print(
        f"sweep: SLO broken at speed, per run: {broke} (spread {spread(broke)}); highest speed meeting it, "
        f"per run: {best} (spread {spread(best)}); load average {os.getloadavg()[0]:.1f}"
    )
    # where each run puts the break: the speeds its probes disagreed on, else between its highest
    # speed meeting the SLO and the one that broke it
    bands = [
        r.get("probes_disagree_between") or [r["highest_speed_meeting_slo"], r["slo_broken_at_speed"]]
        for r in sweeps
    ]
    whole = bool(bands) and all(None not in b for b in bands)
    lo, hi = (max(b[0] for b in bands), min(b[1] for b in bands)) if whole else (1.0, 0.0)
    print(
        f"sweep: where each run puts the break (its probes disagreed, or between met and broken): {bands}; "
        + (f"every run's band holds {lo:g}x to {hi:g}x" if lo <= hi else "no speed lies in every run's band")
    )


if __name__ == "__main__":
    main()
