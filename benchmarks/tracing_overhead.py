"""What tracing costs: gateway decisions and the eval runner, tracing off against on.

On = every span sampled, the SDK's batch processor, and the OTLP/HTTP exporter sending to a real
receiver in another process (`tests/otlp_sink.py`, which decodes every request and counts the
spans, so a lost span would show), set up the way a gateway is: from the standard variables
(`OTEL_EXPORTER_OTLP_ENDPOINT`), so spans (decisions and the runner's calls) are built and exported by the export process
(common/tracing_export.py). Off = tracing paused: off as in a gateway without the extra.

Tracing is set up once; off is `tracing.paused()` (off as if never configured, the set-up kept),
so adjacent blocks differ only in tracing, with no exporter or process start-up between them.
Every block ends with a flush, so one block's spans are exported before the next is timed.

Decisions: `Gateway.route` (decision log, 1% exploration, the caller's traceparent) and the bare
`Router.route`, one thread. Each round times a block of `-n` decisions with tracing off and one
with it on, back to back, for each setup, swapping which state goes first every round; the
figures are medians over rounds of each block's p50/p99 and of on minus off within a round.
Short blocks, many rounds: these machines drift by tens of percent over seconds, more than the
effect measured, and only adjacent blocks see the same machine (blocks of 1,000 decisions with a
restart between them gave run-to-run spreads of 10 to 20 us). Runner: `evaluate_pair` against
the fake server in its own process (its call spans go to the export process too), one warm-up
pass, then blocks of `--calls` calls off and on back to back, `--runner-repeats` times, the order
swapped every time; the ratio is the median over rounds of on/off calls per s. Blocks of 2,000
calls over 7 rounds gave ratios from 0.84 to 0.97 for the same code; single rounds of 250 calls
still scatter by +-15% (this machine's speed moves by 25% within a minute), so the first line
also gives what one call's span costs by itself.

Besides each decision's own time (wall, and its thread's CPU), every block gives the process's
CPU time over the block and its flush, per decision: what tracing costs all the gateway's threads
(span building and encoding included when they run in-process), which bounds how many decisions a
process can make per second.

    python benchmarks/tracing_overhead.py [-n 200] [--repeats 101] [--calls 250] [--runner-repeats 41]
                                          [--export process|thread|discard]

`--export thread` builds, encodes and sends decision spans on a thread of the gateway's own
process (`ROUTEOPT_TRACING_EXPORT=thread`); `discard` does the same but drops every span at the
exporter, so the difference from `thread` is what encoding and sending cost the decisions from
their own process's other threads. The first line also gives what `record_decision` costs the
calling thread by itself.

The last lines are `added_p50_us=N added_p99_us=N` (Gateway.route, wall) and `runner_ratio=R`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("OMP_NUM_THREADS", "1")
REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from routeopt.common import tracing  # noqa: E402
from route_latency import build_policy, measure  # noqa: E402
from tests.otlp_sink import OtlpSink  # noqa: E402

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"


EXPORT = "process"


def tracing_on(sink: OtlpSink) -> None:
    """Tracing on as `--export` says, warmed up: a decision's span has gone the whole way (the
    export process started and imported its exporter) before any decision is timed."""
    from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

    class Discard(SpanExporter):
        def export(self, spans):  # type: ignore[no-untyped-def]
            return SpanExportResult.SUCCESS

    os.environ.update(
        {
            "OTEL_EXPORTER_OTLP_ENDPOINT": sink.url,
            "OTEL_BSP_MAX_QUEUE_SIZE": str(1 << 16),
            "ROUTEOPT_TRACING_EXPORT": "process" if EXPORT == "process" else "thread",
        }
    )
    tracing.configure(Discard(), max_queue_size=1 << 16) if EXPORT == "discard" else tracing.configure()
    tracing.record_decision(None, time.time_ns(), {"routeopt.decision.model": "warm-up"})
    tracing.flush(30)


def state(name: str) -> Any:
    """The block's tracing state: on is the set-up as configured, off is it paused."""
    return contextlib.nullcontext() if name == "on" else tracing.paused()


def caller_cost(n: int = 20_000) -> float:
    """What `record_decision` (no parent) costs the calling thread alone: its CPU time per
    call, in microseconds, tracing on."""
    attrs = {"routeopt.decision.model": "m", "routeopt.policy.version": 1}
    start = time.thread_time_ns()
    for _ in range(n):
        tracing.record_decision(None, time.time_ns(), attrs)
    return (time.thread_time_ns() - start) / n / 1000


