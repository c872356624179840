"""What a self-hosted token costs, next to an API's list price.

A GPU is paid by the hour whether it is busy or idle, so a self-hosted token costs
`gpu_hour_usd / (3600 * tokens_per_second * utilisation)`: the throughput comes from the serving
benchmark (`routeopt.evals.selfhost.serving`, one point per concurrency level) and the utilisation is the share of
paid hours the GPU spends serving. An API token costs its list price, plus the input tokens that
come with each output token. Comparing the two per million *output* tokens is fair only when the
self-hosted throughput was measured on prompts like the traffic's (prefill time is in it), so the
API side is priced with the same input/output ratio the benchmark measured.

A self-hosted candidate with a draft model (speculative decoding) is priced as one candidate:
the draft runs on the same GPU in the same engine, so the GPU-hour price and the throughput
measured with the draft already include its compute. Its memory is not free, though: the
draft's weights and KV cache (and the prefix cache's blocks) share the device with the target's,
which leaves less room for the batch; the benchmark's throughput curve includes that too.

Prompt caching changes what an API's input costs: `caching_savings` compares what a run's
calls were billed for their input (cache reads and writes at the candidate's cache prices) with
the same input at the plain input price.

Pure functions over numbers; `load_curve` and `load_caching` read the store.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Sequence

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate
    from routeopt.evals.storage.store import Store

SECONDS_PER_DAY = 86_400.0
DEFAULT_UTILIZATIONS: tuple[float, ...] = (0.1, 0.25, 0.5, 1.0)


@dataclass(frozen=True)
class ThroughputPoint:
    """One concurrency level of a serving benchmark."""

    concurrency: int
    output_tok_s: float
    goodput_rps: float | None = None
    request_rps: float | None = None
    mean_input_tokens: float | None = None
    mean_output_tokens: float | None = None

    @property
    def good_fraction(self) -> float | None:
        """Share of requests that met the latency targets (None without targets)."""
        if self.goodput_rps is None or not self.request_rps:
            return None
        return self.goodput_rps / self.request_rps


@dataclass(frozen=True)
class CostRow:
    concurrency: int
    output_tok_s: float
    utilization: float
    usd_per_mtok: float


@dataclass(frozen=True)
class BreakEven:
    """Daily output-token volumes where self-hosting on reserved GPUs beats the API.

    `first_tok_per_day`: one GPU, 24/7, becomes cheaper than the API. Each extra GPU adds a
    step of fixed cost, so just past a step the API can win again; above `always_tok_per_day`
    it never does. `ratio` = self-hosted cost at full load / API price (< 1 for a break-even).
    """

    first_tok_per_day: float
    always_tok_per_day: float
    capacity_tok_per_day: float
    ratio: float


def usd_per_mtok(gpu_hour_usd: float, output_tok_s: float, utilization: float = 1.0) -> float:
    """Cost of a million output tokens from a GPU that serves `utilization` of its paid hours."""
    if gpu_hour_usd < 0:
        raise ValueError(f"gpu_hour_usd must be >= 0, got {gpu_hour_usd}")
    if not 0 < utilization <= 1:
        raise ValueError(f"utilization must be in (0, 1], got {utilization}")
    if output_tok_s <= 0 or not math.isfinite(output_tok_s):
        return math.inf
    return gpu_hour_usd / 3600.0 / (output_tok_s * utilization) * 1e6


def cost_table(
    points: Sequence[ThroughputPoint],
    gpu_hour_usd: float,
    utilizations: Sequence[float] = DEFAULT_UTILIZATIONS,
) -> list[CostRow]:
    """$/Mtok at every (concurrency level x utilisation), in curve order."""
    return [
        CostRow(p.concurrency, p.output_tok_s, u, usd_per_mtok(gpu_hour_usd, p.output_tok_s, u))
        for p in sorted(points, key=lambda p: p.concurrency)
        for u in utilizations
    ]


def usable_points(points: Sequence[ThroughputPoint], min_good: float = 0.9) -> list[ThroughputPoint]:
    """Levels where at least `min_good` of requests met the targets (all, without targets).

    Throughput bought by blowing the latency target is not capacity one can sell.
    """
    return [p for p in points if p.good_fraction is None or p.good_fraction >= min_good]


def capacity_tok_s(points: Sequence[ThroughputPoint], min_good: float = 0.9) -> float:
    """The most output tokens/s one GPU delivers while meeting the targets (0 if none does)."""
    usable = usable_points(points, min_good)
    return max((p.output_tok_s for p in usable), default=0.0)


def throughput_at(points: Sequence[ThroughputPoint], concurrency: int) -> float:
    """Output tokens/s at a concurrency, interpolated linearly on the measured curve (clamped)."""
    if not points:
        raise ValueError("no throughput points: run `routeopt bench serving` first")
    pts = sorted(points, key=lambda p: p.concurrency)
    if concurrency <= pts[0].concurrency:
        return pts[0].output_tok_s
    for lo, hi in zip(pts, pts[1:]):
        if concurrency <= hi.concurrency:
            w = (concurrency - lo.concurrency) / (hi.concurrency - lo.concurrency)
            return lo.output_tok_s + w * (hi.output_tok_s - lo.output_tok_s)
    return pts[-1].output_tok_s


def api_usd_per_mtok(
    candidate: "Candidate", input_per_output: float = 0.0, cached_fraction: float = 0.0
) -> float:
    """An API candidate's list price per million output tokens, with the input that comes along.

    `input_per_output` input tokens accompany each output token; `cached_fraction` of them are
    billed at the cached-input price (the input price where none is listed).
    """
    if candidate.gpu_hour_usd is not None:
        raise ValueError(f"candidate {candidate.name!r} is GPU-priced, not token-priced")
    if input_per_output < 0 or not 0 <= cached_fraction <= 1:
        raise ValueError("input_per_output must be >= 0 and cached_fraction in [0, 1]")
    price_in = candidate.input_price_per_mtok or 0.0
    price_cached = candidate.cache_prices()[0]
    blended_in = (1 - cached_fraction) * price_in + cached_fraction * price_cached
    return (candidate.output_price_per_mtok or 0.0) + input_per_output * blended_in


def selfhost_daily_usd(tok_per_day: float, gpu_hour_usd: float, capacity_tok_s: float) -> float:
    """Daily bill of enough reserved GPUs (at least one) to serve a volume at full load."""
    if capacity_tok_s <= 0:
        return math.inf
    gpus = max(1, math.ceil(tok_per_day / (capacity_tok_s * SECONDS_PER_DAY) - 1e-12))
    return gpus * gpu_hour_usd * 24.0


def api_daily_usd(tok_per_day: float, api_usd_per_mtok_: float) -> float:
    return tok_per_day * api_usd_per_mtok_ / 1e6


def break_even(gpu_hour_usd: float, capacity_tok_s: float, api_usd_per_mtok_: float) -> BreakEven | None:
    """Where reserved GPUs get cheaper than the API; None if the API wins even at full load.

    With n GPUs (volume in ((n-1)C, nC]) self-hosting wins iff volume >= n*D/p (D = one GPU-day,
    p = API $/token). The API can win inside band n only while n < 1/(1-r), r = D/(pC).
    """
    if capacity_tok_s <= 0 or api_usd_per_mtok_ <= 0:
        return None
    cap_day = capacity_tok_s * SECONDS_PER_DAY
    first = gpu_hour_usd * 24.0 / (api_usd_per_mtok_ / 1e6)
    ratio = first / cap_day
    if ratio >= 1:
        return None
    n_max = max(1, math.ceil(1.0 / (1.0 - ratio)) - 1)
    return BreakEven(first, n_max * first, cap_day, ratio)


def configured_usd_per_mtok(candidate: "Candidate", points: Sequence[ThroughputPoint]) -> float | None:
    """Self-hosted $/Mtok at the utilisation and concurrency the config states for a candidate.

    None for API candidates. The runner keeps `max_concurrency` requests in flight, so the
    throughput is the curve's value there.
    """
    if candidate.gpu_hour_usd is None:
        return None
    tok_s = throughput_at(points, candidate.max_concurrency)
    return usd_per_mtok(candidate.gpu_hour_usd, tok_s, candidate.utilization)


def request_cost_usd(
    candidate: "Candidate", output_tokens: int, points: Sequence[ThroughputPoint]
) -> float | None:
    """One request's self-hosted cost at the configured utilisation (None for API candidates)."""
    rate = configured_usd_per_mtok(candidate, points)
    return None if rate is None else rate * output_tokens / 1e6


