"""Pass rate per task x difficulty x candidate for the demo fleet, through the local provider.

Runs the three demo suites against zoo-s, zoo-m, zoo-l and zoo-l int8 exactly as the pipeline
would (batched local provider, suite prompts, suite graders) and prints the table plus the wall
time of generation per candidate. Usage: `nice python benchmarks/zoo_fleet.py [--max-batch 64]`.
"""

from __future__ import annotations

import argparse
import asyncio
import time
from collections import defaultdict
from pathlib import Path

from routeopt.evals.config import Candidate
from routeopt.evals.providers.local.provider import LocalProvider
from routeopt.evals.suite.spec import load_suite

REPO = Path(__file__).resolve().parents[1]
FLEET = [("zoo-s", "fp32"), ("zoo-m", "fp32"), ("zoo-l", "fp32"), ("zoo-l", "int8")]


async def run_candidate(name: str, variant: str, suites: list, max_batch: int) -> tuple[dict, float, int]:
    cand = Candidate(
        name=f"{name}-{variant}",
        provider="local",
        model=str(REPO / "evals/demo/zoo" / name),
        variant=variant,
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=max_batch,
    )
    provider = LocalProvider(cand, max_batch=max_batch)
    await provider.generate(suites[0].request(suites[0].items[0]))  # load outside the timing
    passed: dict[tuple[str, int], list[int]] = defaultdict(list)
    out_tokens = 0
    t0 = time.perf_counter()
    for suite in suites:
        completions = await asyncio.gather(*(provider.generate(suite.request(i)) for i in suite.items))
        for item, c in zip(suite.items, completions):
            grade = await suite.grader.grade(c.text, item.fields)
            passed[(suite.name, int(item.fields["difficulty"]))].append(int(grade.passed))
            out_tokens += c.output_tokens or 0
    wall = time.perf_counter() - t0
    await provider.aclose()
    return {k: sum(v) / len(v) for k, v in passed.items()}, wall, out_tokens


async def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max-batch", type=int, default=64)
    args = parser.parse_args()
    suites = [load_suite(REPO / "evals/suites" / f"{t}.yaml") for t in ("reverse", "sort", "add")]
    n_items = sum(len(s.items) for s in suites)
    total = 0.0
    for name, variant in FLEET:
        rates, wall, toks = await run_candidate(name, variant, suites, args.max_batch)
        total += wall
        overall = sum(rates.values()) / len(rates)
        print(
            f"{name} {variant}: {n_items} items in {wall:.1f}s ({toks / wall:.0f} output tok/s), "
            f"mean pass rate {overall:.2f}"
        )
        for suite in suites:
            cells = " ".join(f"d{d}={rates[(suite.name, d)]:.2f}" for d in range(1, 7))
            print(f"    {suite.name:8s} {cells}")
    print(f"total generation wall time, 4 candidates x {n_items} items: {total:.1f}s")


if __name__ == "__main__":
    asyncio.run(main())
