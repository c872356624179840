"""GPU check, part 2: speculative decoding and prefix caching on the check's model (imported
by `gpu_check.py`, which builds the model and runs these after the quantized variants).

Speculative decoding: the bf16 target served alone and with three drafts, at the same prompts
and concurrencies. Random weights make an independent draft useless (its proposals are almost
never the target's), so acceptance is measured where it means something as well:
- `self`: the target drafts for itself. Greedy acceptance is 1 by construction; what it shows
  is the mechanism's overhead (k+1 draft passes and one verify pass for k+1 tokens).
- `first-N-layers`: the target's first N decoder layers with its own embeddings, final norm and
  output layer (a truncated-layer draft, as in self-speculative / LayerSkip drafting): about N/L
  of the target's cost per pass; its acceptance is whatever random weights give.
- `small-random`: an independent random Llama of the same family (fewer, narrower layers, the
  same tokenizer): the near-zero-acceptance case, i.e. the cost of a mismatched draft.

Prefix caching: prompts that share a long prefix and differ in a short tail, served with the
local provider's prefix cache off and on; TTFT and the prompt tokens actually prefilled.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

from routeopt.common.io import atomic_write

ARCH_DRAFT_1B = dict(
    hidden_size=1024,
    num_hidden_layers=4,
    num_attention_heads=16,
    num_key_value_heads=4,
    vocab_size=32000,
    intermediate_size=2816,
    max_position_embeddings=4096,
)
ARCH_DRAFT_TINY = dict(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    vocab_size=512,
    intermediate_size=64,
    max_position_embeddings=512,
)


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument(
        "--skip-levers", action="store_true", help="skip the speculative-decoding and prefix-cache steps"
    )
    ap.add_argument("--spec-k", type=int, default=4, help="num_speculative_tokens")
    ap.add_argument("--spec-concurrency", default=None, help="levels (default 1,16; tiny 1,3)")
    ap.add_argument("--spec-max-tokens", type=int, default=None, help="output tokens (64; tiny 8)")
    ap.add_argument(
        "--draft-layers", type=int, default=None, help="layers of the truncated draft (default 2; tiny 1)"
    )
    ap.add_argument(
        "--prefix-chars", type=int, default=None, help="shared prompt prefix in tokens (1024; tiny 48)"
    )


def finish_arguments(args: argparse.Namespace) -> None:
    from routeopt.evals.selfhost.serving import parse_levels

    args.spec_concurrency = parse_levels(args.spec_concurrency or ("1,3" if args.tiny else "1,16"))
    args.spec_max_tokens = args.spec_max_tokens or (8 if args.tiny else 64)
    args.draft_layers = args.draft_layers or (1 if args.tiny else 2)
    args.prefix_chars = args.prefix_chars or (48 if args.tiny else 1024)


def build_drafts(target: Path, out: Path, args: argparse.Namespace, build: Any) -> dict[str, Path]:
    """The drafts besides the target itself: its first layers, and a small random model."""
    truncated = out / f"draft-first-{args.draft_layers}-layers"
    truncated_draft(target, truncated, args.draft_layers)
    small = out / "draft-small-random"
    build(small, ARCH_DRAFT_TINY if args.tiny else ARCH_DRAFT_1B, args.seed + 1)
    return {"self": target, f"first-{args.draft_layers}-layers": truncated, "small-random": small}


def truncated_draft(target: Path, out: Path, layers: int) -> None:
    """Save the target's first `layers` decoder layers, embeddings, final norm and output layer
    as a checkpoint of its own (loading with fewer layers leaves the others out)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # "some weights were not used": the layers left out
    try:
        model = AutoModelForCausalLM.from_pretrained(target, num_hidden_layers=layers, dtype=torch.bfloat16)
    finally:
        hf_logging.set_verbosity(verbosity)
    model.save_pretrained(out, safe_serialization=True)
    for f in target.iterdir():
        if f.name.startswith(("tokenizer", "special_tokens", "chat_template")):
            shutil.copy(f, out / f.name)


def shared_prefix_prompts(
    path: Path, n: int, prefix_tokens: int, tail_tokens: int, max_tokens: int, seed: int = 0
) -> Path:
    """n JSONL prompts: one shared prefix of `prefix_tokens` characters (one token each with the
    check's tokenizer), then a tail of their own."""
    from routeopt.evals.selfhost.zoo import CHARS

    rng = random.Random(seed)
    alphabet = CHARS.replace("\n", "")
    head = "".join(rng.choice(alphabet) for _ in range(prefix_tokens))
    rows = [
        json.dumps(
            {
                "prompt": head + "".join(rng.choice(alphabet) for _ in range(tail_tokens)),
                "max_tokens": max_tokens,
            }
        )
        for _ in range(n)
    ]
    atomic_write(path, "\n".join(rows) + "\n")
    return path


