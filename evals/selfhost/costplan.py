"""`routeopt cost plan`: what the routed traffic costs a month on provider APIs, against serving
each open model's routed share on GPUs at its measured throughput.

From the decision log: requests and tokens per served model, and the output tokens of every hour
of the logged window (hours without traffic count as zero). Tokens come from the gateway's usage
records or the feedback; where neither has them, input is estimated as characters / 4 and output
as the model's mean where known. The window is scaled to a month of 730 hours. Self-hosted
candidates (priced by `gpu_hour_usd`) get as many GPUs as their busiest hour needs (or `--gpus`),
at the capacity `routeopt bench serving` measured; their API price, for the comparison, comes
from `traffic.api_prices` in the config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from routeopt.evals.selfhost.costmodel import (
    HOURS_PER_MONTH,
    GpuPlan,
    capacity_tok_s,
    gpu_plan,
    measured_ratio,
    traffic_break_even,
)


@dataclass(frozen=True)
class ModelTraffic:
    """One served model's share of the logged traffic."""

    model: str
    requests: int
    input_tokens: float
    output_tokens: float
    estimated: int
    hourly_output_tokens: list[float]


@dataclass(frozen=True)
class PlanRow:
    model: str
    kind: str  # "api", "self-hosted" or "unknown"
    share: float
    monthly_requests: float
    monthly_input_tokens: float
    monthly_output_tokens: float
    api_monthly_usd: float | None
    gpu: GpuPlan | None = None
    break_even_scale: float | None = None
    note: str = ""
    capacity_source: str | None = None  # where the GPU capacity came from (bench serving or a replay)


@dataclass
class CostPlan:
    hours: int
    start: str
    end: str
    requests: int
    tokens_estimated: int
    rows: list[PlanRow] = field(default_factory=list)

    @property
    def all_api_usd(self) -> float | None:
        costs = [r.api_monthly_usd for r in self.rows]
        return None if any(c is None for c in costs) else float(sum(costs))  # type: ignore[arg-type]

    @property
    def mixed_usd(self) -> float | None:
        total = 0.0
        for r in self.rows:
            cost = r.gpu.monthly_usd if r.gpu is not None else r.api_monthly_usd
            if cost is None:
                return None
            total += cost
        return total


def _tokens(frame: pd.DataFrame) -> tuple[pd.Series, pd.Series, pd.Series]:
    """Input and output tokens per request, and which were estimated."""
    inp = pd.to_numeric(frame.get("input_tokens"), errors="coerce").astype("float64")
    out = pd.to_numeric(frame.get("output_tokens"), errors="coerce").astype("float64")
    if "feedback_input_tokens" in frame:
        inp = inp.fillna(pd.to_numeric(frame["feedback_input_tokens"], errors="coerce"))
        out = out.fillna(pd.to_numeric(frame["feedback_output_tokens"], errors="coerce"))
    estimated = inp.isna() | out.isna()
    chars = pd.to_numeric(frame.get("prompt_chars"), errors="coerce").astype("float64")
    inp = inp.fillna(chars / 4.0).fillna(0.0)
    out = out.fillna(out.groupby(frame["model"]).transform("mean")).fillna(0.0)
    return inp, out, estimated


def model_traffic(frame: pd.DataFrame) -> tuple[list[ModelTraffic], int, pd.Timestamp, pd.Timestamp]:
    """Per served model: requests, tokens and output tokens per hour of the logged window."""
    if frame.empty:
        raise ValueError("the decision log has no decisions")
    times = pd.to_datetime(frame["time"], utc=True)
    hour = times.dt.floor("h")
    start, end = hour.min(), hour.max()
    n_hours = int((end - start) / pd.Timedelta(hours=1)) + 1
    slot = ((hour - start) / pd.Timedelta(hours=1)).astype(int).to_numpy()
    inp, out, estimated = _tokens(frame)
    rows = []
    for model, idx in frame.groupby("model").indices.items():
        hourly = np.bincount(slot[idx], weights=out.to_numpy()[idx], minlength=n_hours)
        rows.append(
            ModelTraffic(
                str(model),
                len(idx),
                float(inp.iloc[idx].sum()),
                float(out.iloc[idx].sum()),
                int(estimated.iloc[idx].sum()),
                hourly.tolist(),
            )
        )
    return sorted(rows, key=lambda r: -r.requests), n_hours, start, end


