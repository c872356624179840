"""Decision service throughput and latency: closed-loop load from wrk at several concurrencies.

    flock /tmp/routeopt-bench.lock python benchmarks/gateway_service.py [--policies routerbench,demo]
        [--concurrency 1,2,4,16,64] [--duration 8] [--runs 3] [--server gateway-venv|here] [--log]
        [--workers N]

What runs:

- the policies: RouterBench's, trained from ../shared/data/routerbench/train.parquet through the
  command line as a user does (`routeopt import outcomes`, `routeopt train`; 11 candidates), and
  the demo fleet's, published by `routeopt run` in this checkout (`.routeopt/registry`);
- the service: `routeopt-gateway serve --workers N` (default: one per CPU) from a fresh
  gateway-only install with its WebAssembly kernel (`pip install './gateways/python[fast]'` into
  a temporary virtualenv, what a gateway image runs), or with `--server here` `routeopt gateway serve` from this checkout's
  environment;
- the load: wrk (Debian's `wrk`), one thread, C connections each sending its next request as soon
  as the previous answer arrives (closed loop), cycling through the set's test prompts as OpenAI
  chat bodies with their suite. wrk is C: its own cost per request is a few microseconds, so the
  Python service, not the load generator, is what the figures measure; it records every latency
  (HdrHistogram) and its Lua `done` hook prints p50/p90/p99/p99.9;
- per (policy, concurrency): `--runs` runs, interleaved, and the medians, with the load average
  before and after, and the service's CPU time per request (/proc: user + system).

Little's law bounds what closed-loop load can show: with C clients, throughput = C / mean latency,
so 8,000 decisions/s needs a mean latency <= C / 8,000 s (0.25 ms at C = 2), and p99 <= 2 ms at
64 clients would need 32,000/s. The script prints, per policy, the concurrencies at which
8,000 decisions/s with p99 <= 2 ms are met, if any.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from router_data import data_dir  # noqa: E402

REQUESTS_LUA = r"""
local bodies = dofile("BODIES")
local i = 0
request = function()
  i = i % #bodies + 1
  return wrk.format("POST", "/v1/route", {["Content-Type"] = "application/json"}, bodies[i])
end
"""
DONE_LUA = r"""
done = function(summary, latency, requests)
  io.write(string.format('{"requests": %d, "duration_us": %d, "errors": %d, "non2xx": %d, ' ..
    '"p50": %d, "p90": %d, "p99": %d, "p999": %d, "mean": %f}\n',
    summary.requests, summary.duration, summary.errors.connect + summary.errors.read +
    summary.errors.write + summary.errors.timeout, summary.errors.status,
    latency:percentile(50), latency:percentile(90), latency:percentile(99), latency:percentile(99.9),
    latency.mean))
end
"""


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def cli(*args: str, cwd: Path = ROOT) -> str:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "routeopt.flows.cli", *args], cwd=cwd, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        raise SystemExit(f"routeopt {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def routerbench_policy(tmp: Path) -> tuple[Path, Path, list[tuple[str, str | None]]]:
    """Train and publish the RouterBench policy through the CLI; its test prompts to send."""
    import pandas as pd

    from routeopt.artifacts.publish.signing_keys import generate_keys

    data = data_dir() / "routerbench"
    private, public = generate_keys(tmp / "keys")
    db, registry = tmp / "rb.duckdb", tmp / "rb-registry"
    cli("import", "outcomes", str(data / "train.parquet"), "--db", str(db))
    cli("train", "--db", str(db), "--registry", str(registry), "--signing-key", str(private))
    test = pd.read_parquet(data / "test.parquet").drop_duplicates("request_id")
    return registry, public, list(zip(test["prompt"].astype(str), test["suite"].astype(str)))


def demo_policy() -> tuple[Path, Path, list[tuple[str, str | None]]]:
    """The demo fleet's policy and prompts, as `routeopt run` left them in this checkout."""
    from routeopt.evals.config import load_config
    from routeopt.evals.storage.store import Store

    config = load_config(ROOT / "evals" / "demo" / "routeopt.yaml")
    registry, public = config.registry_dir, config.signing_key_path().with_name("public_key.pem")
    if not (registry / "channels").is_dir() or not config.db_path.exists():
        raise SystemExit("no demo policy: run `routeopt run` in this checkout first")
    frame = Store(config.db_path, read_only=True).training_frame().drop_duplicates("request_id")
    return registry, public, list(zip(frame["prompt"].astype(str), frame["suite"].astype(str)))


