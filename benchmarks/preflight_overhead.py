"""What the preflight adds to a healthy run: the demo's `routeopt run`, with and without it.

Each round runs `python -m routeopt.flows.cli run --no-progress` on the bundled demo fleet (five local
candidates: each loads its checkpoint and generates one token before the first suite) once with
the preflight and once with `--no-preflight`, in turn, each writing to a fresh folder, with one
Prefect home per variant that an untimed first run has migrated (cron on a host). Figures per
run: the seconds until the flow began (Prefect's "Beginning flow run" line: the probes run while
the Prefect server starts) and until the process ended; and, with the preflight, the seconds the
CLI spent probing (its `routeopt: preflight: ... answered in S s` line: model loads included, the
imports the run needs anyway too) and the probes' dollars as recorded in the run's `preflight`
table. On a shared machine the whole run's wall time varies by much more than the preflight
costs; the CLI's probing seconds bound what it can add (they overlap the server's start).

    flock /tmp/routeopt-bench.lock python benchmarks/preflight_overhead.py [--reps 3]

The last line holds the medians as key=value, with the load average before and after.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from benchmarks.run_startup import demo_config  # noqa: E402

VARIANTS = {"on": [], "off": ["--no-preflight"]}
PROBING = re.compile(r"routeopt: preflight: \d+ of \d+ candidates answered in ([\d.]+)s")


def one_run(home: Path, out: Path, flags: list[str]) -> tuple[float, float, float | None]:
    """(seconds until the flow began, until the process ended, that the CLI spent probing)."""
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.update(
        PYTHONPATH=str(REPO),
        PREFECT_HOME=str(home),
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "routeopt.flows.cli",
            "run",
            "--config",
            str(demo_config(out)),
            "--no-progress",
            *flags,
        ],
        cwd=out,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    began, probing, tail = None, None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        if began is None and "Beginning flow run" in line:
            began = time.perf_counter() - start
        found = PROBING.search(line)
        if found:
            probing = float(found.group(1))
        tail = (tail + [line])[-40:]
    wall = time.perf_counter() - start
    if proc.wait() != 0 or began is None:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{''.join(tail)}")
    return began, wall, probing


def probes(out: Path) -> tuple[float, float]:
    """(the slowest probe's seconds, the probes' dollars) of the run in `out`."""
    import duckdb

    with duckdb.connect(str(out / "routeopt.duckdb"), read_only=True) as con:
        slowest, cost = con.execute("SELECT max(latency_s), sum(cost_usd) FROM preflight").fetchone()
    return float(slowest or 0.0), float(cost or 0.0)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="routeopt-preflight-cost-"))
    load_before = os.getloadavg()
    began: dict[str, list[float]] = {v: [] for v in VARIANTS}
    wall: dict[str, list[float]] = {v: [] for v in VARIANTS}
    probing_s, probe_usd = [], []
    for variant, flags in VARIANTS.items():  # migrate each home's database first, untimed
        one_run(tmp / f"home-{variant}", tmp / f"warmup-{variant}", flags)
    for rep in range(args.reps):
        for variant, flags in VARIANTS.items():
            out = tmp / f"out-{variant}-{rep}"
            b, w, probing = one_run(tmp / f"home-{variant}", out, flags)
            began[variant].append(b)
            wall[variant].append(w)
            extra = ""
            if variant == "on":
                s, usd = probes(out)
                probing_s.append(probing or 0.0)
                probe_usd.append(usd)
                extra = f", CLI probing {probing:.1f} s (slowest probe call {s:.2f} s), probes ${usd:.3g}"
            print(
                f"round {rep + 1}: preflight {variant:<3} flow began {b:5.1f} s, ended {w:6.1f} s{extra}",
                flush=True,
            )
    load_after = os.getloadavg()
    med = {k: statistics.median(v) for k, v in wall.items()}
    med_began = {k: statistics.median(v) for k, v in began.items()}
    print(
        f"whole run: {med['on']:.1f} s with the preflight, {med['off']:.1f} s without "
        f"(+{med['on'] - med['off']:.1f} s); until the flow began: {med_began['on']:.1f} s vs "
        f"{med_began['off']:.1f} s; load average {load_before[0]:.1f} before, {load_after[0]:.1f} after "
        f"({os.cpu_count()} cores)"
    )
    print(
        " ".join(
            [f"wall_{k}_s={v:.1f}" for k, v in med.items()]
            + [f"began_{k}_s={v:.1f}" for k, v in med_began.items()]
            + [
                f"added_s={med['on'] - med['off']:.1f}",
                f"cli_probing_s={statistics.median(probing_s):.1f}",
                f"probes_usd={statistics.median(probe_usd):.3g}",
                f"load_before={load_before[0]:.1f}",
                f"load_after={load_after[0]:.1f}",
            ]
        )
    )


if __name__ == "__main__":
    main()
