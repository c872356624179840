"""A latency-annotated variant of a shared outcome set, as a benchmark input for latency budgets.

The shared sets record pass/fail and cost but no latency. This script adds, per (request, model)
row, a time to first token `ttft_s` and an end-to-end `latency_s` drawn from public per-model
figures (median TTFT and output speed, table below) and the row's own prompt and response length.
It writes DIR/<set>-latency/{train,test}.parquet and a README beside them; the output is a
benchmark input, never committed and never a test fixture.

    python benchmarks/latency_data.py --set routerbench --out DIR [--seed 0] [--data PATH]

Per row (all stated; see `annotate`):

- tokens: `input_tokens` and `output_tokens` keep the source's values where recorded; a null is
  filled with ceil(UTF-8 bytes / 4) of the prompt or of the recorded response (at least 1).
- ttft_s = TTFT_model * noise_ttft * (1 + input_tokens / (PREFILL_RATIO * tps_model * TTFT_model)),
  i.e. the median TTFT plus a prefill term in which PREFILL_RATIO (100) input tokens cost as much
  as one output token (Anyscale, "Reproducible performance metrics for LLM inference", 2023). The
  public medians were measured with prompts of about 100 to 550 tokens and are used as the
  zero-prompt base; that overstates TTFT by at most that prompt's prefill term (<= 0.09 s here).
- latency_s = ttft_s + output_tokens / tps_model * noise_decode.
- noise: lognormal with median 1, sigma 0.35 for TTFT and 0.2 for decode. LLMPerf's figures give
  TTFT p95/p50 of 1.2 to 1.6 at 5 concurrent requests (sigma 0.12 to 0.27) and a decode
  interquartile ratio of 1.32 for Claude Instant on Bedrock (sigma 0.21); 0.35 leaves room for
  load that those short runs did not see (p95/p50 = 1.78).
- draws come from blake2b(seed, split, request_id, model, kind), so a rerun writes identical
  files and the train and test splits share no draw (six RouterBench request ids are in both).

Figures (median TTFT in seconds, output tokens/s). "AA" is Artificial Analysis
(https://artificialanalysis.ai, medians over the 14 days before the page was stored); "LLMPerf"
is the Ray project's leaderboard (https://github.com/ray-project/llmperf-leaderboard, 550 input /
150 output tokens, concurrency 5, results of 2023-12-19). Where no public figure exists for the
exact model and host, the closest documented one is used and the row says so.

| model | TTFT | tok/s | host | source, date | note |
| --- | --- | --- | --- | --- | --- |
| gpt-4-1106-preview | 0.59 | 20 | OpenAI | TTFT: AA GPT-4 page (artificialanalysis.ai/models/gpt-4), spring 2024; tok/s: AA "GPT-4 Turbo" snapshot (therightstack.com copy of the AA comparison page), Feb 2024 | estimate for TTFT: GPT-4 (0613)'s figure; AA's OpenAI page ranks GPT-4 Turbo's TTFT after GPT-4's, so this is a lower bound |
| gpt-3.5-turbo-1106 | 0.46 | 60 | OpenAI | AA OpenAI provider page (artificialanalysis.ai/providers/openai), spring 2024 | "GPT-3.5 Turbo" (then 0125), not 1106 |
| claude-instant-v1 | 1.21 | 65.6 | Amazon Bedrock | LLMPerf run on Bedrock, huggingface.co/datasets/ssong1/llmperf-bedrock README, 2024 | exact model |
| claude-v2 | 1.09 | 29 | Anthropic | TTFT: AA Claude 2.1 providers page (artificialanalysis.ai/models/claude-21/providers), 2024; tok/s: AA "Claude 2.0" snapshot, Feb 2024 | TTFT is Claude 2.1's |
| claude-v1 | 1.09 | 29 | Anthropic | as claude-v2 | estimate: no public figure for Claude 1; Claude 2's used |
| meta/llama-2-70b-chat | 0.63 | 65 | Together AI | LLMPerf, together llama-2-70b-chat, 2023-12-19 | exact model |
| WizardLM/WizardLM-13B-V1.2 | 0.54 | 102 | Together AI | LLMPerf, together llama-2-13b-chat, 2023-12-19 | a Llama-2-13B fine-tune: Llama-2-13B's figures |
| meta/code-llama-instruct-34b-chat | 0.59 | 79 | Together AI | interpolated in log(parameters) between LLMPerf together 13B and 70B | estimate: no public figure found for a 34B dense model |
| zero-one-ai/Yi-34B-Chat | 0.59 | 79 | Together AI | as code-llama-34b | estimate, as above |
| mistralai/mistral-7b-chat | 0.22 | 87.4 | Together AI | AA Mistral 7B Instruct providers page (artificialanalysis.ai/models/mistral-7b-instruct/providers), 2024-25 | AA tracks v0.3, not v0.1 |
| mistralai/mixtral-8x7b-chat | 0.54 | 107 | Together AI | tok/s: AA "Mixtral 8x7B" snapshot, Feb 2024; TTFT: LLMPerf together llama-2-13b-chat | estimate for TTFT: 12.9B active parameters, so a 13B model's prefill |

Hosts for the open models are assumed to be Together AI, whose model names RouterBench's
resemble; RouterBench itself records no latency. A few names in the other shared sets are the
same models and map onto these rows (`ALIASES`); any other model makes the script stop naming it.
"""

