"""Runner throughput vs a bare httpx loop, against the fake server answering at once.

Both send the same streamed Chat Completions requests to the same fake server, running in its
own process (so it does not share the client's GIL), at the same concurrency. The runner path is
the full one: OpenAI SDK, limiter and breaker, grading, and DuckDB writes in batches. The
bare loop only sends each request and reads the whole SSE body. Target: runner/bare >= 0.7.

    python benchmarks/runner_throughput.py --calls 5000 --concurrency 64

Also printed: client CPU seconds per call, because if the server is the bottleneck both paths
hit the same ceiling and the ratio alone says little.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.fake_llm import FakeLLMProcess, write_arithmetic_suite  # noqa: E402


async def bare_loop(base_url: str, bodies: list[dict], concurrency: int) -> int:
    """The floor: httpx, `concurrency` workers, read each stream to the end; returns bytes read."""
    import httpx

    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    total = 0
    async with httpx.AsyncClient(base_url=base_url, limits=limits, timeout=60) as client:

        async def worker() -> None:
            nonlocal total
            while not queue.empty():
                body = queue.get_nowait()
                async with client.stream(
                    "POST", "/chat/completions", json=body, headers={"Authorization": "Bearer x"}
                ) as resp:
                    resp.raise_for_status()
                    total += len(await resp.aread())

        await asyncio.gather(*(worker() for _ in range(concurrency)))
    return total


async def sdk_loop(base_url: str, bodies: list[dict], concurrency: int) -> int:
    """The official SDK alone (no runner): what the provider layer costs by itself."""
    import openai

    queue: asyncio.Queue[dict] = asyncio.Queue()
    for b in bodies:
        queue.put_nowait(b)
    client = openai.AsyncOpenAI(base_url=base_url, api_key="x", max_retries=0)
    chunks = 0

    async def worker() -> None:
        nonlocal chunks
        while not queue.empty():
            body = dict(queue.get_nowait())
            body.pop("stream")
            stream = await client.chat.completions.create(**body, stream=True)
            async for _ in stream:
                chunks += 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    await client.close()
    return chunks


def request_bodies(suite, model: str) -> list[dict]:
    bodies = []
    for item in suite.items:
        req = suite.request(item)
        bodies.append(
            {
                "model": model,
                "messages": [{"role": m.role, "content": m.content} for m in req.messages],
                "max_tokens": req.settings.max_tokens,
                "temperature": req.settings.temperature,
                "stream": True,
                "stream_options": {"include_usage": True},
            }
        )
    return bodies


async def runner_path(suite, base_url: str, concurrency: int, db: Path, provider: str):
    from routeopt.evals.config import Candidate
    from routeopt.evals.execution.limits import CircuitBreaker, EndpointLimits, RateLimiter
    from routeopt.evals.execution.runner import evaluate_pair
    from routeopt.evals.storage.store import Store

    cand = Candidate(
        name=f"bench-{provider}",
        provider=provider,
        model="bench",
        base_url=base_url,
        input_price_per_mtok=1.0,
        output_price_per_mtok=2.0,
        max_concurrency=concurrency,
        timeout_s=60,
    )
    limits = EndpointLimits(RateLimiter(), CircuitBreaker(base_url))
    with Store(db) as store:
        stats = await evaluate_pair(suite, cand, "bench", store.write_outcomes, limits=limits)
        rows = store.query("SELECT count(*) AS n, sum(passed::INT) AS ok FROM outcomes").iloc[0]
    return stats, int(rows.n), int(rows.ok)


def timed(fn) -> tuple[object, float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - wall, time.process_time() - cpu


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=5000)
    ap.add_argument("--concurrency", type=int, default=64)
    ap.add_argument("--provider", choices=["openai", "anthropic"], default="openai")
    ap.add_argument("--json", action="store_true", help="print one JSON line instead of text")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp, FakeLLMProcess() as server:
        from routeopt.evals.suite.spec import load_suite

        suite = load_suite(write_arithmetic_suite(Path(tmp), a.calls, name="bench"))
        bodies = request_bodies(suite, "bench")
        asyncio.run(bare_loop(server.openai_base_url, bodies[:200], a.concurrency))  # warm-up
        nbytes, bare_wall, bare_cpu = timed(
            lambda: asyncio.run(bare_loop(server.openai_base_url, bodies, a.concurrency))
        )
        _, sdk_wall, sdk_cpu = timed(
            lambda: asyncio.run(sdk_loop(server.openai_base_url, bodies, a.concurrency))
        )
        base = server.openai_base_url if a.provider == "openai" else server.anthropic_base_url
        (stats, n, ok), run_wall, run_cpu = timed(
            lambda: asyncio.run(
                runner_path(suite, base, a.concurrency, Path(tmp) / "bench.duckdb", a.provider)
            )
        )
    assert n == a.calls and stats.errors == 0, (n, stats)
    result = {
        "calls": a.calls,
        "concurrency": a.concurrency,
        "provider": a.provider,
        "bare_calls_per_s": a.calls / bare_wall,
        "runner_calls_per_s": a.calls / run_wall,
        "ratio": bare_wall / run_wall,
        "sdk_calls_per_s": a.calls / sdk_wall,
        "ratio_vs_sdk": sdk_wall / run_wall,
        "sdk_cpu_ms_per_call": 1000 * sdk_cpu / a.calls,
        "bare_cpu_ms_per_call": 1000 * bare_cpu / a.calls,
        "runner_cpu_ms_per_call": 1000 * run_cpu / a.calls,
        "passed": ok,
        "rows": n,
    }
    if a.json:
        print(json.dumps(result))
        return
    print(
        f"bare httpx loop : {result['bare_calls_per_s']:8.0f} calls/s  "
        f"({result['bare_cpu_ms_per_call']:.2f} ms client CPU/call)"
    )
    print(
        f"bare openai SDK : {result['sdk_calls_per_s']:8.0f} calls/s  "
        f"({result['sdk_cpu_ms_per_call']:.2f} ms client CPU/call)"
    )
    print(
        f"full runner     : {result['runner_calls_per_s']:8.0f} calls/s  "
        f"({result['runner_cpu_ms_per_call']:.2f} ms client CPU/call; {ok}/{n} graded pass, "
        f"rows in DuckDB)"
    )
    print(
        f"ratio runner/bare httpx: {result['ratio']:.2f}  (target >= 0.7); "
        f"runner/bare SDK: {result['ratio_vs_sdk']:.2f}"
    )


if __name__ == "__main__":
    main()
