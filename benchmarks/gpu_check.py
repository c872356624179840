"""GPU check: serve a real-architecture model on this machine and see how close it gets to the
hardware's limit, then push one suite through the whole pipeline on the same device.

Steps (each timed; every figure goes to `<out>/gpu_check.json` and `<out>/gpu_check.md`):
1. build a random Llama-style model (hidden 2048, 16 layers, 32 heads, 8 KV heads, vocab 32000,
   intermediate 5632: 0.85B params; `--tiny`: a toy) + char-level tokenizer; save it - no download;
2. run the serving benchmark (`routeopt.evals.selfhost.serving`) through the `local` provider for each variant
   (bf16, fp8 weight-only and fp8-dyn W8A8 by default) at concurrency 1, 16 and 64;
3. batch-1 decode speed vs the memory-bandwidth limit (bandwidth / weight bytes per token): the
   provider, a bare forward loop, and generate() with a static KV cache (+ torch.compile on GPUs);
4. prefix caching: TTFT and prefilled tokens with the cache off and on, on prompts sharing a
   1,024-token prefix; speculative decoding: the bf16 target alone and with three drafts (itself,
   its first 2 layers, a small random model), tokens/s, acceptance and speed-up at 1 and 16
   (`gpu_levers.py` says why three);
5. `routeopt run --config <generated> --suite gpu-smoke` on the device, and count its outcomes.

Special tokens' output-layer rows are zeroed, so every request decodes exactly max_tokens.

    python benchmarks/gpu_check.py --device cuda --out gpu_check_out     # real run (< 8 min)
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/gc     # the CPU code path
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import random
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
for _path in (REPO, REPO / "benchmarks"):
    if str(_path) not in sys.path:
        sys.path.insert(0, str(_path))

from routeopt.common.io import atomic_write  # noqa: E402  (standard library only)

ARCH_1B = dict(
    hidden_size=2048,
    num_hidden_layers=16,
    num_attention_heads=32,
    num_key_value_heads=8,
    vocab_size=32000,
    intermediate_size=5632,
    max_position_embeddings=4096,
)
ARCH_TINY = dict(
    hidden_size=64,
    num_hidden_layers=2,
    num_attention_heads=4,
    num_key_value_heads=2,
    vocab_size=512,
    intermediate_size=128,
    max_position_embeddings=512,
)
# HBM bandwidth in TB/s by GPU name (most specific first; matched as lower-case substrings).
BANDWIDTH_TBS: tuple[tuple[str, float], ...] = (
    ("gh200", 4.0),
    ("h200", 4.8),
    ("b200", 8.0),
    ("h100 pcie", 2.0),
    ("h100 nvl", 3.9),
    ("h100", 3.35),
    ("h800", 3.35),
    ("a100-sxm4-80gb", 2.039),
    ("a100 80gb", 1.935),
    ("a100", 1.555),
    ("l40s", 0.864),
    ("l40", 0.864),
    ("a10g", 0.6),
    ("a10", 0.6),
    ("l4", 0.3),
    ("rtx 4090", 1.008),
    ("rtx 3090", 0.936),
    ("t4", 0.32),
    ("v100", 0.9),
)
FILLER_BASE = 0x4E00  # CJK block: one printable code point per filler token, no surrogates


@dataclass
class Clock:
    """Wall-time budget shared by the steps, so the check ends in time and says what it skipped."""

    budget_s: float
    start: float = 0.0

    def __post_init__(self) -> None:
        self.start = time.perf_counter()

    @property
    def elapsed(self) -> float:
        return time.perf_counter() - self.start

    def left(self) -> float:
        return self.budget_s - self.elapsed


def gpu_name(device: str) -> str:
    """The device's marketing name: nvidia-smi's if it answers, else torch's, else 'cpu'."""
    if not device.startswith("cuda"):
        return "cpu"
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout
        if out.strip():
            return out.strip().splitlines()[0].strip()
    except (OSError, subprocess.SubprocessError):
        pass
    import torch

    return torch.cuda.get_device_name(0)


def bandwidth_tbs(name: str, override: float | None = None) -> float | None:
    """HBM bandwidth for a GPU name from the table (None if unknown); an override wins."""
    if override:
        return override
    lower = name.lower()
    for key, tbs in BANDWIDTH_TBS:
        if key in lower:
            return tbs
    return None