def call_span_cost(n: int = 5_000) -> tuple[float, float]:
    """What one eval call's span costs, as the runner records it (started, the request's,
    call's and grade's attributes, two events, ended) with no call in between: CPU per span on
    the calling thread, and in this process over all its threads once exported, microseconds."""
    from routeopt.evals.config import Candidate
    from routeopt.evals.execution import spans
    from routeopt.evals.providers.base import Completion
    from routeopt.evals.storage.store import Outcome

    cand = Candidate(
        name="bench",
        provider="openai",
        model="bench",
        base_url="http://127.0.0.1:9/v1",
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
    )
    answer = Completion(
        text="42",
        input_tokens=30,
        output_tokens=5,
        latency_s=0.01,
        ttft_s=0.004,
        finish_reason="stop",
        streamed=True,
    )
    row = Outcome(
        run_id="r", suite="s", suite_version="1", item_id="i1", candidate="bench", passed=True, score=1.0
    )
    tracing.flush(30)
    thread, process = time.thread_time(), _process_cpu_s()
    for _ in range(n):
        span = spans.start_call(cand, "answer", {"routeopt.suite": "s", "routeopt.item_id": "i1"})
        with tracing.use(span):
            span.set_attributes({"gen_ai.request.max_tokens": 64, "gen_ai.request.temperature": 0.0})
            spans.record_call(span, answer, None, 1, 0.0001)
        spans.record_outcome(span, row)
        tracing.ids(span)
        span.end()
    thread = time.thread_time() - thread
    tracing.flush(30)
    return thread / n * 1e6, (_process_cpu_s() - process) / n * 1e6


def decisions(n: int, repeats: int, tmp: Path) -> dict[str, dict[str, list[float]]]:
    from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway
    from routeopt.artifacts.serving.loader import load

    registry, public, prompts, what = build_policy(tmp, "auto")
    router = load(registry, public, state_dir=False)
    gateway = Gateway(
        router, log=DecisionLog(tmp / "logs", max_queue=1 << 20), exploration=Exploration(rate=0.01, seed=0)
    )
    routes = {"router": router.route, "gateway": lambda p, s: gateway.route(p, s, traceparent=PARENT)}
    print(
        f"{what}: {len(prompts)} prompts, {repeats} rounds of {n} decisions per setup and state, "
        f"load average {os.getloadavg()[0]:.1f}"
    )
    figures: dict[str, dict[str, list[float]]] = {}
    for i in range(repeats):
        for name, route in routes.items():
            # off and on back to back, their order swapped every round: the machine's own drift
            # over seconds (larger than the effect here) falls on both states alike
            for on_off in ("off", "on") if i % 2 == 0 else ("on", "off"):
                with state(on_off):
                    used = time.process_time()
                    wall, cpu = measure(route, prompts, n, warmup=50)
                    tracing.flush(30)  # its spans are built and sent before the next block is timed
                    used = (time.process_time() - used) / (n + 50) * 1e6
                row = figures.setdefault(f"{name} {on_off}", {})
                row.setdefault("process cpu", []).append(used)
                for clock, xs in (("wall", wall), ("cpu", cpu)):
                    for q, v in zip((50, 99), np.percentile(xs, [50, 99])):
                        row.setdefault(f"{clock} p{q}", []).append(float(v))
    gateway.close()
    return figures


async def _runner(suite, base_url: str, db: Path) -> float:
    from routeopt.evals.config import Candidate
    from routeopt.evals.execution.limits import CircuitBreaker, EndpointLimits, RateLimiter
    from routeopt.evals.execution.runner import evaluate_pair
    from routeopt.evals.storage.store import Store

    cand = Candidate(
        name="bench",
        provider="openai",
        model="bench",
        base_url=base_url,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
        max_concurrency=64,
        timeout_s=60,
    )
    with Store(db) as store:
        started = time.perf_counter()
        stats = await evaluate_pair(
            suite,
            cand,
            db.stem,
            store.write_outcomes,
            limits=EndpointLimits(RateLimiter(), CircuitBreaker(base_url)),
        )
        wall = time.perf_counter() - started
    assert stats.completed == len(suite.items) and stats.errors == 0, stats
    return len(suite.items) / wall


