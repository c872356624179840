"""Wall time of the demo's `routeopt run`, by how the Prefect API it reports to is provided.

Variants, run interleaved (--reps rounds, each variant once per round):

- before: the code at --before (Prefect starts its temporary server on first use, after the
  CLI's imports, and the flow waits for it);
- after:  this tree (routeopt starts the server tied to the CLI as soon as the config is valid,
  so its start overlaps the CLI's own imports);
- reuse:  this tree reporting to an already running `prefect server start` (PREFECT_API_URL):
  the most any reuse of one server across runs could save.

Each variant runs with a Prefect home kept across its runs ("warm": cron on one host, its
database already migrated) and with a new one per run ("fresh": a Kubernetes pod). Each run is
`python -m routeopt.flows.cli run --no-progress` on the bundled demo fleet (never replaying cached
answers: `--no-cache` for the code before that became the default), writing to a
temporary folder. Two figures per run: the seconds until the flow began (Prefect's "Beginning
flow run" line: imports, config, the server's start), which the variants differ in, and the
whole process's wall time, which adds the evaluation and training, noisy on a shared machine.

    python benchmarks/run_startup.py [--reps 3] [--before cc87f94] [--homes warm,fresh]
        [--variants before,after,reuse]

The last line holds the medians as key=value.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BEFORE = "cc87f94"  # the last commit where Prefect started (and orphaned) its own server


def export_tree(rev: str, dest: Path) -> Path:
    """The files of `rev` in `dest` (git archive: no worktree, nothing changed in the repo)."""
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev], check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def demo_config(out: Path) -> Path:
    """The bundled demo config with absolute paths, its state under `out`."""
    import yaml

    cfg = yaml.safe_load((REPO / "evals" / "demo" / "routeopt.yaml").read_text())
    for c in cfg["candidates"]:
        c["model"] = str(REPO / c["model"])
    cfg.update(
        suites_dir=str(REPO / cfg["suites_dir"]),
        db_path=str(out / "routeopt.duckdb"),
        registry_dir=str(out / "registry"),
        cache_dir=str(out / "cache"),
    )
    path = out / "routeopt.yaml"
    path.write_text(json.dumps(cfg))
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_prefect_server(home: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    env = {
        **os.environ,
        "PREFECT_HOME": str(home),
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "false",
    }
    env.pop("PREFECT_API_URL", None)
    proc = subprocess.Popen(
        ["prefect", "server", "start", "--host", "127.0.0.1", "--port", str(port)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    url = f"http://127.0.0.1:{port}/api"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as resp:
                if resp.status == 200:
                    return proc, url
        except OSError:
            time.sleep(0.5)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError("prefect server start did not answer within 180 s")


def one_run(code: Path, home: Path, out: Path, api_url: str | None) -> tuple[float, float]:
    """(seconds until the flow began, seconds until the process ended)."""
    out.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    # A busy machine outlasts Prefect's default 20 s start-up timeout: give every variant 180 s.
    env.update(
        PYTHONPATH=str(code),
        PREFECT_HOME=str(home),
        PREFECT_LOGGING_LEVEL="INFO",
        PREFECT_SERVER_ANALYTICS_ENABLED="false",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
    )
    if api_url:
        env["PREFECT_API_URL"] = api_url
    start = time.perf_counter()
    fresh = ["--no-cache"] if "--no-cache" in (code / "flows/commands/pipeline.py").read_text() else []
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "routeopt.flows.cli",
            "run",
            "--config",
            str(demo_config(out)),
            *fresh,
            "--no-progress",
        ],
        cwd=code,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    began, tail = None, []
    assert proc.stdout is not None
    for line in proc.stdout:
        if began is None and "Beginning flow run" in line:
            began = time.perf_counter() - start
        tail = (tail + [line])[-40:]
    wall = time.perf_counter() - start
    if proc.wait() != 0 or began is None:
        raise RuntimeError(f"run failed ({proc.returncode}):\n{''.join(tail)}")
    return began, wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--before", default=BEFORE, help="git revision of the 'before' code")
    ap.add_argument("--homes", default="warm,fresh", help="warm, fresh or both")
    ap.add_argument("--variants", default="before,after,reuse", help="which of before, after, reuse")
    args = ap.parse_args()
    homes = args.homes.split(",")
    variants = args.variants.split(",")
    unknown = set(variants) - {"before", "after", "reuse"}
    if unknown:
        raise SystemExit(f"--variants: unknown {sorted(unknown)}; choose from before, after, reuse")
    tmp = Path(tempfile.mkdtemp(prefix="routeopt-startup-"))
    codes = {v: export_tree(args.before, tmp / "before") if v == "before" else REPO for v in variants}
    server, api_url = start_prefect_server(tmp / "server-home") if "reuse" in variants else (None, None)
    times: dict[str, list[float]] = {f"{v}_{h}": [] for v in codes for h in homes}
    to_flow: dict[str, list[float]] = {f"{v}_{h}": [] for v in codes for h in homes}
    try:
        for rep in range(args.reps):
            for variant, code in codes.items():
                for regime in homes:
                    key = f"{variant}_{regime}"
                    home = tmp / ("home-" + (key if regime == "warm" else f"{key}-{rep}"))
                    home.mkdir(exist_ok=True)
                    if regime == "warm" and rep == 0:  # migrate its database first, untimed
                        one_run(code, home, tmp / f"warmup-{key}", api_url if variant == "reuse" else None)
                    began, wall = one_run(
                        code, home, tmp / f"out-{key}-{rep}", api_url if variant == "reuse" else None
                    )
                    times[key].append(wall)
                    to_flow[key].append(began)
                    print(
                        f"round {rep + 1}: {key:<13} flow began {began:5.1f} s, ended {wall:6.1f} s",
                        flush=True,
                    )
    finally:
        if server is not None:
            os.killpg(server.pid, signal.SIGTERM)
            server.wait(30)
    medians = {k: statistics.median(v) for k, v in times.items()}
    began = {k: statistics.median(v) for k, v in to_flow.items()}
    for regime in homes:
        for name, m in (("until the flow began", began), ("whole run", medians)):
            print(
                f"{regime} Prefect home, {name}: "
                + ", ".join(f"{v} {m[f'{v}_{regime}']:.1f} s" for v in variants)
            )
    print(
        " ".join(
            [f"{k}_began_s={v:.1f}" for k, v in began.items()]
            + [f"{k}_s={v:.1f}" for k, v in medians.items()]
        )
    )


if __name__ == "__main__":
    main()