def build_tokenizer(vocab_size: int, max_len: int) -> Any:
    """A char-level tokenizer with exactly `vocab_size` entries: the zoo's specials and
    characters, then one filler code point per remaining id, so every id decodes and the
    decoded text re-tokenizes to the same ids."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from routeopt.evals.selfhost.zoo import CHARS, CHAT_TEMPLATE, SPECIALS

    base = list(SPECIALS) + list(CHARS)
    if vocab_size < len(base):
        raise ValueError(f"vocab_size {vocab_size} < {len(base)} base tokens")
    vocab = {tok: i for i, tok in enumerate(base)}
    for i in range(vocab_size - len(base)):
        vocab[chr(FILLER_BASE + i)] = len(base) + i
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=max_len,
    )


def build_checkpoint(out: Path, arch: dict, seed: int = 0) -> dict:
    """Save a random-weight LlamaForCausalLM (bf16 safetensors) and its tokenizer under `out`."""
    import torch
    from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

    tok = build_tokenizer(arch["vocab_size"], arch["max_position_embeddings"])
    config = LlamaConfig(
        **arch,
        rope_theta=10000.0,
        tie_word_embeddings=False,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(seed)
    t0 = time.perf_counter()
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for tid in tok.all_special_ids:
            model.lm_head.weight[tid].zero_()  # greedy never ends a request early
    model = model.to(torch.bfloat16)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
    )
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    params = sum(p.numel() for p in model.parameters())
    del model
    gc.collect()
    return {"path": str(out), "params": params, "build_s": round(time.perf_counter() - t0, 2), "arch": arch}


def write_prompts(path: Path, n: int, prompt_chars: int, max_tokens: int, seed: int = 0) -> Path:
    """`n` JSONL prompts of `prompt_chars` characters (one token each) asking for max_tokens."""
    from routeopt.evals.selfhost.zoo import CHARS

    rng = random.Random(seed)
    alphabet = CHARS.replace("\n", "")
    rows = [
        json.dumps(
            {"prompt": "".join(rng.choice(alphabet) for _ in range(prompt_chars)), "max_tokens": max_tokens}
        )
        for _ in range(n)
    ]
    atomic_write(path, "\n".join(rows) + "\n")
    return path


def weight_bytes_per_token(model: Any) -> int:
    """Bytes of weights one decode step reads: every parameter and buffer except the input
    embedding table (a lookup reads one row) - unless it doubles as the output layer."""
    emb = model.get_input_embeddings().weight
    out = model.get_output_embeddings()
    tied = out is not None and out.weight.data_ptr() == emb.data_ptr()
    seen: set[int] = set()
    total = 0
    for t in list(model.parameters()) + list(model.buffers()):
        if t.data_ptr() in seen or (t is emb and not tied):
            continue
        seen.add(t.data_ptr())
        total += t.numel() * t.element_size()
    return total


def raw_decode_tok_s(model: Any, device: str, steps: int, prompt_len: int = 32) -> float:
    """Batch-1 greedy decode with bare forward calls and a KV cache: no generate() machinery."""
    import torch

    def sync() -> None:
        if device.startswith("cuda"):
            torch.cuda.synchronize()

    import inspect

    kw = "cache" if "cache" in inspect.signature(model.forward).parameters else "past_key_values"

    def step(ids: Any, past: Any) -> tuple[Any, Any]:
        out = model(input_ids=ids, use_cache=True, logits_to_keep=1, **({kw: past} if past else {}))
        new = getattr(out, "past_key_values", None)
        return (getattr(out, "cache", None) if new is None else new), out.logits[:, -1:].argmax(-1)

    ids = torch.randint(64, model.config.vocab_size, (1, prompt_len), device=device)
    with torch.inference_mode():
        past, nxt = step(ids, None)
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            past, nxt = step(nxt, past)
        sync()
    return steps / (time.perf_counter() - t0)


class _SyncedClock:
    """Logits processor that waits for the device, then timestamps the step: a true step time."""

    def __init__(self, device: str) -> None:
        self.device = device
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        import torch

        if self.device.startswith("cuda"):
            torch.cuda.synchronize()
        self.times.append(time.perf_counter())
        return scores


def static_decode_tok_s(model: Any, device: str, steps: int, prompt_len: int = 32) -> float:
    """Batch-1 decode through `generate` with a static KV cache, which transformers compiles
    (torch.compile, CUDA graphs) on GPUs: the headroom the local provider leaves unused.
    The first two calls compile and capture; the third is timed by its median step."""
    import statistics

    import torch

    ids = torch.randint(64, model.config.vocab_size, (1, prompt_len), device=device)
    clock = _SyncedClock(device)
    kw = dict(
        max_new_tokens=steps,
        do_sample=False,
        cache_implementation="static",
        pad_token_id=0,
        logits_processor=[clock],
    )
    with torch.inference_mode():
        for _ in range(3):
            clock.times.clear()
            model.generate(ids, attention_mask=torch.ones_like(ids), **kw)
    gaps = [b - a for a, b in zip(clock.times, clock.times[1:])]
    return 1.0 / statistics.median(gaps)


def decode_vs_bandwidth(report: Any, wbytes: int, bw_tbs: float | None, raw_tok_s: float | None) -> dict:
    """Batch-1 decode tokens/s (1 / median TPOT at concurrency 1) against bandwidth / bytes."""
    one = next((lv for lv in report.levels if lv.concurrency == 1), None)
    tpot = one.tpot_s["p50"] if one is not None and one.tpot_s else None
    measured = 1.0 / tpot if tpot else None
    limit = bw_tbs * 1e12 / wbytes if bw_tbs and wbytes else None
    return {
        "weight_bytes_per_token": wbytes,
        "bandwidth_tbs": bw_tbs,
        "limit_tok_s": limit,
        "provider_batch1_tok_s": measured,
        "provider_ratio": measured / limit if measured and limit else None,
        "forward_loop_batch1_tok_s": raw_tok_s,
        "forward_loop_ratio": raw_tok_s / limit if raw_tok_s and limit else None,
    }


async def bench_variant(
    ckpt: Path,
    variant: str,
    args: argparse.Namespace,
    prompts: Path,
    store: Any,
    bw_tbs: float | None,
    stop_after: float | None = None,
) -> dict:
    """Serving benchmark of one variant through the local provider, plus its bandwidth ratio."""
    from routeopt.evals.config import Candidate
    from routeopt.evals.selfhost.costmodel import ThroughputPoint, cost_table
    from routeopt.evals.providers.local.provider import LocalProvider
    from routeopt.evals.selfhost.serving import (
        Targets,
        bench_serving,
        load_prompts,
        markdown_table,
        report_json,
        save_report,
    )

    levels = args.concurrency
    cand = Candidate(
        name=f"{args.name}-{variant}",
        provider="local",
        model=str(ckpt),
        variant=variant,
        device=args.device,
        gpu_hour_usd=args.gpu_hour_usd,
        max_concurrency=max(levels),
        timeout_s=args.request_timeout_s,
        prefix_cache=False,
    )  # the prompts repeat across levels: decode speed only
    provider = LocalProvider(cand, max_batch=max(levels))
    occupancy = EngineOccupancy(provider)
    t0 = time.perf_counter()
    try:
        report = await bench_serving(
            cand,
            load_prompts(prompts),
            levels,
            requests_per_level(args),
            Targets(args.latency_target_s),
            provider=provider,
            prompts_label=str(prompts),
            warmup=2,
            stop_after=stop_after,
            on_level=occupancy.level_done,
        )
        model = provider._model  # the loaded variant, for its byte count and a bare decode loop
        wbytes = weight_bytes_per_token(model)
        act_dtype, kernels = batch1_kernels(model)
        raw = raw_decode_tok_s(model, args.device, args.raw_steps) if args.raw_steps else None
        compiled = _try_static(model, variant, args, stop_after)
        del model
    finally:
        await provider.aclose()
        _free(args.device)
    save_report(store, report)
    points = [ThroughputPoint(lv.concurrency, lv.output_tok_s) for lv in report.levels]
    return {
        "candidate": cand.name,
        "variant": variant,
        "wall_s": round(time.perf_counter() - t0, 2),
        "serving": report_json(report),
        "table_md": markdown_table(report),
        "usd_per_mtok_full_load": {
            r.concurrency: r.usd_per_mtok for r in cost_table(points, args.gpu_hour_usd, (1.0,))
        },
        "bandwidth": _with_static(decode_vs_bandwidth(report, wbytes, bw_tbs, raw), compiled),
        "activation_dtype": act_dtype,
        "kernels_batch1": kernels,
        "engine": occupancy.summary(),
    }


class EngineOccupancy:
    """The local engine's decode batch per concurrency level: with c requests in flight, a full
    batch has c rows at every step; fewer means the device waited for the load generator.
    The first level's steps include the warm-up requests' (one row each)."""

    def __init__(self, provider: Any) -> None:
        self.provider = provider
        self.start = 0
        self.levels: dict[int, dict[str, float]] = {}

    def level_done(self, level: Any) -> None:
        sizes = self.provider.batch_sizes[self.start :]
        self.start = len(self.provider.batch_sizes)
        if sizes:
            self.levels[level.concurrency] = {
                "steps": len(sizes),
                "mean_batch": sum(sizes) / len(sizes),
                "max_batch": max(sizes),
            }

    def summary(self) -> dict[str, Any]:
        return {"by_concurrency": self.levels, "oom_backoffs": self.provider.oom_backoffs}


def batch1_kernels(model: Any) -> tuple[str, dict[str, int]]:
    """The activation dtype and how many quantized Linears run each kernel at batch-1 decode:
    asked of the loaded model, so the report states what ran rather than what was meant to."""
    from routeopt.evals.providers.local.quantize import kernel_counts

    emb = model.get_input_embeddings().weight
    return str(emb.dtype).removeprefix("torch."), kernel_counts(model, 1, emb.dtype, emb.device)


# What each quantized variant's Linears do in evals/providers/local/quantize.py; `kernels_batch1` says which ran.
KERNEL_NOTES = {
    "fp8": "weight-only fp8: no fused kernel, as torch has no weight-only fp8 matmul; every "
    "forward casts each fp8 weight up to the activation dtype, then a plain matmul",
    "int8": "weight-only int8: torch._weight_int8pack_mm on CPU for bf16 inputs of <= 8 rows; "
    "otherwise (always on CUDA) every forward casts each int8 weight up, then a plain "
    "matmul",
    "fp8-dyn": "W8A8 fp8: activations rounded per token to e4m3 with a dynamic amax scale, then "
    "torch._scaled_mm with rowwise scales (bf16 out) where K and N are multiples of "
    "16 and the device runs it; elsewhere both operands are widened ('dequant')",
    "int8-dyn": "W8A8 int8: activations rounded per token to int8, then torch._int_mm (M <= 16 "
    "zero-padded to 17 on CUDA) where K and N are multiples of 8 and the device runs "
    "it; elsewhere both operands are widened ('dequant')",
}


def kernel_note(v: dict) -> list[str]:
    """The report's line on how a quantized variant multiplies, with the kernels that ran."""
    note = KERNEL_NOTES.get(v["variant"])
    if note is None:
        return []
    ran = ", ".join(f"{k} x{n}" for k, n in sorted(v.get("kernels_batch1", {}).items())) or "-"
    return [
        f"({note}. Activations and unquantized layers: {v.get('activation_dtype', '?')}; "
        f"Linear kernels at batch-1 decode: {ran}; the limit counts the stored bytes)"
    ]


