"""Local provider under a mixed workload: requests that want 8 to 128 output tokens, in flight at
a fixed concurrency, the case where batching per decode step (a finished row leaves, a waiting
request joins at the next step) beats batching per request group (the group runs until its
longest row ends, and newcomers wait for it).

The model is a random Llama-style checkpoint built here (no download) whose end-of-sequence row is
zeroed, so every request decodes exactly its max_tokens, and the workload is the same every run.

    python benchmarks/continuous_batching.py                       # 16 and 64 in flight
    python benchmarks/continuous_batching.py --concurrency 8 --requests 96 --json-out cb.json

Prints, per concurrency: total output tokens/s, requests/s, and TTFT / latency p50 and p99.
Quote medians of several runs: these machines are shared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

sys.path.insert(0, str(REPO / "benchmarks"))
from gpu_check import build_checkpoint

ARCH_CPU = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "intermediate_size": 688,
    "max_position_embeddings": 512,
}


def mixed_prompts(path: Path, n: int, seed: int = 0) -> Path:
    """`n` prompts of 16-48 characters, each asking for 8-128 output tokens (log-uniform)."""
    from routeopt.evals.selfhost.zoo import CHARS

    rng = random.Random(seed)
    alphabet = CHARS.replace("\n", "")
    with path.open("w") as fh:
        for _ in range(n):
            text = "".join(rng.choice(alphabet) for _ in range(rng.randint(16, 48)))
            fh.write(json.dumps({"prompt": text, "max_tokens": round(2 ** rng.uniform(3, 7))}) + "\n")
    return path


async def bench(ckpt: Path, prompts: Path, levels: list[int], n: int) -> list[dict]:
    from routeopt.evals.config import Candidate
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import Targets, bench_serving, load_prompts

    cand = Candidate(
        name="cb-random",
        provider="local",
        model=str(ckpt),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=max(levels),
        timeout_s=600,
    )
    provider = LocalProvider(cand, max_batch=max(levels))
    try:
        report = await bench_serving(
            cand,
            load_prompts(prompts),
            levels,
            n,
            Targets(),
            provider=provider,
            prompts_label=str(prompts),
            warmup=2,
        )
    finally:
        await provider.aclose()
    rows = []
    for lv in report.levels:
        rows.append(
            {
                "concurrency": lv.concurrency,
                "output_tok_s": round(lv.output_tok_s, 1),
                "requests_per_s": round(lv.request_rps, 2),
                "ttft_p50_ms": round(lv.ttft_s["p50"] * 1e3, 1),
                "ttft_p99_ms": round(lv.ttft_s["p99"] * 1e3, 1),
                "latency_p50_ms": round(lv.latency_s["p50"] * 1e3, 1),
                "latency_p99_ms": round(lv.latency_s["p99"] * 1e3, 1),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="16,64")
    ap.add_argument("--requests", type=int, default=192, help="requests per level")
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(2)
    levels = [int(x) for x in args.concurrency.split(",")]
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "ckpt"
        build_checkpoint(ckpt, ARCH_CPU)
        prompts = mixed_prompts(Path(tmp) / "prompts.jsonl", max(args.requests, 64))
        rows = asyncio.run(bench(ckpt, prompts, levels, args.requests))
    for r in rows:
        print(f"commit={rev} " + " ".join(f"{k}={v}" for k, v in r.items()), flush=True)
    if args.json_out:
        args.json_out.write_text(json.dumps({"commit": rev, "levels": rows}, indent=2))


if __name__ == "__main__":
    main()