def _api_cost(price: Any, input_tokens: float, output_tokens: float) -> float:
    return (
        input_tokens * (price.input_price_per_mtok or 0.0)
        + output_tokens * (price.output_price_per_mtok or 0.0)
    ) / 1e6


def _capacity(
    model: str, curves: dict[str, list], replays: dict[str, tuple] | None, min_good: float
) -> tuple[float, str, str | None]:
    """(output tok/s one GPU holds, where that figure comes from, what to run when there is none).

    With `replays`, a replay's measured capacity: the busiest minute's output tokens/s at the
    highest speed of the model's latest replay that met the SLO (`routeopt bench replay`);
    else the model: the best fixed-concurrency level of `routeopt bench serving` that met its
    latency targets."""
    if replays is not None:
        got = replays.get(model)
        if got is None:
            return (
                0.0,
                "replay",
                (
                    f"no replay of it met its SLO: run `routeopt bench replay LOG "
                    f"--candidate {model} --ttft-target-s ...`, or plan with --capacity bench"
                ),
            )
        tok_s, replay_id, speed = got
        return tok_s, f"measured: replay {replay_id} held {speed:g}x the logged traffic", None
    cap = capacity_tok_s(curves.get(model) or [], min_good)
    hint = None if cap > 0 else f"no serving benchmark: run `routeopt bench serving --candidate {model}`"
    return cap, "modelled: bench serving at fixed concurrency", hint


def plan_row(
    t: ModelTraffic,
    cfg: Any,
    curves: dict[str, list],
    scale: float,
    total: int,
    gpus: int | None,
    min_good: float,
    replays: dict[str, tuple] | None = None,
) -> PlanRow:
    """One model's monthly figures: its API bill, or GPUs for it beside its API price."""
    base = dict(
        model=t.model,
        share=t.requests / total,
        monthly_requests=t.requests * scale,
        monthly_input_tokens=t.input_tokens * scale,
        monthly_output_tokens=t.output_tokens * scale,
    )
    try:
        cand = cfg.candidate(t.model)
    except KeyError:
        return PlanRow(kind="unknown", api_monthly_usd=None, note="not a candidate of the config", **base)
    if cand.gpu_hour_usd is None:
        return PlanRow(
            kind="api",
            api_monthly_usd=_api_cost(cand, base["monthly_input_tokens"], base["monthly_output_tokens"]),
            **base,
        )
    price = cfg.traffic.api_prices.get(t.model)
    api = (
        None
        if price is None
        else _api_cost(price, base["monthly_input_tokens"], base["monthly_output_tokens"])
    )
    cap, source, missing = _capacity(t.model, curves, replays, min_good)
    if cap <= 0:
        return PlanRow(
            kind="self-hosted", api_monthly_usd=api, note=missing or "", capacity_source=source, **base
        )
    plan = gpu_plan(t.hourly_output_tokens, cap, cand.gpu_hour_usd, gpus)
    plan = GpuPlan(
        plan.gpus,
        plan.gpus * cand.gpu_hour_usd * HOURS_PER_MONTH,
        plan.utilization,
        plan.peak_tok_s,
        plan.mean_tok_s,
        cap,
        plan.serves_peak,
    )
    be = (
        None
        if api is None
        else traffic_break_even(api, cand.gpu_hour_usd * HOURS_PER_MONTH, plan.peak_tok_s, cap)
    )
    notes = [] if price is not None else ["no API price in traffic.api_prices"]
    if not plan.serves_peak:
        notes.append(f"{plan.gpus} GPU(s) cannot serve the busiest hour ({plan.peak_tok_s:.1f} tok/s)")
    bench_ratio = measured_ratio(curves[t.model]) if replays is None else None
    ratio = t.input_tokens / t.output_tokens if t.output_tokens else math.inf
    if bench_ratio and not 0.5 <= ratio / bench_ratio <= 2:
        notes.append(
            f"benchmarked at {bench_ratio:.1f} input tokens per output token, the traffic has "
            f"{ratio:.1f}: measure with prompts like the traffic's"
        )
    note = "; ".join(notes)
    return PlanRow(
        kind="self-hosted",
        api_monthly_usd=api,
        gpu=plan,
        break_even_scale=be,
        note=note,
        capacity_source=source,
        **base,
    )