def _with_static(bw: dict, compiled: dict) -> dict:
    tok_s = compiled.get("static_compiled_batch1_tok_s")
    if tok_s and bw.get("limit_tok_s"):
        compiled["static_compiled_ratio"] = tok_s / bw["limit_tok_s"]
    return {**bw, **compiled}


def _try_static(model: Any, variant: str, args: argparse.Namespace, stop_after: float | None) -> dict:
    """The static-cache compiled decode figure, when asked for this variant and time allows."""
    if variant not in args.static_compile:
        return {}
    if stop_after is not None and time.perf_counter() + 120 > stop_after:
        return {"static_compiled_error": "skipped: time budget"}
    try:
        tok_s = static_decode_tok_s(model, args.device, args.raw_steps)
    except Exception as exc:  # compilation is the fragile part; the other figures stand
        return {"static_compiled_error": f"{type(exc).__name__}: {exc}"[:500]}
    return {"static_compiled_batch1_tok_s": tok_s}


def requests_per_level(args: argparse.Namespace) -> int | dict[int, int]:
    """--requests for every level, else 2c per level (batch 1: 6 requests, each with
    max_tokens-1 decode steps, pins TPOT down; more only spends the time budget)."""
    if args.requests:
        return args.requests
    return {c: 6 if c == 1 else max(2 * c, 16) for c in args.concurrency}