def stored_usd_per_mtok(store: "Store", candidate: "Candidate") -> float | None:
    """Self-hosted $/Mtok at the configured utilisation, from the candidate's latest stored
    serving benchmark; None for API candidates or when none was run."""
    if candidate.gpu_hour_usd is None:
        return None
    points = load_curve(store, candidate.name)
    return configured_usd_per_mtok(candidate, points) if points else None


def load_curve(store: "Store", candidate: str, bench_id: str | None = None) -> list[ThroughputPoint]:
    """The throughput curve of a candidate's latest (or named) serving benchmark in the store."""
    from routeopt.evals.selfhost.serving import SERVING_TABLE

    with store._lock:
        have = store._con.execute(
            "SELECT count(*) FROM information_schema.tables WHERE table_name = ?", [SERVING_TABLE]
        ).fetchone()[0]
    if not have:
        return []
    if bench_id is None:
        latest = store.query(
            f"SELECT bench_id FROM {SERVING_TABLE} WHERE candidate = ? ORDER BY created_at DESC LIMIT 1",
            [candidate],
        )
        if latest.empty:
            return []
        bench_id = str(latest.iloc[0]["bench_id"])
    df = store.query(
        f"SELECT concurrency, output_tok_s, goodput_rps, request_rps, mean_input_tokens, "
        f"mean_output_tokens FROM {SERVING_TABLE} WHERE candidate = ? AND bench_id = ? "
        "ORDER BY concurrency",
        [candidate, bench_id],
    )
    return [
        ThroughputPoint(
            int(r.concurrency),
            float(r.output_tok_s),
            None if _nan(r.goodput_rps) else float(r.goodput_rps),
            None if _nan(r.request_rps) else float(r.request_rps),
            None if _nan(r.mean_input_tokens) else float(r.mean_input_tokens),
            None if _nan(r.mean_output_tokens) else float(r.mean_output_tokens),
        )
        for r in df.itertuples()
    ]