def cost_plan(
    frame: pd.DataFrame,
    cfg: Any,
    curves: dict[str, list],
    *,
    gpus: int | None = None,
    min_good: float = 0.9,
    replays: dict[str, tuple] | None = None,
) -> CostPlan:
    """Everything `routeopt cost plan` prints, as data. `replays` (model -> (tok/s, replay id,
    speed), from `replay_store.replay_capacity`): size GPUs at the capacity replays measured
    instead of the serving benchmark's model."""
    traffic, hours, start, end = model_traffic(frame)
    scale = HOURS_PER_MONTH / hours
    total = len(frame)
    rows = [plan_row(t, cfg, curves, scale, total, gpus, min_good, replays) for t in traffic]
    return CostPlan(
        hours,
        start.isoformat(),
        (end + pd.Timedelta(hours=1)).isoformat(),
        total,
        sum(t.estimated for t in traffic),
        rows,
    )


def _usd(x: float | None) -> str:
    return "-" if x is None else ("inf" if math.isinf(x) else f"{x:,.2f}")


def _pct(u: float) -> str:
    return f"{u:.1%}" if u >= 0.01 else f"{u:.2%}"


def format_plan(plan: CostPlan) -> str:
    """The plan as plain text (tables that survive a pipe)."""
    w = max([5] + [len(r.model) for r in plan.rows])
    out = [
        f"logged traffic: {plan.requests:,} requests over {plan.hours} h ({plan.start} .. {plan.end}), "
        f"scaled to a month of {HOURS_PER_MONTH:g} h",
        f"tokens estimated for {plan.tokens_estimated:,} requests without usage records",
        "",
        f"{'model':<{w}} {'kind':<11} {'share':>6} {'req/month':>11} {'in Mtok/mo':>10} "
        f"{'out Mtok/mo':>11} {'API $/month':>12} {'GPUs':>4} {'util':>6} {'GPU $/month':>12} "
        f"{'self $/Mtok':>11} {'break-even':>10}",
    ]
    for r in plan.rows:
        g = r.gpu
        be = "-" if r.break_even_scale is None else f"{r.break_even_scale:,.1f}x"
        if g is not None and r.api_monthly_usd is not None and r.break_even_scale is None:
            be = "never"
        out.append(
            f"{r.model:<{w}} {r.kind:<11} {r.share:>6.1%} {r.monthly_requests:>11,.0f} "
            f"{r.monthly_input_tokens / 1e6:>10.3f} {r.monthly_output_tokens / 1e6:>11.3f} "
            f"{_usd(r.api_monthly_usd):>12} {g.gpus if g else '-':>4} "
            f"{(_pct(g.utilization) if g else '-'):>6} {_usd(g.monthly_usd if g else None):>12} "
            f"{_usd(g.usd_per_mtok if g else None):>11} {be:>10}"
        )
        if r.capacity_source and r.gpu is not None:
            out.append(
                f"{'':<{w}}   (GPU capacity {r.gpu.capacity_tok_s:,.1f} out tok/s, {r.capacity_source})"
            )
        if r.note:
            out.append(f"{'':<{w}}   ({r.note})")
    out += [
        "",
        f"monthly, everything on provider APIs: {_usd(plan.all_api_usd)} USD",
        f"monthly, benchmarked open models on their GPUs, the rest on APIs: {_usd(plan.mixed_usd)} USD",
        "util: the traffic's mean output tokens/s over what the GPUs serve; they are sized for the "
        "busiest hour and paid every hour",
        "break-even: the multiple of this traffic at which those GPUs cost no more than the API",
    ]
    return "\n".join(out)