def _free(device: str) -> None:
    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def write_pipeline_config(out: Path, ckpt: Path, args: argparse.Namespace, n_items: int) -> Path:
    """A config + one suite (`gpu-smoke`: zoo-style additions) that runs on the device: the
    random model, and the zoo models where they are in the repo (so grades differ for real)."""
    from routeopt.evals.selfhost.zoo import make_example

    rng = random.Random(f"gpu-check-{args.seed}")
    rows = []
    for n in range(n_items):
        ex = make_example("add", 1 + n % 3, rng)
        rows.append(
            json.dumps(
                {"id": f"add-{n:03d}", "prompt": ex.prompt, "answer": ex.answer, "difficulty": ex.difficulty}
            )
        )
    import yaml

    suites = out / "suites"
    atomic_write(suites / "gpu_smoke.jsonl", "\n".join(rows) + "\n")
    atomic_write(
        suites / "gpu-smoke.yaml",
        yaml.safe_dump(
            {
                "name": "gpu-smoke",
                "description": "zoo-style additions, run by benchmarks/gpu_check.py",
                "dataset": {"path": "gpu_smoke.jsonl", "id_field": "id"},
                "prompt": {"template": "{{ prompt }}"},
                "generation": {"max_tokens": 8},
                "grader": {"type": "exact_match", "target": "{{ answer }}"},
            },
            sort_keys=False,
        ),
    )
    local = dict(provider="local", device=args.device, max_concurrency=64)
    cands = [
        dict(
            name=f"{args.name}-bf16", model=str(ckpt), variant="bf16", gpu_hour_usd=args.gpu_hour_usd, **local
        )
    ]
    for name, price in (("zoo-s", 0.5), ("zoo-l", 2.0)):
        path = REPO / "evals" / "demo" / "zoo" / name
        if (path / "config.json").exists():
            cands.append(dict(name=name, model=str(path), variant="fp32", gpu_hour_usd=price, **local))
    cfg = out / "routeopt-gpu.yaml"
    atomic_write(
        cfg,
        yaml.safe_dump(
            {
                "candidates": cands,
                "suites_dir": str(suites),
                "db_path": str(out / "pipeline.duckdb"),
                "registry_dir": str(out / "registry"),
                "cache_dir": str(out / "cache"),
            },
            sort_keys=False,
        ),
    )
    return cfg