def _nan(x: object) -> bool:
    return x is None or (isinstance(x, float) and math.isnan(x))


@dataclass(frozen=True)
class SelfHostedSummary:
    candidate: str
    gpu_hour_usd: float
    utilization: float
    capacity_tok_s: float
    input_per_output: float | None
    configured_usd_per_mtok: float | None
    table: list[CostRow]
    good_fraction: dict[int, float | None]


@dataclass(frozen=True)
class PairVerdict:
    """One self-hosted candidate against one API candidate."""

    self_hosted: str
    api: str
    api_usd_per_mtok: float
    self_usd_per_mtok_full_load: float
    break_even: BreakEven | None


def compare(
    candidates: Sequence["Candidate"],
    curves: dict[str, list[ThroughputPoint]],
    utilizations: Sequence[float] = DEFAULT_UTILIZATIONS,
    input_per_output: float | None = None,
    min_good: float = 0.9,
) -> tuple[list[SelfHostedSummary], list[PairVerdict]]:
    """Everything `routeopt cost compare` prints, as data: per self-hosted candidate its cost
    table and configured cost, and per (self-hosted, API) pair the break-even volumes.

    API prices include the input tokens the benchmark's prompts carried per output token
    (override with `input_per_output`), so both sides price the same traffic.
    """
    apis = [c for c in candidates if c.gpu_hour_usd is None]
    summaries: list[SelfHostedSummary] = []
    verdicts: list[PairVerdict] = []
    for c in candidates:
        points = curves.get(c.name) or []
        if c.gpu_hour_usd is None or not points:
            continue
        ratio = input_per_output if input_per_output is not None else measured_ratio(points)
        cap = capacity_tok_s(points, min_good)
        summaries.append(
            SelfHostedSummary(
                c.name,
                c.gpu_hour_usd,
                c.utilization,
                cap,
                ratio,
                configured_usd_per_mtok(c, points),
                cost_table(points, c.gpu_hour_usd, utilizations),
                {p.concurrency: p.good_fraction for p in points},
            )
        )
        for a in apis:
            price = api_usd_per_mtok(a, ratio or 0.0)
            verdicts.append(
                PairVerdict(
                    c.name,
                    a.name,
                    price,
                    usd_per_mtok(c.gpu_hour_usd, cap),
                    break_even(c.gpu_hour_usd, cap, price),
                )
            )
    return summaries, verdicts


