"""The serving benchmark: how fast a candidate answers under a fixed number of requests in flight.

For each concurrency level c, N requests run through the candidate's provider with exactly c in
flight (c workers, each sending its next request as soon as its last one finishes), the way
vLLM's `benchmark_serving` with a fixed concurrency does. Definitions are vLLM's, and the same
the eval runner records: TTFT = first non-empty content chunk minus send time; TPOT = (latency -
TTFT) / (output tokens - 1); inter-token latency (ITL) = the gaps between content chunks, pooled
over requests; goodput = requests per second that met every latency target given.

Works with any provider: an OpenAI-compatible server (an `openai` candidate with `base_url`) or
an in-process `local` checkpoint. A `local` candidate with a draft model (speculative decoding)
also reports the draft's acceptance rate (accepted / proposed tokens) and mean accepted length
(tokens per target pass: 1 + accepted / verification steps, vLLM's "mean acceptance length"),
and `without_draft` gives the same candidate without it, for the speed-up. Results go to the DuckDB table `serving_runs`, one row per
(benchmark, candidate, concurrency), which `routeopt.evals.selfhost.costmodel` turns into $/Mtok.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Mapping, Sequence

import numpy as np

from routeopt.evals.suite.datasets import jsonl_records
from routeopt.evals.providers.base import GenerationSettings, Message, Provider, ProviderError, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate
    from routeopt.evals.storage.store import Store

SERVING_TABLE = "serving_runs"
PERCENTILES: tuple[int, ...] = (50, 90, 99)
DEFAULT_MAX_TOKENS = 128


class ServingError(ValueError):
    """Bad benchmark input (prompts file, levels); the message names the file/line or option."""


@dataclass(frozen=True)
class Targets:
    """Latency targets (SLOs) a request must meet to count towards goodput."""

    latency_s: float | None = None
    ttft_s: float | None = None
    tpot_s: float | None = None

    @property
    def any(self) -> bool:
        return any(v is not None for v in (self.latency_s, self.ttft_s, self.tpot_s))


@dataclass
class RequestRecord:
    """What one benchmark request did (times relative to the level's start)."""

    start_s: float
    end_s: float
    ok: bool
    ttft_s: float | None = None
    latency_s: float | None = None
    tpot_s: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    chunk_gaps_s: list[float] = field(default_factory=list)
    error_kind: str | None = None
    draft_tokens: int | None = None
    accepted_draft_tokens: int | None = None
    cached_input_tokens: int | None = None


@dataclass
class LevelResult:
    """One concurrency level's figures (seconds; tokens/s)."""

    concurrency: int
    requests: int
    errors: int
    wall_s: float
    max_in_flight: int
    mean_in_flight: float
    ttft_s: dict[str, float] | None
    tpot_s: dict[str, float] | None
    itl_s: dict[str, float] | None
    latency_s: dict[str, float] | None
    request_tok_s: dict[str, float] | None
    output_tok_s: float
    input_tok_s: float
    request_rps: float
    goodput_rps: float | None
    mean_input_tokens: float | None
    mean_output_tokens: float | None
    acceptance_rate: float | None = None  # speculative decoding: accepted / proposed tokens
    mean_accepted_length: float | None = None  # tokens per target pass (1 + accepted / steps)
    records: list[RequestRecord] = field(default_factory=list, repr=False)


@dataclass
class ServingReport:
    bench_id: str
    candidate: str
    spec: dict[str, Any]
    prompts: str
    targets: Targets
    levels: list[LevelResult]
    skipped_levels: list[int] = field(default_factory=list)
    created_at: datetime = field(default_factory=lambda: datetime.now(timezone.utc))


def percentiles(values: Sequence[float], qs: Sequence[int] = PERCENTILES) -> dict[str, float] | None:
    """p50/p90/p99 (and mean) of a sample, as vLLM reports them; None for an empty sample."""
    if len(values) == 0:
        return None
    arr = np.asarray(values, dtype=float)
    out = {f"p{q}": float(np.percentile(arr, q)) for q in qs}
    out["mean"] = float(arr.mean())
    return out


def parse_levels(text: str) -> list[int]:
    """`"1,8,32,128"` -> [1, 8, 32, 128]; a bad entry is named."""
    levels = []
    for part in text.split(","):
        part = part.strip()
        if not part.isdigit() or int(part) < 1:
            raise ServingError(f"--concurrency: {part!r} is not a positive integer (e.g. 1,8,32)")
        levels.append(int(part))
    if not levels:
        raise ServingError("--concurrency: give at least one level, e.g. 1,8,32")
    return levels


def _request_from_row(row: Any, where: str, max_tokens: int | None) -> Request:
    if not isinstance(row, dict):
        raise ServingError(f"{where}: expected a JSON object with 'prompt' or 'messages'")
    n = max_tokens or row.get("max_tokens") or DEFAULT_MAX_TOKENS
    if not isinstance(n, int) or n < 1:
        raise ServingError(f"{where}: max_tokens must be a positive integer, got {n!r}")
    messages: list[Message] = []
    if isinstance(row.get("system"), str):
        messages.append(Message("system", row["system"]))
    if isinstance(row.get("prompt"), str):
        messages.append(Message("user", row["prompt"]))
    elif isinstance(row.get("messages"), list):
        for m in row["messages"]:
            if not (
                isinstance(m, dict)
                and m.get("role") in ("system", "user", "assistant")
                and isinstance(m.get("content"), str)
            ):
                raise ServingError(f"{where}: messages need role (system/user/assistant) and content")
            messages.append(Message(m["role"], m["content"]))
    else:
        raise ServingError(f"{where}: needs a string 'prompt' or a list 'messages'")
    return Request(tuple(messages), GenerationSettings(max_tokens=n, temperature=0.0))


def load_prompts(path: str | Path, max_tokens: int | None = None) -> list[Request]:
    """Benchmark requests from a file: a suite YAML (its items), JSONL rows, or text lines.

    JSONL rows carry `prompt` (or `messages`), optionally `system` and `max_tokens`; a text
    file is one prompt per non-empty line. Greedy decoding throughout, so runs are comparable.
    """
    path = Path(path)
    if not path.is_file():
        raise ServingError(f"{path}: prompts file not found")
    if path.suffix in (".yaml", ".yml"):
        return _suite_prompts(path, max_tokens)
    requests: list[Request] = []
    if path.suffix == ".jsonl":
        for where, row in jsonl_records(path):
            if isinstance(row, str):
                raise ServingError(f"{where}: {row}")
            requests.append(_request_from_row(row, where, max_tokens))
    else:
        for lineno, line in enumerate(path.read_text(encoding="utf-8-sig").splitlines(), 1):
            if line.strip():
                requests.append(_request_from_row({"prompt": line}, f"{path}:{lineno}", max_tokens))
    if not requests:
        raise ServingError(f"{path}: no prompts in the file")
    return requests


def _suite_prompts(path: Path, max_tokens: int | None) -> list[Request]:
    from routeopt.evals.suite.spec import SuiteError, load_suite

    try:
        suite = load_suite(path)
    except SuiteError as exc:
        raise ServingError(str(exc)) from None
    out = []
    for item in suite.items:
        req = suite.request(item)
        if max_tokens:
            req = replace(req, settings=replace(req.settings, max_tokens=max_tokens))
        out.append(req)
    return out


async def _timed_call(provider: Provider, request: Request, t0: float, timeout_s: float) -> RequestRecord:
    start = time.perf_counter() - t0
    try:
        c = await asyncio.wait_for(provider.generate(request), timeout_s)
    except asyncio.TimeoutError:
        return RequestRecord(start, time.perf_counter() - t0, False, error_kind="timeout")
    except ProviderError as exc:
        return RequestRecord(start, time.perf_counter() - t0, False, error_kind=exc.kind)
    except Exception:  # a provider bug costs this request, not the benchmark
        return RequestRecord(start, time.perf_counter() - t0, False, error_kind="internal")
    end = time.perf_counter() - t0
    return RequestRecord(
        start,
        end,
        True,
        ttft_s=c.ttft_s,
        latency_s=c.latency_s or (end - start),
        tpot_s=c.tpot_s,
        input_tokens=c.input_tokens,
        output_tokens=c.output_tokens,
        chunk_gaps_s=list(c.chunk_gaps_s),
        draft_tokens=c.draft_tokens,
        accepted_draft_tokens=c.accepted_draft_tokens,
        cached_input_tokens=c.cached_input_tokens,
    )


async def run_level(
    provider: Provider,
    requests: Sequence[Request],
    concurrency: int,
    n_requests: int,
    timeout_s: float = 600.0,
) -> tuple[list[RequestRecord], float, int]:
    """Send `n_requests` (cycling through `requests`) with exactly `concurrency` in flight.

    Returns the records, the wall time from the first send to the last answer, and the most
    requests that were ever in flight at once (a check on the load generator itself).
    """
    if not requests:
        raise ServingError("no requests to send")
    next_index = 0
    in_flight = peak = 0
    records: list[RequestRecord] = []
    t0 = time.perf_counter()

    async def worker() -> None:
        nonlocal next_index, in_flight, peak
        while next_index < n_requests:
            i = next_index
            next_index += 1
            in_flight += 1
            peak = max(peak, in_flight)
            try:
                records.append(await _timed_call(provider, requests[i % len(requests)], t0, timeout_s))
            finally:
                in_flight -= 1

    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return records, time.perf_counter() - t0, peak


def _meets(r: RequestRecord, targets: Targets) -> bool:
    checks = ((targets.latency_s, r.latency_s), (targets.ttft_s, r.ttft_s), (targets.tpot_s, r.tpot_s))
    return r.ok and all(t is None or (v is not None and v <= t) for t, v in checks)


def summarize(
    concurrency: int,
    records: list[RequestRecord],
    wall_s: float,
    peak: int,
    targets: Targets = Targets(),
    num_draft: int | None = None,
) -> LevelResult:
    """Turn one level's request records into its figures (pure; tested directly).
    `num_draft`: the draft tokens proposed per verification step, when speculating."""
    ok = [r for r in records if r.ok]
    out_tokens = [r.output_tokens or 0 for r in ok]
    in_tokens = [r.input_tokens or 0 for r in ok]
    wall = max(wall_s, 1e-12)
    busy = sum(r.end_s - r.start_s for r in records)
    return LevelResult(
        concurrency=concurrency,
        requests=len(records),
        errors=len(records) - len(ok),
        wall_s=wall_s,
        max_in_flight=peak,
        mean_in_flight=busy / wall,
        ttft_s=percentiles([r.ttft_s for r in ok if r.ttft_s is not None]),
        tpot_s=percentiles([r.tpot_s for r in ok if r.tpot_s is not None]),
        itl_s=percentiles([g for r in ok for g in r.chunk_gaps_s]),
        latency_s=percentiles([r.latency_s for r in ok if r.latency_s is not None]),
        request_tok_s=percentiles([(r.output_tokens or 0) / r.latency_s for r in ok if r.latency_s]),
        output_tok_s=sum(out_tokens) / wall,
        input_tok_s=sum(in_tokens) / wall,
        request_rps=len(ok) / wall,
        goodput_rps=sum(_meets(r, targets) for r in records) / wall if targets.any else None,
        mean_input_tokens=float(np.mean(in_tokens)) if ok else None,
        mean_output_tokens=float(np.mean(out_tokens)) if ok else None,
        **_acceptance(ok, num_draft),
        records=records,
    )


def _acceptance(ok: list[RequestRecord], num_draft: int | None) -> dict[str, float | None]:
    drafted = sum(r.draft_tokens or 0 for r in ok)
    if not num_draft or not drafted:
        return {}
    accepted = sum(r.accepted_draft_tokens or 0 for r in ok)
    return {
        "acceptance_rate": accepted / drafted,
        "mean_accepted_length": 1 + accepted / (drafted / num_draft),
    }


def without_draft(candidate: "Candidate") -> "Candidate":
    """The same candidate served without its draft model: the speed-up's baseline."""
    return candidate.model_copy(update={"name": f"{candidate.name}:no-draft", "speculative": None})


def speedups(report: "ServingReport", baseline: "ServingReport") -> dict[int, float]:
    """Output tokens/s with the draft over without it, per concurrency both measured."""
    base = {lv.concurrency: lv.output_tok_s for lv in baseline.levels}
    return {
        lv.concurrency: lv.output_tok_s / base[lv.concurrency]
        for lv in report.levels
        if base.get(lv.concurrency)
    }


async def bench_serving(
    candidate: "Candidate",
    requests: Sequence[Request],
    levels: Sequence[int],
    n_requests: int | Mapping[int, int] | None = None,
    targets: Targets = Targets(),
    *,
    provider: Provider | None = None,
    prompts_label: str = "",
    warmup: int = 1,
    on_level: Any = None,
    stop_after: float | None = None,
) -> ServingReport:
    """Benchmark one candidate at each concurrency level (N defaults to max(2c, 16) requests;
    a mapping gives N per level).

    A level never sends fewer requests than its concurrency, or it could not fill its slots.
    `warmup` requests run first and are not measured (the local provider loads its model then).
    No level starts after `stop_after` (a `time.perf_counter()` value); skipped ones are listed.
    """
    own = provider is None
    if provider is None:
        from routeopt.evals.providers import make_provider

        provider = make_provider(candidate)
    levels_out: list[LevelResult] = []
    skipped: list[int] = []
    k = candidate.speculative.num_speculative_tokens if candidate.speculative else None
    try:
        for i in range(warmup):
            await _timed_call(
                provider, requests[i % len(requests)], time.perf_counter(), candidate.timeout_s * 10
            )
        for c in levels:
            if stop_after is not None and time.perf_counter() > stop_after:
                skipped.append(c)
                continue
            n = max(c, _requests_for(n_requests, c))
            records, wall, peak = await run_level(provider, requests, c, n, candidate.timeout_s)
            levels_out.append(summarize(c, records, wall, peak, targets, k))
            if on_level is not None:
                on_level(levels_out[-1])
    finally:
        if own:
            await provider.aclose()
    return ServingReport(
        bench_id=f"bench-{datetime.now(timezone.utc):%Y%m%dT%H%M%S}-{uuid.uuid4().hex[:6]}",
        candidate=candidate.name,
        spec=candidate.public_dict(),
        prompts=prompts_label,
        targets=targets,
        levels=levels_out,
        skipped_levels=skipped,
    )


def _requests_for(n_requests: int | Mapping[int, int] | None, c: int) -> int:
    if isinstance(n_requests, Mapping):
        return n_requests.get(c, max(2 * c, 16))
    return n_requests if n_requests is not None else max(2 * c, 16)


SCHEMA = f"""
CREATE TABLE IF NOT EXISTS {SERVING_TABLE} (
    bench_id VARCHAR NOT NULL,
    candidate VARCHAR NOT NULL,
    concurrency INTEGER NOT NULL,
    provider VARCHAR, model VARCHAR, variant VARCHAR, device VARCHAR, base_url VARCHAR,
    gpu_hour_usd DOUBLE, prompts VARCHAR,
    requests INTEGER, errors INTEGER, wall_s DOUBLE, max_in_flight INTEGER, mean_in_flight DOUBLE,
    ttft_p50 DOUBLE, ttft_p90 DOUBLE, ttft_p99 DOUBLE,
    tpot_p50 DOUBLE, tpot_p90 DOUBLE, tpot_p99 DOUBLE,
    itl_p50 DOUBLE, itl_p90 DOUBLE, itl_p99 DOUBLE,
    latency_p50 DOUBLE, latency_p90 DOUBLE, latency_p99 DOUBLE,
    request_tok_s_p50 DOUBLE,
    output_tok_s DOUBLE, input_tok_s DOUBLE, request_rps DOUBLE, goodput_rps DOUBLE,
    mean_input_tokens DOUBLE, mean_output_tokens DOUBLE,
    acceptance_rate DOUBLE, mean_accepted_length DOUBLE, draft_model VARCHAR,
    latency_target_s DOUBLE, ttft_target_s DOUBLE, tpot_target_s DOUBLE,
    detail_json VARCHAR,
    created_at TIMESTAMPTZ NOT NULL,
    PRIMARY KEY (bench_id, candidate, concurrency)
);
"""


def _p(stats: dict[str, float] | None, key: str) -> float | None:
    return None if stats is None else stats[key]


def level_row(report: ServingReport, lv: LevelResult) -> dict[str, Any]:
    """One `serving_runs` row (also what the CLI prints and gpu_check writes)."""
    s, t = report.spec, report.targets
    row: dict[str, Any] = {
        "bench_id": report.bench_id,
        "candidate": report.candidate,
        "concurrency": lv.concurrency,
        "provider": s.get("provider"),
        "model": s.get("model"),
        "variant": s.get("variant"),
        "device": s.get("device"),
        "base_url": s.get("base_url"),
        "gpu_hour_usd": s.get("gpu_hour_usd"),
        "prompts": report.prompts,
        "requests": lv.requests,
        "errors": lv.errors,
        "wall_s": lv.wall_s,
        "max_in_flight": lv.max_in_flight,
        "mean_in_flight": lv.mean_in_flight,
    }
    for name in ("ttft", "tpot", "itl", "latency"):
        for q in PERCENTILES:
            row[f"{name}_p{q}"] = _p(getattr(lv, f"{name}_s"), f"p{q}")
    row.update(
        request_tok_s_p50=_p(lv.request_tok_s, "p50"),
        output_tok_s=lv.output_tok_s,
        input_tok_s=lv.input_tok_s,
        request_rps=lv.request_rps,
        goodput_rps=lv.goodput_rps,
        mean_input_tokens=lv.mean_input_tokens,
        mean_output_tokens=lv.mean_output_tokens,
        acceptance_rate=lv.acceptance_rate,
        mean_accepted_length=lv.mean_accepted_length,
        draft_model=(s.get("speculative") or {}).get("model"),
        latency_target_s=t.latency_s,
        ttft_target_s=t.ttft_s,
        tpot_target_s=t.tpot_s,
    )
    errors: dict[str, int] = {}
    for r in lv.records:
        if r.error_kind:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    row["detail_json"] = json.dumps(
        {
            "error_kinds": errors,
            "ttft_s": lv.ttft_s,
            "tpot_s": lv.tpot_s,
            "itl_s": lv.itl_s,
            "latency_s": lv.latency_s,
            "request_tok_s": lv.request_tok_s,
        },
        sort_keys=True,
    )
    row["created_at"] = report.created_at
    return row


_ADDED_COLUMNS = ("acceptance_rate DOUBLE", "mean_accepted_length DOUBLE", "draft_model VARCHAR")


def save_report(store: "Store", report: ServingReport) -> int:
    """Write a report's rows to `serving_runs` in one transaction (created if missing)."""
    rows = [level_row(report, lv) for lv in report.levels]
    if not rows:
        return 0
    cols = list(rows[0])
    sql = (
        f"INSERT INTO {SERVING_TABLE} ({', '.join(cols)}) VALUES "
        f"({', '.join('?' for _ in cols)}) ON CONFLICT DO NOTHING"
    )
    with store._lock:
        con = store._con
        con.execute(SCHEMA)
        for column in _ADDED_COLUMNS:  # tables written before these columns existed
            con.execute(f"ALTER TABLE {SERVING_TABLE} ADD COLUMN IF NOT EXISTS {column}")
        con.execute("BEGIN TRANSACTION")
        try:
            con.executemany(sql, [[r[c] for c in cols] for r in rows])
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return len(rows)


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


TABLE_COLUMNS: tuple[str, ...] = (
    "conc",
    "reqs",
    "err",
    "TTFT p50/p90/p99 ms",
    "TPOT p50/p90/p99 ms",
    "ITL p50/p90/p99 ms",
    "tok/s/req p50",
    "out tok/s",
    "req/s",
    "goodput req/s",
    "draft accept",
    "accepted len",
)


def table_cells(lv: LevelResult) -> list[str]:
    """One printed row of the results table (shared by the CLI and gpu_check's markdown)."""

    def trio(stats: dict[str, float] | None) -> str:
        return "-" if stats is None else "/".join(_ms(stats[f"p{q}"]) for q in PERCENTILES)

    return [
        str(lv.concurrency),
        str(lv.requests),
        str(lv.errors),
        trio(lv.ttft_s),
        trio(lv.tpot_s),
        trio(lv.itl_s),
        "-" if lv.request_tok_s is None else f"{lv.request_tok_s['p50']:.1f}",
        f"{lv.output_tok_s:.1f}",
        f"{lv.request_rps:.2f}",
        "-" if lv.goodput_rps is None else f"{lv.goodput_rps:.2f}",
        "-" if lv.acceptance_rate is None else f"{lv.acceptance_rate:.2f}",
        "-" if lv.mean_accepted_length is None else f"{lv.mean_accepted_length:.2f}",
    ]


def markdown_table(report: ServingReport) -> str:
    head = "| " + " | ".join(TABLE_COLUMNS) + " |"
    rule = "|" + "---|" * len(TABLE_COLUMNS)
    body = ["| " + " | ".join(table_cells(lv)) + " |" for lv in report.levels]
    return "\n".join([head, rule, *body])


def report_json(report: ServingReport) -> dict[str, Any]:
    """The report as plain JSON (no per-request records)."""
    return {
        "bench_id": report.bench_id,
        "candidate": report.candidate,
        "prompts": report.prompts,
        "targets": asdict(report.targets),
        "created_at": report.created_at.isoformat(),
        "levels": [{k: v for k, v in asdict(lv).items() if k != "records"} for lv in report.levels],
        "skipped_levels": report.skipped_levels,
    }
