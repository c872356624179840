"""Speculative decoding on the demo fleet: zoo-l verified with a draft (zoo-s by default)
against zoo-l alone, through the local provider's continuous batcher, on every item of the demo
suites (evals/suites/{add,reverse,sort}.yaml, greedy) at several concurrencies.

Prints per concurrency: the draft's acceptance rate (accepted / proposed tokens), the mean
accepted length (tokens per target pass), output tokens/s with and without the draft, the
speed-up, and TTFT / TPOT p50. Each repeat runs both candidates at each level, interleaved;
figures are medians over repeats. Answers must be identical with and without the draft.

    ROUTEOPT_TORCH_THREADS=1 python benchmarks/speculative.py
    ROUTEOPT_TORCH_THREADS=1 python benchmarks/speculative.py --draft zoo-m --k 2 --repeats 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

ZOO = REPO / "evals" / "demo" / "zoo"
SUITES = ("add", "reverse", "sort")


def demo_requests(suites: list[str]) -> list[Any]:
    from routeopt.evals.suite.spec import load_suite

    out = []
    for name in suites:
        suite = load_suite(REPO / "evals" / "suites" / f"{name}.yaml")
        out += [suite.request(item) for item in suite.items]
    return out


def candidates(draft: str, k: int, max_batch: int) -> tuple[Any, Any]:
    from routeopt.evals.config import Candidate

    base = dict(
        provider="local",
        model=str(ZOO / "zoo-l"),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=2.0,
        max_concurrency=max_batch,
        timeout_s=600,
    )
    spec = {"model": str(ZOO / draft), "num_speculative_tokens": k}
    return (Candidate(name="zoo-l", **base), Candidate(name=f"zoo-l.draft-{draft}", speculative=spec, **base))


async def one_repeat(pair: tuple[Any, Any], requests: list[Any], levels: list[int]) -> dict:
    """Both candidates at every level, interleaved; {level: {name: LevelResult}}."""
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import bench_serving

    providers = [LocalProvider(c, max_batch=max(levels)) for c in pair]
    out: dict[int, dict[str, Any]] = {}
    try:
        for c in levels:
            for cand, provider in zip(pair, providers):
                report = await bench_serving(cand, requests, [c], len(requests), provider=provider, warmup=2)
                out.setdefault(c, {})[cand.name] = report.levels[0]
    finally:
        for p in providers:
            await p.aclose()
    return out


def same_answers(pair: tuple[Any, Any], requests: list[Any]) -> bool:
    from routeopt.evals.providers.local.provider import LocalProvider

    async def answers(cand: Any) -> list[str]:
        provider = LocalProvider(cand)
        try:
            return [c.text for c in await asyncio.gather(*(provider.generate(r) for r in requests))]
        finally:
            await provider.aclose()

    return asyncio.run(answers(pair[0])) == asyncio.run(answers(pair[1]))


def summarize(runs: list[dict], pair: tuple[Any, Any]) -> list[dict]:
    base, spec = (c.name for c in pair)
    rows = []
    for c in runs[0]:

        def med(name: str, f: Any, c: int = c) -> float:
            return statistics.median(f(r[c][name]) for r in runs)

        rows.append(
            {
                "concurrency": c,
                "acceptance_rate": round(med(spec, lambda lv: lv.acceptance_rate), 3),
                "mean_accepted_length": round(med(spec, lambda lv: lv.mean_accepted_length), 2),
                "tok_s_without": round(med(base, lambda lv: lv.output_tok_s), 1),
                "tok_s_with": round(med(spec, lambda lv: lv.output_tok_s), 1),
                "speedup": round(
                    statistics.median(r[c][spec].output_tok_s / r[c][base].output_tok_s for r in runs), 2
                ),
                "ttft_p50_ms_without": round(med(base, lambda lv: lv.ttft_s["p50"]) * 1e3, 2),
                "ttft_p50_ms_with": round(med(spec, lambda lv: lv.ttft_s["p50"]) * 1e3, 2),
                "tpot_p50_ms_without": round(med(base, lambda lv: lv.tpot_s["p50"]) * 1e3, 2),
                "tpot_p50_ms_with": round(med(spec, lambda lv: lv.tpot_s["p50"]) * 1e3, 2),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--draft", default="zoo-s", choices=["zoo-s", "zoo-m"])
    ap.add_argument("--k", type=int, default=3, help="num_speculative_tokens")
    ap.add_argument("--concurrency", default="1,8,32")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--suites", default=",".join(SUITES), help="demo suites to draw items from")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    levels = [int(x) for x in args.concurrency.split(",")]
    requests = demo_requests(args.suites.split(","))
    pair = candidates(args.draft, args.k, max(levels))
    identical = same_answers(pair, requests)
    runs = [asyncio.run(one_repeat(pair, requests, levels)) for _ in range(args.repeats)]
    rows = summarize(runs, pair)
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    print(
        f"commit={rev} suites={args.suites} draft={args.draft} k={args.k} requests={len(requests)} "
        f"repeats={args.repeats} identical_answers={identical}"
    )
    for r in rows:
        print(" ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    if args.json_out:
        args.json_out.write_text(
            json.dumps(
                {
                    "commit": rev,
                    "draft": args.draft,
                    "k": args.k,
                    "identical_answers": identical,
                    "levels": rows,
                },
                indent=2,
            )
        )
    if not identical:
        sys.exit("answers differ with and without the draft")


if __name__ == "__main__":
    main()