def _candidate(args: argparse.Namespace, ckpt: Path, name: str, **extra: Any) -> Any:
    from routeopt.evals.config import Candidate

    return Candidate(
        name=name,
        provider="local",
        model=str(ckpt),
        variant="bf16",
        device=args.device,
        gpu_hour_usd=args.gpu_hour_usd,
        max_concurrency=max(args.spec_concurrency),
        timeout_s=args.request_timeout_s,
        **extra,
    )


async def _serve(
    cand: Any, requests: list, levels: list[int], n: dict[int, int], store: Any, stop_after: float
) -> Any:
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import bench_serving, save_report

    provider = LocalProvider(cand, max_batch=max(levels))
    try:
        report = await bench_serving(
            cand, requests, levels, n, provider=provider, warmup=1, stop_after=stop_after
        )
    finally:
        await provider.aclose()
    save_report(store, report)
    return report


def bench_speculative(
    ckpt: Path, drafts: dict[str, Path], args: argparse.Namespace, prompts: Path, store: Any, deadline: float
) -> dict:
    """The target alone, then with each draft: tokens/s, acceptance, speed-up per level."""
    from routeopt.evals.selfhost.serving import load_prompts

    requests = load_prompts(prompts, args.spec_max_tokens)
    levels = args.spec_concurrency
    n = {c: 4 if c == 1 else 2 * c for c in levels}
    runs: list[dict[str, Any]] = []
    skipped: list[str] = []
    weights = {label: _weight_bytes(path) for label, path in [("target alone", ckpt), *drafts.items()]}
    estimate = 30.0
    for label, draft in [("target alone", None), *drafts.items()]:
        if time.perf_counter() + estimate > deadline:
            skipped.append(label)
            continue
        spec: dict[str, Any] = {"prefix_cache": False}  # decode speed only
        if draft is not None:
            spec["speculative"] = {"model": str(draft), "num_speculative_tokens": args.spec_k}
        t0 = time.perf_counter()
        try:
            report = asyncio.run(
                _serve(
                    _candidate(args, ckpt, f"{args.name}-spec-{_slug(label)}", **spec),
                    requests,
                    levels,
                    n,
                    store,
                    deadline,
                )
            )
        except Exception as exc:  # a draft that fails is recorded; the others still run
            runs.append({"draft": label, "error": f"{type(exc).__name__}: {exc}"[:500]})
            continue
        estimate = max(estimate, 1.3 * (time.perf_counter() - t0))
        runs.append({"draft": label, "levels": [_spec_level(lv) for lv in report.levels]})
    _speedups(runs)
    return {
        "k": args.spec_k,
        "max_tokens": args.spec_max_tokens,
        "runs": runs,
        "skipped": skipped,
        "weight_bytes": weights,
    }


def _weight_bytes(checkpoint: Path) -> int:
    """Bytes of a checkpoint's weights: what a draft adds to the device's memory (a self-draft
    loads a second copy of the target)."""
    return sum(f.stat().st_size for f in checkpoint.glob("*.safetensors"))


def _slug(label: str) -> str:
    return label.replace(" ", "-")


def _spec_level(lv: Any) -> dict:
    return {
        "concurrency": lv.concurrency,
        "output_tok_s": lv.output_tok_s,
        "acceptance_rate": lv.acceptance_rate,
        "mean_accepted_length": lv.mean_accepted_length,
        "ttft_p50_s": lv.ttft_s["p50"] if lv.ttft_s else None,
        "tpot_p50_s": lv.tpot_s["p50"] if lv.tpot_s else None,
        "errors": lv.errors,
    }


def _speedups(runs: list[dict]) -> None:
    base = next((r for r in runs if r["draft"] == "target alone" and "levels" in r), None)
    if base is None:
        return
    alone = {lv["concurrency"]: lv["output_tok_s"] for lv in base["levels"]}
    for r in runs:
        for lv in r.get("levels", []):
            ref = alone.get(lv["concurrency"])
            lv["speedup"] = lv["output_tok_s"] / ref if ref else None