def run_pipeline(cfg: Path, out: Path, timeout_s: float) -> dict:
    """`routeopt run --config cfg --suite gpu-smoke` in a subprocess; then count its outcomes."""
    env = dict(
        os.environ,
        PREFECT_HOME=str(out / "prefect"),
        PREFECT_LOGGING_LEVEL="WARNING",
        PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS="180",
        TOKENIZERS_PARALLELISM="false",
    )
    cmd = [
        sys.executable,
        "-m",
        "routeopt.flows.cli",
        "run",
        "--config",
        str(cfg),
        "--suite",
        "gpu-smoke",
        "--no-progress",
    ]
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(
            cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=max(timeout_s, 1)
        )
        rc, tail = proc.returncode, (proc.stdout + proc.stderr)[-3000:]
    except subprocess.TimeoutExpired as exc:
        rc, tail = None, f"timed out after {timeout_s:.0f}s: {str(exc.stdout or '')[-2000:]}"
    result = {
        "command": " ".join(cmd[2:]),
        "rc": rc,
        "wall_s": round(time.perf_counter() - t0, 1),
        "output_tail": tail,
    }
    db = out / "pipeline.duckdb"
    if db.exists():
        import duckdb

        con = duckdb.connect(str(db), read_only=True)
        try:
            rows = con.execute(
                "SELECT candidate, count(*), avg(CAST(passed AS DOUBLE)), count(error_kind), "
                "median(latency_s) FROM outcomes GROUP BY candidate ORDER BY candidate"
            ).fetchall()
        finally:
            con.close()
        result["outcomes"] = [
            {"candidate": r[0], "items": r[1], "pass_rate": r[2], "errors": r[3], "latency_p50_s": r[4]}
            for r in rows
        ]
    return result