def measured_ratio(points: Sequence[ThroughputPoint]) -> float | None:
    """Mean input tokens per output token over the benchmark's levels (None if unknown)."""
    ins = [p.mean_input_tokens for p in points if p.mean_input_tokens is not None]
    outs = [p.mean_output_tokens for p in points if p.mean_output_tokens]
    if not ins or not outs:
        return None
    return (sum(ins) / len(ins)) / (sum(outs) / len(outs))


@dataclass(frozen=True)
class CachingSavings:
    """What prompt caching did for one candidate's calls in one run.

    Tokens as the provider reported them (for `local` candidates: prompt tokens taken from the
    prefix cache). Dollars only for token-priced candidates: a GPU-priced candidate's saving
    is the prefill it did not compute, which shows in its measured throughput instead.
    """

    candidate: str
    calls: int
    input_tokens: int
    cache_read_tokens: int
    cache_write_tokens: int
    input_usd: float | None = None  # billed for the input, reads and writes at cache prices
    uncached_input_usd: float | None = None  # the same input at the plain input price

    @property
    def saved_usd(self) -> float | None:
        if self.input_usd is None or self.uncached_input_usd is None:
            return None
        return self.uncached_input_usd - self.input_usd


def caching_savings(
    candidate: "Candidate", calls: int, input_tokens: int, cache_read: int, cache_write: int
) -> CachingSavings:
    """Input $ with the recorded cache reads and writes against the same input uncached."""
    if candidate.gpu_hour_usd is not None:
        return CachingSavings(candidate.name, calls, input_tokens, cache_read, cache_write)
    return CachingSavings(
        candidate.name,
        calls,
        input_tokens,
        cache_read,
        cache_write,
        candidate.input_cost_usd(input_tokens, cache_read, cache_write),
        candidate.input_cost_usd(input_tokens),
    )


def load_caching(store: "Store", run_id: str, candidates: Sequence["Candidate"] = ()) -> list[CachingSavings]:
    """Prompt caching per candidate in one run, priced with `candidates` (default: the specs
    the run recorded). Answers replayed from the response cache made no call: left out."""
    from routeopt.evals.config import Candidate

    with store._lock:
        cols = {
            r[0]
            for r in store._con.execute(
                "SELECT column_name FROM information_schema.columns WHERE table_name = 'outcomes'"
            ).fetchall()
        }
    writes = "sum(cache_write_input_tokens)" if "cache_write_input_tokens" in cols else "0"
    df = store.query(
        f"SELECT candidate, count(*) AS calls, coalesce(sum(input_tokens), 0) AS inp, "
        f"coalesce(sum(cached_input_tokens), 0) AS rd, coalesce({writes}, 0) AS wr "
        "FROM outcomes WHERE run_id = ? AND error_kind IS NULL AND NOT cached "
        "GROUP BY candidate ORDER BY candidate",
        [run_id],
    )
    known = {c.name: c for c in candidates}
    if not known:
        specs = store.query("SELECT name, spec_json FROM candidates WHERE run_id = ?", [run_id])
        for r in specs.itertuples():
            try:
                known[r.name] = Candidate.model_validate_json(r.spec_json)
            except ValueError:  # a spec from another version of the config: tokens only
                continue
    out = []
    for r in df.itertuples():
        args = (int(r.calls), int(r.inp), int(r.rd), int(r.wr))
        c = known.get(r.candidate)
        out.append(caching_savings(c, *args) if c is not None else CachingSavings(r.candidate, *args))
    return out