from __future__ import annotations

import argparse
import hashlib
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from statistics import NormalDist

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent))

SIGMA_TTFT = 0.35
SIGMA_DECODE = 0.2
PREFILL_RATIO = 100.0  # input tokens that cost as much time as one output token
BYTES_PER_TOKEN = 4
MISS_SHARE = 0.20  # the condition: the cheapest passing model misses on >= 20% of requests


@dataclass(frozen=True)
class Figure:
    ttft_s: float
    tokens_per_s: float
    source: str


FIGURES: dict[str, Figure] = {
    "gpt-4-1106-preview": Figure(0.59, 20.0, "AA GPT-4 TTFT (estimate) / AA GPT-4 Turbo tok/s"),
    "gpt-3.5-turbo-1106": Figure(0.46, 60.0, "AA OpenAI page, GPT-3.5 Turbo"),
    "claude-instant-v1": Figure(1.21, 65.6, "LLMPerf on Bedrock (ssong1/llmperf-bedrock)"),
    "claude-v2": Figure(1.09, 29.0, "AA Claude 2.1 TTFT / AA Claude 2.0 tok/s"),
    "claude-v1": Figure(1.09, 29.0, "estimate: Claude 2's figures"),
    "meta/llama-2-70b-chat": Figure(0.63, 65.0, "LLMPerf together llama-2-70b-chat"),
    "WizardLM/WizardLM-13B-V1.2": Figure(0.54, 102.0, "LLMPerf together llama-2-13b-chat"),
    "meta/code-llama-instruct-34b-chat": Figure(0.59, 79.0, "estimate: LLMPerf 13B-70B interpolation"),
    "zero-one-ai/Yi-34B-Chat": Figure(0.59, 79.0, "estimate: LLMPerf 13B-70B interpolation"),
    "mistralai/mistral-7b-chat": Figure(0.22, 87.4, "AA Mistral 7B Instruct on Together"),
    "mistralai/mixtral-8x7b-chat": Figure(0.54, 107.0, "AA Mixtral tok/s / 13B TTFT (estimate)"),
}

ALIASES: dict[str, str] = {  # the same model under another set's name
    "gpt4_1106_preview": "gpt-4-1106-preview",
    "claude": "claude-v1",
    "claude-2": "claude-v2",
    "llama-2-70b-chat-hf": "meta/llama-2-70b-chat",
    "Yi-34B-Chat": "zero-one-ai/Yi-34B-Chat",
    "01-ai/Yi-34B-Chat": "zero-one-ai/Yi-34B-Chat",
    "mistralai/Mixtral-8x7B-Instruct-v0.1": "mistralai/mixtral-8x7b-chat",
    "mistralai/Mistral-7B-Instruct-v0.1": "mistralai/mistral-7b-chat",
}