def render_markdown(res: dict) -> str:
    """The human-readable report: environment, per-variant tables, bandwidth ratios, pipeline."""
    env = res["environment"]
    lines = [
        "# GPU check",
        "",
        f"- device: {env['device_name']} ({env['device']}), torch {env['torch']}, "
        f"transformers {env['transformers']}",
        f"- model: {res['checkpoint'].get('params', 0) / 1e6:.1f}M params, "
        f"arch {json.dumps(res['checkpoint'].get('arch'))}",
        f"- total wall time: {res['wall_s']:.0f}s",
        "",
    ]
    for v in res["variants"]:
        lines.append(f"## {v['candidate']}")
        if "error" in v:
            lines += [f"failed: `{v['error']}`", ""]
            continue
        bw, skipped = v["bandwidth"], v["serving"].get("skipped_levels")
        lines += kernel_note(v)
        lines += [
            "",
            v["table_md"],
            "",
            *([f"- levels skipped (time budget): {skipped}"] if skipped else []),
            f"- weight bytes read per decode step: {bw['weight_bytes_per_token'] / 1e6:.1f} MB; "
            f"bandwidth {bw['bandwidth_tbs']} TB/s -> limit {_num(bw['limit_tok_s'])} tok/s",
            f"- batch-1 decode through the provider: {_num(bw['provider_batch1_tok_s'])} tok/s "
            f"= **{_pct(bw['provider_ratio'])}** of the limit",
            f"- batch-1 bare forward loop: {_num(bw['forward_loop_batch1_tok_s'])} tok/s "
            f"= {_pct(bw['forward_loop_ratio'])} of the limit",
            *_static_line(bw),
            *_engine_line(v.get("engine")),
            "- $/Mtok output at 100% utilisation by concurrency: "
            + ", ".join(f"c={c}: {_num(x, 3)}" for c, x in v["usd_per_mtok_full_load"].items()),
            "",
        ]
    import gpu_levers

    levers = {n: res[n] for n in ("prefix_cache", "speculative") if isinstance(res.get(n), dict)}
    for name, v in levers.items():
        if "error" in v:
            lines += [f"## {name}", "", f"failed: `{v['error']}`", ""]
    lines += gpu_levers.render({n: v for n, v in levers.items() if "error" not in v})
    pipe = res.get("pipeline")
    if pipe:
        lines += ["## Pipeline", "", f"`{pipe['command']}` -> rc {pipe['rc']} in {pipe['wall_s']}s", ""]
        for o in pipe.get("outcomes", []):
            lines.append(
                f"- {o['candidate']}: {o['items']} items, pass rate {_num(o['pass_rate'], 3)}, "
                f"{o['errors']} errors, latency p50 {_num(o['latency_p50_s'], 3)}s"
            )
        if pipe["rc"] != 0:
            lines += ["", "```", pipe["output_tail"], "```"]
    if res.get("skipped"):
        lines += ["", "Skipped: " + ", ".join(res["skipped"])]
    return "\n".join(lines) + "\n"


def _engine_line(engine: dict | None) -> list[str]:
    if not engine or not engine.get("by_concurrency"):
        return []
    parts = ", ".join(f"c={c}: {e['mean_batch']:.1f}" for c, e in engine["by_concurrency"].items())
    oom = f"; out-of-memory back-offs: {engine['oom_backoffs']}" if engine["oom_backoffs"] else ""
    return [f"- mean decode batch (rows per engine step) by concurrency: {parts}{oom}"]