def bench_prefix_cache(ckpt: Path, args: argparse.Namespace, out: Path, store: Any, deadline: float) -> dict:
    """TTFT and prefilled prompt tokens with the prefix cache off, then on. Every measured
    request has a tail of its own: only the shared prefix can come from the cache."""
    from routeopt.evals.selfhost.serving import load_prompts, save_report

    levels = args.spec_concurrency
    n = {c: 8 if c == 1 else 2 * c for c in levels}
    tail = 8 if args.tiny else 32
    path = shared_prefix_prompts(
        out / "prefix_prompts.jsonl",
        1 + sum(n.values()),
        args.prefix_chars,
        tail,
        2 if args.tiny else 4,
        args.seed,
    )
    requests = load_prompts(path)
    runs = []
    for on in (False, True):
        if time.perf_counter() > deadline:
            runs.append({"prefix_cache": on, "skipped": "time budget"})
            continue
        cache = {"enabled": on, "block_size": 16, "capacity_tokens": 4 * args.prefix_chars + 4096}
        cand = _candidate(args, ckpt, f"{args.name}-prefix-{'on' if on else 'off'}", prefix_cache=cache)
        levels_out = asyncio.run(_levels_apart(cand, requests, levels, n, deadline))
        for lv in levels_out:
            save_report(store, lv)
        runs.append(
            {"prefix_cache": on, "levels": [_prefix_level(r.levels[0]) for r in levels_out if r.levels]}
        )
    return {"shared_prefix_tokens": args.prefix_chars + 1, "tail_tokens": tail, "runs": runs}


async def _levels_apart(
    cand: Any, requests: list, levels: list[int], n: dict[int, int], deadline: float
) -> list:
    """One provider; each level served its own slice of the prompts (the first one warms up)."""
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import bench_serving

    provider = LocalProvider(cand, max_batch=max(levels))
    reports, start = [], 1
    try:
        await provider.generate(requests[0])
        for c in levels:
            part = requests[start : start + n[c]]
            start += n[c]
            reports.append(
                await bench_serving(cand, part, [c], n[c], provider=provider, warmup=0, stop_after=deadline)
            )
    finally:
        await provider.aclose()
    return reports


def _prefix_level(lv: Any) -> dict:
    ok = [r for r in lv.records if r.ok]
    prompt = sum(r.input_tokens or 0 for r in ok)
    reused = sum(r.cached_input_tokens or 0 for r in ok)
    return {
        "concurrency": lv.concurrency,
        "requests": lv.requests,
        "errors": lv.errors,
        "ttft_p50_s": statistics.median(r.ttft_s for r in ok if r.ttft_s is not None) if ok else None,
        "prompt_tokens": prompt,
        "prefilled": prompt - reused,
        "reused": reused,
    }


def render(res: dict) -> list[str]:
    """The report's sections on speculative decoding and prefix caching."""
    lines: list[str] = []
    spec = res.get("speculative")
    if spec:
        lines += [
            "## Speculative decoding (bf16 target)",
            "",
            f"k = {spec['k']} proposals per step, {spec['max_tokens']} output tokens per "
            "request, greedy. `self`: the target drafts for itself (acceptance 1 by "
            "construction: the mechanism's overhead); `first-N-layers`: the target's "
            "first layers and output head; `small-random`: an independent random model "
            "(random weights: near-zero acceptance).",
            "",
            "| draft | conc | out tok/s | speed-up | accept rate | accepted len | "
            "TTFT p50 ms | TPOT p50 ms |",
            "|---|---|---|---|---|---|---|---|",
        ]
        for r in spec["runs"]:
            if "error" in r:
                lines.append(f"| {r['draft']} | failed: `{r['error']}` | | | | | | |")
                continue
            for lv in r["levels"]:
                lines.append(
                    f"| {r['draft']} | {lv['concurrency']} | {_n(lv['output_tok_s'])} | "
                    f"{_n(lv.get('speedup'), 2)}x | {_n(lv['acceptance_rate'], 2)} | "
                    f"{_n(lv['mean_accepted_length'], 2)} | {_ms(lv['ttft_p50_s'])} | "
                    f"{_ms(lv['tpot_p50_s'])} |"
                )
        sizes = spec.get("weight_bytes") or {}
        if sizes:
            lines.append(
                "\n- weights on the device (the draft's are added to the target's): "
                + ", ".join(f"{k}: {v / 1e6:,.1f} MB" for k, v in sizes.items())
            )
        if spec["skipped"]:
            lines.append(f"- skipped (time budget): {', '.join(spec['skipped'])}")
        lines.append("")
    pc = res.get("prefix_cache")
    if pc:
        lines += [
            "## Prefix caching (bf16)",
            "",
            f"{pc['shared_prefix_tokens']} shared prompt tokens, then {pc['tail_tokens']} "
            "of each request's own; block 16.",
            "",
            "| prefix cache | conc | TTFT p50 ms | prompt tokens | prefilled | reused |",
            "|---|---|---|---|---|---|",
        ]
        for r in pc["runs"]:
            state = "on" if r["prefix_cache"] else "off"
            for lv in r.get("levels", []):
                lines.append(
                    f"| {state} | {lv['concurrency']} | {_ms(lv['ttft_p50_s'])} | "
                    f"{lv['prompt_tokens']} | {lv['prefilled']} | {lv['reused']} |"
                )
            if "skipped" in r:
                lines.append(f"| {state} | skipped: {r['skipped']} | | | | |")
        lines.append("")
    return lines


def _n(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"