def lua_bodies(prompts: list[tuple[str, str | None]], path: Path) -> None:
    """A Lua file returning the request bodies, each in a long bracket no prompt can close."""
    parts = []
    for prompt, suite in prompts:
        body = json.dumps(
            {
                "model": "routeopt",
                "messages": [{"role": "user", "content": prompt}],
                "metadata": {"routeopt_suite": suite},
            }
        )
        level = 0
        while f"]{'=' * level}]" in body:
            level += 1
        parts.append(f"[{'=' * level}[{body}]{'=' * level}]")
    path.write_text("return {\n" + ",\n".join(parts) + "\n}\n", encoding="utf-8")


def gateway_venv(tmp: Path) -> Path:
    venv = tmp / "gateway-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    subprocess.run(
        [str(venv / "bin" / "pip"), "install", "-q", f"{ROOT / 'gateways' / 'python'}[fast]"],
        check=True,
        cwd=ROOT,
    )
    return venv


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Service:
    """The decision service in its own process, serving one policy."""

    def __init__(
        self, command: list[str], registry: Path, public: Path, tmp: Path, log: bool, workers: int = 1
    ) -> None:
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
        if command[0] == sys.executable:
            env["PYTHONPATH"] = str(ROOT)
        env.update(
            ROUTEOPT_POLICY=str(registry),
            ROUTEOPT_PUBLIC_KEY=str(public),
            ROUTEOPT_STATE_DIR=str(tmp / "state"),
            OMP_NUM_THREADS="1",
            ROUTEOPT_REFRESH_S="30",
        )
        if log:
            env["ROUTEOPT_DECISION_LOG_DIR"] = str(tmp / "decisions")
        self.proc = subprocess.Popen(
            [*command, "--port", str(self.port), "--workers", str(workers)], env=env, cwd=tmp
        )
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/readyz", timeout=2).close()
                return
            except OSError:
                if self.proc.poll() is not None:
                    raise SystemExit(f"the service exited with {self.proc.returncode}") from None
                time.sleep(0.2)
        raise SystemExit("the service did not become ready")

    def cpu_s(self) -> float:
        """User + system seconds of the service and its workers."""
        pid = self.proc.pid
        children = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
        total = 0
        for p in (pid, *children):
            fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)