def _static_line(bw: dict) -> list[str]:
    if "static_compiled_batch1_tok_s" in bw:
        return [
            f"- batch-1 generate with static KV cache + torch.compile: "
            f"{_num(bw['static_compiled_batch1_tok_s'])} tok/s "
            f"= {_pct(bw.get('static_compiled_ratio'))} of the limit"
        ]
    if "static_compiled_error" in bw:
        return [f"- static KV cache + torch.compile: {bw['static_compiled_error']}"]
    return []


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def environment(device: str) -> dict:
    import torch
    import transformers

    env = {
        "device": device,
        "device_name": gpu_name(device),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "cuda": torch.version.cuda,
    }
    if device.startswith("cuda"):
        props = torch.cuda.get_device_properties(torch.device(device).index or 0)
        env.update(capability=f"{props.major}.{props.minor}", memory_gib=round(props.total_memory / 2**30, 1))
    return env


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--device", default="cuda", help="cuda (default) or cpu")
    ap.add_argument("--tiny", action="store_true", help="a toy model: the CPU code path in seconds")
    ap.add_argument("--out", type=Path, default=Path("gpu_check_out"))
    ap.add_argument("--variants", default="bf16,fp8,fp8-dyn")
    ap.add_argument("--concurrency", default=None, help="levels (default 1,16,64; tiny 1,4)")
    ap.add_argument("--requests", type=int, default=None, help="requests per level")
    ap.add_argument("--max-tokens", type=int, default=None, help="output tokens (128; tiny 8)")
    ap.add_argument("--prompt-chars", type=int, default=None, help="prompt length (256; tiny 16)")
    ap.add_argument("--bandwidth-tbs", type=float, default=None, help="override the table")
    ap.add_argument("--gpu-hour-usd", type=float, default=3.5)
    ap.add_argument("--latency-target-s", type=float, default=None)
    ap.add_argument("--raw-steps", type=int, default=None, help="bare decode-loop steps (64)")
    ap.add_argument(
        "--static-compile",
        default=None,
        help="variants to also time with a static KV cache + torch.compile "
        "(default: bf16 on cuda, none on cpu)",
    )
    ap.add_argument("--request-timeout-s", type=float, default=300.0)
    ap.add_argument("--pipeline-items", type=int, default=None, help="gpu-smoke items (60; tiny 6)")
    ap.add_argument("--skip-pipeline", action="store_true")
    ap.add_argument("--budget-s", type=float, default=420.0, help="stop starting steps after this")
    ap.add_argument("--seed", type=int, default=0)
    import gpu_levers

    gpu_levers.add_arguments(ap)
    args = ap.parse_args(argv)
    from routeopt.evals.selfhost.serving import parse_levels

    args.concurrency = parse_levels(args.concurrency or ("1,4" if args.tiny else "1,16,64"))
    args.max_tokens = args.max_tokens or (8 if args.tiny else 128)
    args.prompt_chars = args.prompt_chars or (16 if args.tiny else 256)
    args.raw_steps = 16 if args.tiny and args.raw_steps is None else (args.raw_steps or 64)
    args.pipeline_items = args.pipeline_items or (6 if args.tiny else 60)
    args.name = "rand-tiny" if args.tiny else "rand-1b"
    default_static = "" if args.device == "cpu" else "bf16"
    args.static_compile = [
        v.strip()
        for v in (args.static_compile if args.static_compile is not None else default_static).split(",")
        if v.strip()
    ]
    gpu_levers.finish_arguments(args)
    return args


def check_device(device: str) -> None:
    """Fail at once, in one sentence, on a device that cannot run."""
    import torch

    if device.startswith("cuda") and not torch.cuda.is_available():
        raise SystemExit(
            f"gpu_check: --device {device} but torch {torch.__version__} sees no CUDA "
            "device; use --device cpu --tiny for the CPU code path"
        )
    if not (device == "cpu" or device.startswith("cuda")):
        raise SystemExit(f"gpu_check: --device must be cpu or cuda[:N], got {device!r}")


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    check_device(args.device)
    clock = Clock(args.budget_s)
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    env = environment(args.device)
    bw = bandwidth_tbs(env["device_name"], args.bandwidth_tbs)
    print(f"gpu_check: {env['device_name']}, bandwidth {bw} TB/s", flush=True)
    ckpt = build_checkpoint(out / "checkpoint", ARCH_TINY if args.tiny else ARCH_1B, args.seed)
    print(f"  checkpoint: {ckpt['params'] / 1e6:.1f}M params in {ckpt['build_s']}s", flush=True)
    n_prompts = max(args.concurrency) * 2
    prompts = write_prompts(out / "prompts.jsonl", n_prompts, args.prompt_chars, args.max_tokens, args.seed)
    res: dict[str, Any] = {
        "environment": env,
        "checkpoint": ckpt,
        "variants": [],
        "skipped": [],
        "args": {k: str(v) for k, v in vars(args).items()},
    }
    run_variants(args, out, Path(ckpt["path"]), prompts, bw, clock, res)
    run_levers(args, out, Path(ckpt["path"]), prompts, clock, res)
    if args.skip_pipeline:
        res["skipped"].append("pipeline (--skip-pipeline)")
    elif clock.left() < 60:
        res["skipped"].append("pipeline (time budget)")
    else:
        cfg = write_pipeline_config(out, Path(ckpt["path"]), args, args.pipeline_items)
        print("  pipeline: routeopt run ...", flush=True)
        res["pipeline"] = run_pipeline(cfg, out, clock.left())
    write_results(out, res, clock)
    print(render_markdown(res), flush=True)
    return res