def _process_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def runner(calls: int, repeats: int, tmp: Path) -> dict[str, list[float]]:
    """Calls per second of each block (`off`, `on`), and this process's CPU per call, all its
    threads, the block's flush included (`off cpu`, `on cpu`)."""
    from routeopt.evals.suite.spec import load_suite
    from tests.fake_llm import FakeLLMProcess, write_arithmetic_suite

    suite = load_suite(write_arithmetic_suite(tmp / "suite", calls, name="bench"))
    rates: dict[str, list[float]] = {"off": [], "on": [], "off cpu": [], "on cpu": []}
    with FakeLLMProcess() as server:
        with state("on"):  # a warm-up, not counted: the first pass runs 30 to 50% slower
            asyncio.run(_runner(suite, server.openai_base_url, tmp / "warm-up.duckdb"))
        tracing.flush(30)
        for i in range(repeats):
            for on_off in ("off", "on") if i % 2 == 0 else ("on", "off"):
                cpu = _process_cpu_s()
                with state(on_off):
                    rates[on_off].append(
                        asyncio.run(_runner(suite, server.openai_base_url, tmp / f"r{i}-{on_off}.duckdb"))
                    )
                tracing.flush(30)
                rates[f"{on_off} cpu"].append((_process_cpu_s() - cpu) / calls * 1e6)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("-n", type=int, default=200, help="decisions per timed block")
    ap.add_argument("--repeats", type=int, default=101, help="rounds (each: off and on, every setup)")
    ap.add_argument("--calls", type=int, default=250, help="eval calls per runner block")
    ap.add_argument("--runner-repeats", type=int, default=41, help="runner rounds (each: off and on)")
    ap.add_argument("--only", choices=("decisions", "runner"), help="measure one of the two only")
    ap.add_argument(
        "--export",
        choices=("process", "thread", "discard"),
        default="process",
        help="where decision spans are built and sent (discard: built on a thread, then dropped)",
    )
    args = ap.parse_args()
    global EXPORT
    EXPORT = args.export
    with tempfile.TemporaryDirectory(prefix="tracing-overhead-") as tmp, OtlpSink() as sink:
        tracing_on(sink)
        caller_us = caller_cost()
        span_us = call_span_cost()
        figures = decisions(args.n, args.repeats, Path(tmp)) if args.only != "runner" else {}
        rates = runner(args.calls, args.runner_repeats, Path(tmp)) if args.only != "decisions" else {}
        tracing.flush(30)
        s = tracing.status()  # what the set-up dropped or failed to export over the whole run
        tracing.disable()
        time.sleep(0.5)
        received = sink.count()
    print(
        f"export: {args.export}; record_decision on the calling thread: {caller_us:.1f} us CPU a call; "
        f"an eval call's span: {span_us[0]:.1f} us CPU on the calling thread, {span_us[1]:.1f} us in the process"
    )
    if figures:
        report_decisions(figures, args.repeats)
    print(
        f"spans received by the collector: {received['spans']} in {received['requests']} requests; "
        f"dropped {s.dropped}, export failures {s.export_failed}; load average {os.getloadavg()[0]:.1f}"
    )
    if rates:
        ratios = np.array(rates["on"]) / np.array(rates["off"])
        cpu = float(np.median(np.array(rates["on cpu"]) - np.array(rates["off cpu"])))
        print(f"runner calls/s off {[round(r) for r in rates['off']]}, on {[round(r) for r in rates['on']]}")
        print(
            f"runner on/off by round: quartiles {np.percentile(ratios, 25):.3f} / {np.median(ratios):.3f} / "
            f"{np.percentile(ratios, 75):.3f}; the process's CPU a call: off {np.median(rates['off cpu']):.0f} us, "
            f"tracing adds {cpu:+.0f} us"
        )
    if figures:
        g = _added(figures, "gateway", "wall p50"), _added(figures, "gateway", "wall p99")
        print(f"added_p50_us={g[0]:.1f} added_p99_us={g[1]:.1f}")
    if rates:
        print(f"runner_ratio={float(np.median(ratios)):.3f}")


def _added(figures: dict, name: str, key: str) -> float:
    return float(np.median(np.array(figures[f"{name} on"][key]) - np.array(figures[f"{name} off"][key])))


def report_decisions(figures: dict, repeats: int) -> None:
    print(f"medians over {repeats} rounds, microseconds")
    print(f"{'setup':<14} {'wall p50':>9} {'wall p99':>9} {'cpu p50':>8} {'cpu p99':>8}")
    for name, row in figures.items():
        med = {k: float(np.median(v)) for k, v in row.items()}
        print(
            f"{name:<14} {med['wall p50']:>9.1f} {med['wall p99']:>9.1f} {med['cpu p50']:>8.1f} {med['cpu p99']:>8.1f}"
        )
    for name in ("router", "gateway"):
        print(
            f"{name}: tracing adds {_added(figures, name, 'wall p50'):.1f} us p50, "
            f"{_added(figures, name, 'wall p99'):.1f} us p99 (CPU {_added(figures, name, 'cpu p50'):.1f} / "
            f"{_added(figures, name, 'cpu p99'):.1f}); the process's CPU a decision, all its threads: "
            f"{_added(figures, name, 'process cpu'):+.1f} us"
        )


if __name__ == "__main__":
    main()