def figures_for(models: list[str], figures: dict[str, Figure] | None = None) -> dict[str, Figure]:
    """The figure of every model, or a ValueError naming each model that has none."""
    table = FIGURES if figures is None else figures
    found = {m: table.get(m) or table.get(ALIASES.get(m, "")) for m in models}
    missing = sorted(m for m, f in found.items() if f is None)
    if missing:
        raise ValueError(
            f"no public latency figure for {len(missing)} model(s): {', '.join(missing)}; "
            "add them to FIGURES (with a source) or ALIASES in benchmarks/latency_data.py"
        )
    return {m: f for m, f in found.items() if f is not None}


def token_estimate(texts: pd.Series) -> np.ndarray:
    """ceil(UTF-8 bytes / 4), at least 1; a missing text counts as empty."""
    sizes = np.array([len(t.encode("utf-8")) if isinstance(t, str) else 0 for t in texts])
    return np.maximum(1, -(-sizes // BYTES_PER_TOKEN))


def normal_draws(keys: list[str]) -> np.ndarray:
    """One standard normal per key, from its blake2b hash: the same key, the same draw."""
    unit = NormalDist()
    out = np.empty(len(keys))
    for i, key in enumerate(keys):
        h = int.from_bytes(hashlib.blake2b(key.encode("utf-8"), digest_size=8).digest(), "big")
        out[i] = unit.inv_cdf((h + 0.5) / 2**64)
    return out


def _keys(frame: pd.DataFrame, split: str, seed: int, kind: str) -> list[str]:
    return [
        f"{seed}\x1f{split}\x1f{r}\x1f{m}\x1f{kind}"
        for r, m in zip(frame["request_id"].astype(str), frame["model"].astype(str))
    ]


def annotate(
    frame: pd.DataFrame, split: str, seed: int = 0, figures: dict[str, Figure] | None = None
) -> pd.DataFrame:
    """The long frame with input/output tokens filled and ttft_s, latency_s added."""
    fig = figures_for(sorted(frame["model"].astype(str).unique()), figures)
    out = frame.copy()
    filled_in = pd.to_numeric(out["input_tokens"], errors="coerce")
    filled_out = pd.to_numeric(out["output_tokens"], errors="coerce")
    in_tok = np.where(filled_in.isna(), token_estimate(out["prompt"]), filled_in).astype(np.int64)
    out_tok = np.where(filled_out.isna(), token_estimate(out["response"]), filled_out).astype(np.int64)
    base_ttft = out["model"].map(lambda m: fig[m].ttft_s).to_numpy(float)
    tps = out["model"].map(lambda m: fig[m].tokens_per_s).to_numpy(float)
    noise_ttft = np.exp(SIGMA_TTFT * normal_draws(_keys(out, split, seed, "ttft")))
    noise_decode = np.exp(SIGMA_DECODE * normal_draws(_keys(out, split, seed, "decode")))
    ttft = base_ttft * noise_ttft * (1.0 + in_tok / (PREFILL_RATIO * tps * base_ttft))
    out["input_tokens"] = in_tok
    out["output_tokens"] = out_tok
    out["ttft_s"] = ttft
    out["latency_s"] = ttft + out_tok / tps * noise_decode
    return out


def cheapest_passing(frame: pd.DataFrame, pass_score: float = 1.0) -> pd.DataFrame:
    """Per request, the row of the cheapest model that passed (ties: model name)."""
    passed = frame[frame["score"] >= pass_score]
    ordered = passed.sort_values(["request_id", "cost_usd", "model"])
    return ordered.drop_duplicates("request_id", keep="first")


def budget_missed_by_cheapest(frame: pd.DataFrame, column: str = "ttft_s") -> float:
    """B such that every budget below B is missed (value > budget) by the cheapest passing model
    on >= MISS_SHARE of requests, and B itself is missed on fewer."""
    values = np.sort(cheapest_passing(frame)[column].to_numpy(float))
    if values.size == 0:
        return math.nan
    return float(values[values.size - math.ceil(MISS_SHARE * values.size - 1e-9)])


def summary(frame: pd.DataFrame) -> pd.DataFrame:
    """Per model: TTFT and end-to-end p50/p95, mean cost per request, pass rate."""
    grouped = frame.groupby("model")
    table = pd.DataFrame(
        {
            "ttft_p50": grouped["ttft_s"].median(),
            "ttft_p95": grouped["ttft_s"].quantile(0.95),
            "e2e_p50": grouped["latency_s"].median(),
            "e2e_p95": grouped["latency_s"].quantile(0.95),
            "cost_mean": grouped["cost_usd"].mean(),
            "pass_rate": grouped["score"].mean(),
        }
    )
    return table.sort_values("cost_mean")


def _write_parquet(frame: pd.DataFrame, path: Path) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    frame.to_parquet(tmp, index=False)
    with open(tmp, "rb") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _readme(name: str, seed: int, models: list[str]) -> str:
    lines = [
        f"# {name}-latency: the shared `{name}` outcomes with simulated latency",
        "",
        f"Written by `python benchmarks/latency_data.py --set {name} --seed {seed}` (routeopt).",
        "Same rows and columns as the source, `input_tokens`/`output_tokens` filled where null",
        "(ceil(UTF-8 bytes / 4) of prompt / response), plus `ttft_s` and `latency_s` in seconds.",
        "",
        "Latency is **simulated**, not measured: each model's public median TTFT and output speed,",
        f"a prefill term, and lognormal noise (sigma {SIGMA_TTFT} TTFT, {SIGMA_DECODE} decode) drawn",
        "from a hash of (seed, split, request_id, model). The formula and the sources, with the",
        "estimates marked, are in the docstring of benchmarks/latency_data.py.",
        "",
        "| model | TTFT median (s) | output tokens/s | source |",
        "| --- | --- | --- | --- |",
    ]
    fig = figures_for(models)
    lines += [f"| {m} | {fig[m].ttft_s} | {fig[m].tokens_per_s} | {fig[m].source} |" for m in models]
    return "\n".join(lines) + "\n"


def build(data: Path, name: str, out: Path, seed: int) -> dict[str, pd.DataFrame]:
    """Annotate both splits of one set and write them with a README; returns the frames."""
    src = data / name
    splits = {s: pd.read_parquet(src / f"{s}.parquet") for s in ("train", "test")}
    models = sorted(set().union(*(set(f["model"].astype(str)) for f in splits.values())))
    figures_for(models)  # fail before writing anything
    dest = out / f"{name}-latency"
    dest.mkdir(parents=True, exist_ok=True)
    done = {s: annotate(f, s, seed) for s, f in splits.items()}
    for s, f in done.items():
        _write_parquet(f, dest / f"{s}.parquet")
    (dest / "README.md").write_text(_readme(name, seed, models))
    return done


def main(argv: list[str] | None = None) -> int:
    from router_data import data_dir

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--set", required=True, choices=["routerbench", "alpacaeval", "openllm_bbh"])
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--data", type=Path, default=None, help="default: ../shared/data")
    args = parser.parse_args(argv)
    try:
        done = build(args.data or data_dir(), args.set, args.out, args.seed)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    train = done["train"]
    with pd.option_context("display.width", 140, "display.float_format", "{:.4g}".format):
        print(f"{args.set} train ({train['request_id'].nunique()} requests), seconds and USD:")
        print(summary(train).to_string())
    for column in ("ttft_s", "latency_s"):
        b = budget_missed_by_cheapest(train, column)
        print(
            f"{column}: the cheapest passing model misses any budget below {b:.3f} s on >= "
            f"{MISS_SHARE:.0%} of train requests, and {b:.3f} s itself on fewer"
        )
    print(f"wrote {args.out / (args.set + '-latency')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