def write_results(out: Path, res: dict, clock: Clock) -> None:
    """Write the figures so far (after every step: a killed run still leaves what it measured)."""
    res["wall_s"] = clock.elapsed
    atomic_write(out / "gpu_check.json", json.dumps(res, indent=2, sort_keys=True, default=str))
    atomic_write(out / "gpu_check.md", render_markdown(res))


def run_levers(
    args: argparse.Namespace, out: Path, ckpt: Path, prompts: Path, clock: Clock, res: dict
) -> None:
    """Prefix caching, then speculative decoding, within the time budget (the pipeline step
    keeps 90 s); a failing step is recorded and the check goes on."""
    import gpu_levers
    from routeopt.evals.storage.store import Store

    if args.skip_levers:
        res["skipped"].append("speculative decoding and prefix caching (--skip-levers)")
        return
    deadline = time.perf_counter() + clock.left() - (0 if args.skip_pipeline else 90.0)
    with Store(out / "serving.duckdb") as store:
        for name, step in (
            ("prefix_cache", lambda: gpu_levers.bench_prefix_cache(ckpt, args, out, store, deadline)),
            (
                "speculative",
                lambda: gpu_levers.bench_speculative(
                    ckpt,
                    gpu_levers.build_drafts(ckpt, out, args, build_checkpoint),
                    args,
                    prompts,
                    store,
                    deadline,
                ),
            ),
        ):
            if time.perf_counter() + 20 > deadline:
                res["skipped"].append(f"{name} (time budget)")
                continue
            print(f"  {name} ...", flush=True)
            try:
                res[name] = step()
            except Exception as exc:  # recorded, not fatal: the other figures stand
                res[name] = {"error": f"{type(exc).__name__}: {exc}"[:1000]}
            write_results(out, res, clock)
            _free(args.device)


def run_variants(
    args: argparse.Namespace, out: Path, ckpt: Path, prompts: Path, bw: float | None, clock: Clock, res: dict
) -> None:
    """Benchmark each variant in turn (a failing variant is recorded, the others still run)."""
    from routeopt.evals.storage.store import Store

    estimate = 60.0
    with Store(out / "serving.duckdb") as store:
        for variant in [v.strip() for v in args.variants.split(",") if v.strip()]:
            if clock.left() < estimate:
                res["skipped"].append(f"variant {variant} (time budget)")
                continue
            print(f"  serving {variant} at {args.concurrency} ...", flush=True)
            t0 = time.perf_counter()
            stop_after = t0 + clock.left() - 45.0
            try:
                res["variants"].append(
                    asyncio.run(bench_variant(ckpt, variant, args, prompts, store, bw, stop_after))
                )
            except Exception as exc:  # e.g. fp8 on a GPU without fp8: recorded, not fatal
                res["variants"].append(
                    {
                        "candidate": f"{args.name}-{variant}",
                        "variant": variant,
                        "error": f"{type(exc).__name__}: {exc}"[:1000],
                    }
                )
            estimate = max(estimate, 1.3 * (time.perf_counter() - t0))
            write_results(out, res, clock)
            _free(args.device)


if __name__ == "__main__":
    result = main()
    failed = [v["variant"] for v in result["variants"] if "error" in v]
    pipe_rc = (result.get("pipeline") or {}).get("rc", 0)
    sys.exit(1 if failed or pipe_rc != 0 else 0)