def wrk(port: int, script: Path, connections: int, duration: float, path: str = "") -> dict:
    out = subprocess.run(
        [
            "wrk",
            "-t1",
            f"-c{connections}",
            f"-d{duration:g}s",
            "--timeout",
            "5s",
            "-s",
            str(script),
            f"http://127.0.0.1:{port}{path}",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    result = json.loads(next(line for line in out.splitlines() if line.startswith("{")))
    result["rps"] = result["requests"] / (result["duration_us"] / 1e6)
    return result


def measure(
    service: Service, script: Path, levels: list[int], duration: float, runs: int, floor: Path
) -> dict[int | str, list[dict]]:
    """Per concurrency, one result per run; under "floor", GET /healthz at 2 clients: what the
    HTTP server alone costs (the server, the parser, the socket), measured in the same rounds."""
    wrk(service.port, script, 4, 2.0)  # warm-up: connections, caches, the first decisions
    results: dict[int | str, list[dict]] = {c: [] for c in (*levels, "floor")}
    for _ in range(runs):
        for c in (*levels, "floor"):  # interleaved, so a burst of load elsewhere hits every level alike
            before = service.cpu_s()
            r = (
                wrk(service.port, floor, 2, duration, "/healthz")
                if c == "floor"
                else wrk(service.port, script, c, duration)
            )
            r["cpu_us"] = (service.cpu_s() - before) / max(r["requests"], 1) * 1e6
            r["load"] = load_average()
            results[c].append(r)
    return results


def report(name: str, results: dict[int, list[dict]]) -> None:
    med = lambda rs, k: statistics.median(r[k] for r in rs)  # noqa: E731
    print(f"\n{name}: medians of {len(next(iter(results.values())))} runs (load average at each run's end)")
    print(
        f"{'clients':>7} {'decisions/s':>11} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'p99.9 ms':>8} "
        f"{'CPU us/req':>10} {'errors':>6}  load"
    )
    met = []
    for c, rs in results.items():
        rps, p99 = med(rs, "rps"), med(rs, "p99") / 1000
        errors = sum(r["errors"] + r["non2xx"] for r in rs)
        if c == "floor":
            print(
                f"HTTP floor, GET /healthz at 2 clients (answers/s, not decisions): {rps:,.0f}/s, p99 {p99:.2f} ms, "
                f"CPU {med(rs, 'cpu_us'):.0f} us/req"
            )
            continue
        print(
            f"{c:>7} {rps:>11,.0f} {med(rs, 'p50') / 1000:>7.2f} {med(rs, 'p90') / 1000:>7.2f} {p99:>7.2f} "
            f"{med(rs, 'p999') / 1000:>8.2f} {med(rs, 'cpu_us'):>10.0f} {errors:>6}  {' | '.join(r['load'] for r in rs)}"
        )
        if rps >= 8000 and p99 <= 2.0:
            met.append(c)
    print(
        f"8,000/s with p99 <= 2 ms: {'met at ' + ', '.join(map(str, met)) + ' clients' if met else 'not met'} "
        f"(Little's law: at 64 clients, p99 <= 2 ms would need ~32,000/s)"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--policies", default="routerbench,demo")
    ap.add_argument("--concurrency", default="1,2,4,16,64")
    ap.add_argument("--duration", type=float, default=8.0)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--server", choices=("gateway-venv", "here"), default="gateway-venv")
    ap.add_argument("--log", action="store_true", help="write decision logs (ROUTEOPT_DECISION_LOG_DIR)")
    ap.add_argument(
        "--workers",
        type=int,
        default=os.cpu_count() or 1,
        help="the service's --workers (default: one per CPU)",
    )
    args = ap.parse_args()
    if shutil.which("wrk") is None:
        raise SystemExit("needs wrk: apt-get install wrk")
    levels = [int(c) for c in args.concurrency.split(",")]
    print(
        f"load average at start: {load_average()} on {os.cpu_count()} CPUs; server: {args.server}, "
        f"{args.workers} worker(s); decision logs: {'on' if args.log else 'off'}"
    )
    with tempfile.TemporaryDirectory(prefix="gateway-service-bench-") as name:
        tmp = Path(name)
        command = (
            [str(gateway_venv(tmp) / "bin" / "routeopt-gateway"), "serve"]
            if args.server == "gateway-venv"
            else [sys.executable, "-m", "routeopt.flows.cli", "gateway", "serve"]
        )
        for policy in args.policies.split(","):
            work = tmp / policy
            work.mkdir()
            registry, public, prompts = routerbench_policy(work) if policy == "routerbench" else demo_policy()
            script, floor = work / "load.lua", work / "floor.lua"
            lua_bodies(prompts, work / "bodies.lua")
            script.write_text(REQUESTS_LUA.replace("BODIES", str(work / "bodies.lua")) + DONE_LUA)
            floor.write_text(DONE_LUA)
            service = Service(command, registry, public, work, args.log, args.workers)
            try:
                results = measure(service, script, levels, args.duration, args.runs, floor)
            finally:
                service.stop()
            mean_chars = statistics.mean(len(p) for p, _ in prompts)
            report(
                f"{policy} policy ({len(prompts)} prompts, {mean_chars:,.0f} characters on average)", results
            )
    print(f"\nload average at end: {load_average()}")


if __name__ == "__main__":
    main()
