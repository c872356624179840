"""Prefix caching in the local provider: TTFT and prefill tokens with and without it, on a suite
whose items share a long prefix (a system prompt and few-shot turns, ~570 tokens) and differ in
a short question.

The model is a random Llama-style checkpoint built here (no download; 4 layers, hidden 256,
char-level tokenizer with a chat template that renders every turn), whose end-of-sequence row is
zeroed so every request decodes exactly max_tokens. The suite is written as a real suite YAML
(system + few_shot + template) and loaded with the serving benchmark's loader.

    ROUTEOPT_TORCH_THREADS=1 python benchmarks/prefix_cache.py
    ROUTEOPT_TORCH_THREADS=1 python benchmarks/prefix_cache.py --concurrency 1,8 --repeats 5

Prints per concurrency, with the cache off and on: TTFT p50 (median over repeats), prompt
tokens prefilled (computed) and reused, and whether every answer was identical.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from gpu_check import build_checkpoint  # noqa: E402

ARCH_CPU = {
    "hidden_size": 256,
    "num_hidden_layers": 4,
    "num_attention_heads": 8,
    "num_key_value_heads": 4,
    "vocab_size": 512,
    "intermediate_size": 688,
    "max_position_embeddings": 1024,
}
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}assistant: "
)
SYSTEM = (
    "you are a careful calculator for an accounting team: read the question, add the two "
    "numbers, and answer with the sum only: no words, no units, no explanation: if a "
    "number is written with leading zeros ignore them: if the question is unclear answer "
    "0: the examples below show the exact format to use: "
) * 2


def write_suite(folder: Path, n: int, seed: int = 0) -> Path:
    """A suite of n additions behind SYSTEM and four few-shot turns (the shared prefix)."""
    rng = random.Random(seed)
    items = [{"id": f"q{i:03d}", "a": rng.randint(10, 9999), "b": rng.randint(10, 9999)} for i in range(n)]
    shots = [
        {"id": f"s{i}", "a": a, "b": b, "answer": a + b}
        for i, (a, b) in enumerate([(12, 30), (405, 17), (3, 998), (77, 77)])
    ]
    for name, rows in (("items", items), ("shots", shots)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": "shared-prefix",
        "dataset": {"path": "items.jsonl", "id_field": "id"},
        "prompt": {
            "system": SYSTEM,
            "template": "what is {{ a }} + {{ b }}",
            "few_shot": {
                "dataset": {"path": "shots.jsonl", "id_field": "id"},
                "n": 4,
                "answer": "{{ answer }}",
            },
        },
        "generation": {"max_tokens": 16},
        "grader": {"type": "exact_match", "target": "0"},
    }
    path = folder / "shared-prefix.yaml"
    path.write_text(json.dumps(spec))
    return path


def checkpoint(folder: Path) -> Path:
    build_checkpoint(folder, ARCH_CPU)
    cfg = json.loads((folder / "tokenizer_config.json").read_text())
    cfg.pop("chat_template", None)
    (folder / "tokenizer_config.json").write_text(json.dumps(cfg))
    (folder / "chat_template.jinja").write_text(TEMPLATE)
    return folder


async def serve(ckpt: Path, requests: list[Any], level: int, cache: bool) -> dict:
    """All requests at `level` in flight through a fresh provider (an empty prefix cache)."""
    from routeopt.evals.config import Candidate
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import run_level

    cand = Candidate(
        name="pc",
        provider="local",
        model=str(ckpt),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=level,
        timeout_s=600,
        prefix_cache={"enabled": cache, "block_size": 16, "capacity_tokens": 16384},
    )
    provider = LocalProvider(cand)
    try:
        await provider.prepare()
        # One unmeasured request first: it warms the engine and, with the cache on, leaves the
        # shared prefix cached, so the figures are the steady state of a long-running server.
        await provider.generate(requests[-1])
        records, wall, _ = await run_level(provider, requests[:-1], level, len(requests) - 1)
    finally:
        await provider.aclose()
    ok = [r for r in records if r.ok]
    return {
        "ttft_p50_s": statistics.median(r.ttft_s for r in ok),
        "wall_s": wall,
        "prompt_tokens": sum(r.input_tokens for r in ok),
        "reused": sum(r.cached_input_tokens or 0 for r in ok),
        "errors": len(records) - len(ok),
    }


async def answers(ckpt: Path, requests: list[Any], cache: bool) -> list[str]:
    from routeopt.evals.config import Candidate
    from routeopt.evals.providers.local.provider import LocalProvider

    cand = Candidate(
        name="pc",
        provider="local",
        model=str(ckpt),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=8,
        prefix_cache=cache,
    )
    provider = LocalProvider(cand)
    try:
        return [c.text for c in await asyncio.gather(*(provider.generate(r) for r in requests))]
    finally:
        await provider.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--concurrency", default="1,8")
    ap.add_argument("--requests", type=int, default=48)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json-out", type=Path)
    args = ap.parse_args()
    from routeopt.evals.selfhost.serving import load_prompts

    levels = [int(x) for x in args.concurrency.split(",")]
    rev = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True, check=False
    ).stdout.strip()
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = checkpoint(Path(tmp) / "ckpt")
        requests = load_prompts(write_suite(Path(tmp), args.requests + 1))
        identical = asyncio.run(answers(ckpt, requests, False)) == asyncio.run(answers(ckpt, requests, True))
        runs = {
            (c, on): [asyncio.run(serve(ckpt, requests, c, on)) for _ in range(args.repeats)]
            for c in levels
            for on in (False, True)
        }
    shared = requests[0].shared_messages
    print(
        f"commit={rev} requests={args.requests} shared_messages={shared} "
        f"repeats={args.repeats} identical_answers={identical}"
    )
    rows = []
    for (c, on), rs in runs.items():
        row = {
            "concurrency": c,
            "prefix_cache": "on" if on else "off",
            "ttft_p50_ms": round(statistics.median(r["ttft_p50_s"] for r in rs) * 1e3, 1),
            "prompt_tokens": rs[0]["prompt_tokens"],
            "prefilled": rs[0]["prompt_tokens"] - rs[0]["reused"],
            "reused": rs[0]["reused"],
            "wall_s": round(statistics.median(r["wall_s"] for r in rs), 2),
        }
        rows.append(row)
        print(" ".join(f"{k}={v}" for k, v in row.items()), flush=True)
    if args.json_out:
        args.json_out.write_text(
            json.dumps({"commit": rev, "identical_answers": identical, "levels": rows}, indent=2)
        )
    if not identical:
        sys.exit("answers differ with and without the prefix cache")


if __name__ == "__main__":
    main()