# -- serving real traffic: GPUs sized for its peak hour, paid every hour ------------------------

HOURS_PER_MONTH = 730.0


@dataclass(frozen=True)
class GpuPlan:
    """N GPUs serving a traffic's output tokens: what they cost a month and how busy they are."""

    gpus: int
    monthly_usd: float
    utilization: float
    peak_tok_s: float
    mean_tok_s: float
    capacity_tok_s: float
    serves_peak: bool

    @property
    def usd_per_mtok(self) -> float:
        tokens = self.mean_tok_s * 3600.0 * HOURS_PER_MONTH
        return math.inf if tokens <= 0 else self.monthly_usd / tokens * 1e6


def gpu_plan(
    hourly_output_tokens: Sequence[float],
    capacity_tok_s: float,
    gpu_hour_usd: float,
    gpus: int | None = None,
    hours_per_month: float = HOURS_PER_MONTH,
) -> GpuPlan:
    """GPUs for a traffic given per hour (`gpus`, or enough for its busiest hour, at least one).

    Utilisation is the traffic's mean load over what the GPUs could serve: a GPU sized for the
    peak idles the rest of the day, and its idle hours are paid like busy ones.
    """
    hours = [float(h) for h in hourly_output_tokens]
    if not hours or min(hours) < 0:
        raise ValueError("hourly_output_tokens needs one non-negative value per hour")
    if capacity_tok_s <= 0:
        raise ValueError("capacity_tok_s must be > 0: run `routeopt bench serving` first")
    peak, mean = max(hours) / 3600.0, sum(hours) / len(hours) / 3600.0
    n = gpus if gpus is not None else max(1, math.ceil(peak / capacity_tok_s - 1e-12))
    if n < 1:
        raise ValueError(f"gpus must be >= 1, got {n}")
    return GpuPlan(
        n,
        n * gpu_hour_usd * hours_per_month,
        mean / (n * capacity_tok_s),
        peak,
        mean,
        capacity_tok_s,
        peak <= n * capacity_tok_s * (1 + 1e-9),
    )


def traffic_break_even(
    api_monthly_usd: float,
    gpu_monthly_usd: float,
    peak_tok_s: float,
    capacity_tok_s: float,
    max_gpus: int = 1_000_000,
) -> float | None:
    """The smallest multiple s of a traffic at which enough GPUs for its peak cost no more than
    the API would; None if the API stays cheaper at any volume.

    At scale s the API costs s*A and self-hosting ceil(s*p/C)*G. Within band n (s in
    ((n-1)C/p, nC/p]) self-hosting wins from s = nG/A on, so the first n whose band reaches
    that point gives the answer; that needs G*p/(C*A) <= 1.
    """
    if api_monthly_usd <= 0 or peak_tok_s <= 0 or capacity_tok_s <= 0:
        return None
    band = capacity_tok_s / peak_tok_s  # the traffic multiple one more GPU adds
    if gpu_monthly_usd / api_monthly_usd > band * (1 + 1e-12):
        return None
    for n in range(1, max_gpus + 1):
        s = max((n - 1) * band, n * gpu_monthly_usd / api_monthly_usd)
        if s <= n * band * (1 + 1e-12):
            return s
    return None
