"""`routeopt.yaml`: the fleet of candidates and where the pipeline keeps its state.

Validated with pydantic so every mistake is reported with the file, line and field that hold
it (read with `load_yaml`, which the suite files share). Paths are resolved relative to the config
file, so a config works from any working directory.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal, Sequence

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from routeopt.common.fields import did_you_mean

ProviderName = Literal["openai", "anthropic", "local"]
Variant = Literal["api", "fp32", "bf16", "fp16", "fp8", "int8", "fp8-dyn", "int8-dyn"]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the line and the field."""


# --- YAML with line numbers: routeopt.yaml and the suite files (`routeopt.evals.suite.files`) ---

Loc = tuple[str | int, ...]

LineMap = dict[Loc, int]


class YamlError(ValueError):
    """A file that is not valid YAML; `line` is 1-based where the parser knows it."""

    def __init__(self, path: Path, line: int | None, message: str, syntax: bool = True):
        where = f"{path}:{line}" if line else str(path)
        self.path, self.line, self.syntax = path, line, syntax
        self.detail = f"not valid YAML: {message}" if syntax else message
        super().__init__(f"{where}: {self.detail}")


def _walk(node: yaml.Node, loc: Loc, out: LineMap, dupes: list[tuple[Loc, int, int]]) -> None:
    out.setdefault(loc, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: dict[str, int] = {}
        for key, value in node.value:
            if isinstance(key, yaml.ScalarNode):
                line = key.start_mark.line + 1
                if key.value in seen:
                    dupes.append((loc + (key.value,), line, seen[key.value]))
                seen[key.value] = line
                out[loc + (key.value,)] = line
                _walk(value, loc + (key.value,), out, dupes)
    elif isinstance(node, yaml.SequenceNode):
        for i, value in enumerate(node.value):
            _walk(value, loc + (i,), out, dupes)


def load_yaml(path: Path) -> tuple[Any, LineMap]:
    """Parse a YAML file (routeopt.yaml, a suite); return the data and the line map. Raises
    YamlError with the line.

    A repeated key is an error: PyYAML silently keeps the last one, which hides real mistakes.
    """
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise YamlError(path, None, "file not found", syntax=False) from None
    except UnicodeDecodeError as exc:
        raise YamlError(path, None, f"not UTF-8 text ({exc.reason})", syntax=False) from None
    except OSError as exc:
        raise YamlError(path, None, f"cannot read: {exc.strerror or exc}", syntax=False) from None
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YamlError(path, mark.line + 1 if mark else None, problem) from None
    lines: LineMap = {}
    dupes: list[tuple[Loc, int, int]] = []
    if node is not None:
        _walk(node, (), lines, dupes)
    if dupes:
        loc, line, first = dupes[0]
        raise YamlError(
            path,
            line,
            f"duplicate key {'.'.join(map(str, loc))!r} (first at line {first}); "
            "YAML keeps only the last, so merge them",
        )
    return data, lines


def line_of(lines: LineMap, loc: Sequence[str | int]) -> int | None:
    """The line of the deepest known key on `loc` (a pydantic error location, say)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


# Anthropic's prompt-caching prices as multiples of the input price: a cache read costs 0.1x and
# a 5-minute cache write 1.25x (https://docs.anthropic.com/en/docs/build-with-claude/prompt-caching).
ANTHROPIC_CACHE_READ_X = 0.1
ANTHROPIC_CACHE_WRITE_X = 1.25


class SpeculativeSpec(BaseModel):
    """A draft model whose proposals a `local` candidate verifies (vLLM's `speculative_config`).

    `model` is a checkpoint (path or hub id) or the name of another `local` candidate in the
    config, whose checkpoint (and variant) is then used. The draft must share the target's
    tokenizer; it runs on the target's device, so its time is part of the candidate's GPU time.
    """

    model_config = ConfigDict(extra="forbid")

    model: str = Field(min_length=1)
    num_speculative_tokens: int = Field(ge=1, le=16)
    variant: Variant | None = None  # default: the named candidate's variant, else the target's


class PrefixCacheSpec(BaseModel):
    """Reuse of a shared prompt prefix. `local`: automatic prefix caching as vLLM does it (the
    prompt's key/value blocks of `block_size` tokens, hashed, in an LRU cache holding at most
    `capacity_tokens` tokens on the model's device). `anthropic`: the shared prefix is marked
    with `cache_control`. OpenAI caches by itself; `enabled` cannot turn that off."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    block_size: int = Field(default=16, ge=1, le=4096)
    capacity_tokens: int = Field(default=8192, ge=0)

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        return {"enabled": value} if isinstance(value, bool) else value


class BatchSpec(BaseModel):
    """Answer this candidate's items through its provider's Batch API (OpenAI `/v1/batches`,
    Anthropic Message Batches): half price, hours of queue time (`routeopt.evals.execution.batch`).

    Costs are the batch prices: `input_price_per_mtok`/`output_price_per_mtok` when given, else
    the list prices times `discount`; prompt-cache reads and writes are priced from the batch
    input price as the provider bills them. Rows answered in a batch have no latency (NULL):
    `latency_sample` items per suite are sent synchronously to measure it.
    """

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    discount: float = Field(default=0.5, gt=0, le=1)
    input_price_per_mtok: float | None = Field(default=None, ge=0)
    output_price_per_mtok: float | None = Field(default=None, ge=0)
    # the provider's limits per batch; None: OpenAI 50,000 requests / 200 MB, Anthropic
    # 100,000 requests / 256 MB
    max_requests: int | None = Field(default=None, ge=1)
    max_bytes: int | None = Field(default=None, ge=1024)
    # the model's enqueued-token limit (OpenAI's per-model batch queue limit): submissions wait
    # while batches in flight hold this many prompt tokens
    enqueued_token_limit: int | None = Field(default=None, ge=1)
    poll_interval_s: float = Field(default=30.0, gt=0)
    # uploads of a submission's file that fail with a retryable error (5xx, timeout) before its
    # items go synchronous instead; nothing exists at the provider until the file is uploaded
    upload_attempts: int = Field(default=5, ge=1)
    deadline_s: float = Field(default=86400.0, gt=0)  # then cancelled; finished lines kept
    # what happens to lines a batch did not answer (expired, cancelled, errored)
    resend: Literal["sync", "batch"] = "sync"
    max_rounds: int = Field(default=3, ge=1, le=20)  # batches per line with resend: batch
    latency_sample: int = Field(default=5, ge=0)  # items per suite sent synchronously
    # a judged suite's judge calls for the batch-answered rows go through the judge's Batch API
    # too, when the judge can batch (openai/anthropic, priced by tokens); false: synchronous
    judge: bool = True

    @model_validator(mode="before")
    @classmethod
    def _shorthand(cls, value: object) -> object:
        return {"enabled": value} if isinstance(value, bool) else value


BATCH_LIMITS: dict[str, tuple[int, int]] = {
    "openai": (50_000, 200 * 1024 * 1024),
    "anthropic": (100_000, 256 * 1024 * 1024),
}
"""Provider -> (requests, bytes) per batch, as the providers document them."""


class Candidate(BaseModel):
    """One model the pipeline may route to: an API model or a self-hosted checkpoint+variant."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$")
    provider: ProviderName
    model: str
    base_url: str | None = None
    api_key_env: str | None = None
    variant: Variant = "api"
    device: str = "auto"
    input_price_per_mtok: float | None = Field(default=None, ge=0)
    cached_input_price_per_mtok: float | None = Field(default=None, ge=0)  # cache reads
    cache_write_input_price_per_mtok: float | None = Field(default=None, ge=0)
    output_price_per_mtok: float | None = Field(default=None, ge=0)
    gpu_hour_usd: float | None = Field(default=None, ge=0)
    # Price the GPU at this stated throughput (input + output tokens per second, e.g. from
    # `routeopt bench serving`) instead of the one measured in the run: every run costs a call
    # the same, so nights (and the router trained on them) do not move with the machine's load.
    gpu_tokens_per_s: float | None = Field(default=None, gt=0)
    utilization: float = Field(default=1.0, gt=0, le=1)
    max_concurrency: int = Field(default=8, ge=1, le=4096)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)
    stream: bool = True  # stream answers (TTFT/TPOT measured); false for servers without SSE
    circuit_breaker_failures: int = Field(default=10, ge=1)  # consecutive endpoint faults
    circuit_breaker_cooldown_s: float = Field(default=30.0, gt=0)  # open -> half-open probe
    # how long an open breaker may hold the queue before its items are left for a resumed run
    circuit_breaker_max_wait_s: float = Field(default=600.0, ge=0)
    speculative: SpeculativeSpec | None = None
    prefix_cache: PrefixCacheSpec = PrefixCacheSpec()
    batch: BatchSpec | None = None

    @model_validator(mode="after")
    def _batchable(self) -> "Candidate":
        why = self.unbatchable()
        if self.batch is not None and self.batch.enabled and why is not None:
            raise ValueError(f"batch: {why}; remove `batch`")
        return self

    def unbatchable(self) -> str | None:
        """Why this candidate cannot be answered through a Batch API (None: it can)."""
        if self.provider == "local":
            return (
                "a `local` candidate runs in this process and has no batch API (only openai "
                "and anthropic candidates batch)"
            )
        if self.gpu_hour_usd is not None:
            return "a candidate priced by GPU time has no batch price (give token prices to batch it)"
        return None

    @property
    def batched(self) -> bool:
        """Whether this candidate's items go through its provider's Batch API."""
        return self.batch is not None and self.batch.enabled

    def batch_pricing(self) -> "Candidate":
        """This candidate at its batch prices (cache reads and writes follow the batch input
        price, as Anthropic and OpenAI bill them in batches): `token_cost` of it is a batched
        call's cost."""
        spec = self.batch or BatchSpec()
        price_in, price_out = self.token_prices()
        read, write = self.cache_prices()
        scale = (
            spec.input_price_per_mtok / price_in
            if spec.input_price_per_mtok is not None and price_in
            else spec.discount
        )
        return self.model_copy(
            update={
                "input_price_per_mtok": price_in * scale
                if spec.input_price_per_mtok is None
                else spec.input_price_per_mtok,
                "output_price_per_mtok": price_out * spec.discount
                if spec.output_price_per_mtok is None
                else spec.output_price_per_mtok,
                "cached_input_price_per_mtok": read * scale,
                "cache_write_input_price_per_mtok": write * scale,
            }
        )

    @model_validator(mode="after")
    def _priced(self) -> "Candidate":
        token_priced = self.input_price_per_mtok is not None or self.output_price_per_mtok is not None
        if token_priced and self.gpu_hour_usd is not None:
            raise ValueError("give either token prices or gpu_hour_usd, not both")
        if not token_priced and self.gpu_hour_usd is None:
            raise ValueError("needs a price: input_price_per_mtok/output_price_per_mtok, or gpu_hour_usd")
        if self.gpu_tokens_per_s is not None and self.gpu_hour_usd is None:
            raise ValueError("gpu_tokens_per_s prices a GPU: give gpu_hour_usd too")
        if self.provider == "local" and self.variant == "api":
            self.variant = "fp32"
        if self.speculative is not None and self.provider != "local":
            raise ValueError(
                "speculative: only `local` candidates run a draft model; for an "
                "OpenAI-compatible server configure it on the server (vLLM: "
                "--speculative-config)"
            )
        return self

    @property
    def gpu_metered(self) -> bool:
        """Priced by the GPU time this run measures: `gpu_hour_usd` without a stated throughput."""
        return self.gpu_hour_usd is not None and self.gpu_tokens_per_s is None

    def token_prices(self) -> tuple[float, float]:
        """$/Mtok of input and output tokens: the list prices, or for a GPU priced at a stated
        throughput its hourly price spread over that many tokens a second (at `utilization`)."""
        if self.gpu_hour_usd is not None and self.gpu_tokens_per_s is not None:
            per_mtok = self.gpu_hour_usd / 3600.0 / (self.gpu_tokens_per_s * self.utilization) * 1e6
            return per_mtok, per_mtok
        return self.input_price_per_mtok or 0.0, self.output_price_per_mtok or 0.0

    def cache_prices(self) -> tuple[float, float]:
        """$/Mtok of cache-read and cache-write input tokens: as configured, else Anthropic's
        multiples of the input price for `anthropic` candidates, else the input price. A GPU
        priced at a stated throughput reads its prefix cache for free: reused tokens are not
        computed again."""
        price_in = self.token_prices()[0]
        anthropic = self.provider == "anthropic"
        read, write = self.cached_input_price_per_mtok, self.cache_write_input_price_per_mtok
        if read is None and self.gpu_tokens_per_s is not None:
            read = 0.0
        if read is None:
            read = price_in * ANTHROPIC_CACHE_READ_X if anthropic else price_in
        if write is None:
            write = price_in * ANTHROPIC_CACHE_WRITE_X if anthropic else price_in
        return read, write

    def input_cost_usd(self, input_tokens: int, cache_read: int = 0, cache_write: int = 0) -> float:
        """List price of a call's input, of which `cache_read` tokens were read from the
        provider's prompt cache and `cache_write` written to it (all counted in input_tokens)."""
        read = min(cache_read, input_tokens)
        write = min(cache_write, input_tokens - read)
        price_read, price_write = self.cache_prices()
        plain = (input_tokens - read - write) * self.token_prices()[0]
        return (plain + read * price_read + write * price_write) / 1e6

    def api_key(self) -> str | None:
        """The secret, read from the environment at call time only; never stored."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def public_dict(self) -> dict:
        """What may be recorded in the database and artifacts: everything but secrets (a
        candidate without `batch` records none, as before it existed)."""
        out = self.model_dump(mode="json")
        if out.get("batch") is None:
            out.pop("batch", None)
        return out

    def measured_dict(self) -> dict:
        """The fields that decide what the candidate answers, how it is timed and what it
        costs: a resumed run refuses to change them (the others only pace the calls)."""
        out = {k: v for k, v in self.public_dict().items() if k not in _PACING_FIELDS}
        if out.get("batch"):  # how batches are paced and polled may change on a resume
            out["batch"] = {k: out["batch"][k] for k in _BATCH_MEASURED}
        return out


_PACING_FIELDS = frozenset(
    {
        "api_key_env",
        "max_concurrency",
        "requests_per_minute",
        "tokens_per_minute",
        "circuit_breaker_failures",
        "circuit_breaker_cooldown_s",
    }
)


_BATCH_MEASURED = ("enabled", "discount", "input_price_per_mtok", "output_price_per_mtok", "latency_sample")


class ReuseSettings(BaseModel):
    """The incremental night (`routeopt.evals.execution.reuse`): outcomes of unchanged (item,
    candidate) pairs measured within `max_age_days` are carried forward; each night measures new
    items, new or changed candidates, the pairs about to age out, and a drift sample per
    candidate sized so that a drop of `detectable_drop` in pass rate is found with `power`
    (one-sided exact McNemar test at `alpha`, Bonferroni over the candidates)."""

    model_config = ConfigDict(extra="forbid")

    max_age_days: float = Field(default=14.0, gt=0)
    drift_sample: int | None = Field(
        default=None,
        ge=1,
        description="items per candidate; None: sized from the detectable drop, power and flip rate",
    )
    detectable_drop: float = Field(default=0.05, gt=0, lt=1)
    power: float = Field(default=0.8, gt=0, lt=1)
    alpha: float = Field(default=0.01, gt=0, lt=0.5)
    # how often a stable model's outcome on an item differs from its last one (sampling noise)
    flip_rate: float = Field(default=0.02, ge=0, lt=0.5)


class DefaultBudget(BaseModel):
    """A default latency budget: seconds of TTFT or of end-to-end latency (p95), one of them."""

    model_config = ConfigDict(extra="forbid")

    ttft_s: float | None = Field(default=None, gt=0)
    latency_s: float | None = Field(default=None, gt=0)

    @model_validator(mode="after")
    def _one(self) -> "DefaultBudget":
        if (self.ttft_s is None) == (self.latency_s is None):
            raise ValueError("give ttft_s or latency_s (seconds, p95), one of them")
        return self

    def pair(self) -> tuple[str, float]:
        return ("ttft", self.ttft_s) if self.ttft_s is not None else ("latency", float(self.latency_s or 0))


class RouterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quality_target: float = Field(default=0.95, ge=0, le=1)
    holdout_fraction: float = Field(default=0.3, gt=0, lt=1)
    # After measuring on the held-out requests, publish the same procedure refit on all of them.
    refit: bool = True
    seed: int = 0
    # Train on the latest run of each (suite, candidate) that is at most this old, so
    # deployments over different candidate subsets train on (and gate on) the whole fleet.
    max_outcome_age_days: float = Field(default=7.0, gt=0)
    # where outcomes measured latency: the share of requests over budget every offered budget is
    # certified to keep, and the budget a request naming none gets, by suite ("*": any suite)
    latency_alpha: float = Field(default=0.1, gt=0, lt=1)
    budgets: dict[str, DefaultBudget] = Field(default_factory=dict)


class PublishSettings(BaseModel):
    """How the nightly flow publishes and promotes policies (`routeopt.artifacts.publish.registry`)."""

    model_config = ConfigDict(extra="forbid")

    signing_key: Path | None = Field(
        default=None,
        description="Ed25519 private key file; else $ROUTEOPT_SIGNING_KEY; else "
        ".routeopt/keys/signing_key.pem beside the config (created on first publish)",
    )
    promote_tolerance: float = Field(default=0.01, ge=0, le=1)
    expires_days: float = Field(default=30.0, gt=0)


class ReportSettings(BaseModel):
    """The HTML dashboards (`<db dir>/reports/RUN.html`, `routeopt report`)."""

    model_config = ConfigDict(extra="forbid")

    # file mode: readable by others (a report is meant to be shared); "0600" keeps it private
    permissions: int = 0o644

    @field_validator("permissions", mode="before")
    @classmethod
    def _octal(cls, value: object) -> object:
        if isinstance(value, str):
            try:
                value = int(value, 8)
            except ValueError:
                raise ValueError(f"{value!r} is not an octal file mode such as '0644'") from None
        if isinstance(value, int) and not 0 <= value <= 0o777:
            raise ValueError(f"{value} is not a file mode; write it in octal, quoted: '0644'")
        return value


class PreflightSettings(BaseModel):
    """One tiny request per candidate before the first suite (`routeopt.evals.execution.preflight`): a
    wrong key, model name, URL or port is named in seconds, and the run stops before spending
    anything, instead of measuring a broken candidate as a model that fails every item."""

    model_config = ConfigDict(extra="forbid")

    enabled: bool = True
    # go on without the candidates that fail it (they are left out of training and the policy)
    skip_broken: bool = False
    timeout_s: float = Field(default=20.0, gt=0)  # per probe, model loading excluded


class BudgetSettings(BaseModel):
    """Spend caps of one run in USD (enforced by `routeopt.evals.execution.budget.Budget`); None is no cap."""

    model_config = ConfigDict(extra="forbid")

    run_usd: float | None = Field(default=None, ge=0)
    per_candidate_usd: dict[str, float] = {}

    @field_validator("per_candidate_usd")
    @classmethod
    def _non_negative(cls, caps: dict[str, float]) -> dict[str, float]:
        for name, cap in caps.items():
            if cap < 0:
                raise ValueError(f"cap of {name!r} must be >= 0, got {cap}")
        return caps


class AlertSettings(BaseModel):
    """Drift alerts (`routeopt.evals.storage.drift`, sent by `routeopt.reports.alerts`): thresholds, and where to
    send them besides Prefect.

    A webhook URL that embeds a token (Slack, Teams) is a secret: name its environment variable
    in `webhook_url_env` instead of writing it in `webhook_url`.
    """

    model_config = ConfigDict(extra="forbid")

    webhook_url: str | None = Field(default=None, pattern=r"^https?://")
    webhook_url_env: str | None = None
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    alpha: float = Field(default=0.05, gt=0, lt=1)
    min_pass_rate_drop: float = Field(default=0.02, ge=0, le=1)
    cost_increase_pct: float = Field(default=10.0, ge=0)
    latency_p95_increase_pct: float = Field(default=25.0, ge=0)
    ttft_p95_increase_pct: float = Field(default=25.0, ge=0)
    baseline_runs: int = Field(default=3, ge=1, le=100)
    min_items: int = Field(default=10, ge=1)


class ApiPrice(BaseModel):
    """A provider API's list price for a model (USD per million tokens)."""

    model_config = ConfigDict(extra="forbid")

    input_price_per_mtok: float = Field(ge=0)
    output_price_per_mtok: float = Field(ge=0)
    cached_input_price_per_mtok: float | None = Field(default=None, ge=0)


class TrafficSettings(BaseModel):
    """Production traffic (docs/operations.md): the gateways' decision logs and what uses them."""

    model_config = ConfigDict(extra="forbid")

    log_dir: Path | None = Field(
        default=None, description="where gateways write decision logs; the nightly imports them"
    )
    window_days: float = Field(
        default=14.0, gt=0, description="the gate scores policies on decisions this recent"
    )
    min_feedback: int = Field(
        default=200, ge=1, description="requests with feedback before live traffic joins the promotion gate"
    )
    require_live: bool = Field(default=False, description="never promote without enough live evidence")
    feedback_source: str | None = None
    judge: str | None = Field(default=None, description="candidate that grades traffic suites")
    suites_dir: Path | None = None
    data_dir: Path | None = None
    api_prices: dict[str, ApiPrice] = Field(
        default_factory=dict, description="what each self-hosted candidate's model costs on a provider API"
    )
    shift_alpha: float = Field(
        default=0.01,
        gt=0,
        lt=1,
        description="the shift monitor's family-wise "
        "level: live requests unlike the certified ones (routeopt.router_training.live.shift_monitor)",
    )
    shift_min_effect: float = Field(
        default=0.05,
        ge=0,
        le=1,
        description="the least total variation (binned) of a feature that counts as a shift",
    )
    shift_min_requests: int = Field(
        default=200, ge=1, description="logged requests the shift monitor needs before it tests"
    )


class Config(BaseModel):
    """The resolved contents of `routeopt.yaml`."""

    model_config = ConfigDict(extra="forbid")

    candidates: list[Candidate] = Field(min_length=1)
    suites_dir: Path = Path("evals/suites")
    suites: list[str] | None = None
    db_path: Path = Path(".routeopt/routeopt.duckdb")
    registry_dir: Path = Path(".routeopt/registry")
    cache_dir: Path = Path(".routeopt/cache")
    router: RouterSettings = RouterSettings()
    publishing: PublishSettings = PublishSettings()
    budget: BudgetSettings = BudgetSettings()
    preflight: PreflightSettings = PreflightSettings()
    reports: ReportSettings = ReportSettings()
    alerts: AlertSettings = AlertSettings()
    traffic: TrafficSettings = TrafficSettings()
    reuse: ReuseSettings | None = None
    source_path: Path | None = Field(default=None, exclude=True)
    # candidates batched by the run's `--batch` option (`with_batch`), recorded with the run
    batch_option: list[str] = Field(default_factory=list, exclude=True)
    state_base: Path | None = Field(
        default=None, exclude=True, description="the folder relative state paths resolve against"
    )

    @field_validator("candidates")
    @classmethod
    def _unique_names(cls, candidates: list[Candidate]) -> list[Candidate]:
        seen: set[str] = set()
        for c in candidates:
            if c.name in seen:
                raise ValueError(f"candidate name {c.name!r} is used twice")
            seen.add(c.name)
        return candidates

    @model_validator(mode="after")
    def _draft_candidates(self) -> "Config":
        """A draft named by candidate becomes that candidate's checkpoint (and variant)."""
        by_name = {c.name: c for c in self.candidates}
        for i, c in enumerate(self.candidates):
            spec = c.speculative
            if spec is None or spec.model not in by_name:
                continue
            draft = by_name[spec.model]
            where = f"candidates.{i}.speculative.model"
            if draft.name == c.name:
                raise ValueError(
                    f"{where}: candidate {c.name!r} names itself as its draft; name a smaller model"
                )
            if draft.provider != "local":
                raise ValueError(
                    f"{where}: draft candidate {draft.name!r} is a "
                    f"{draft.provider!r} candidate; a draft must be `local`"
                )
            c.speculative = spec.model_copy(
                update={"model": draft.model, "variant": spec.variant or draft.variant}
            )
        return self

    @model_validator(mode="after")
    def _budget_names(self) -> "Config":
        names = {c.name for c in self.candidates}
        unknown = sorted(set(self.budget.per_candidate_usd) - names)
        if unknown:
            raise ValueError(
                f"budget.per_candidate_usd names unknown candidates {unknown}; the config has {sorted(names)}"
            )
        unknown = sorted(set(self.traffic.api_prices) - names)
        if unknown:
            raise ValueError(
                f"traffic.api_prices names unknown candidates {unknown}; the config has {sorted(names)}"
            )
        if self.traffic.judge is not None and self.traffic.judge not in names:
            raise ValueError(
                f"traffic.judge {self.traffic.judge!r} is not a candidate; the config has {sorted(names)}"
            )
        return self

    def signing_key_path(self) -> Path:
        """Where the policy signing key is (or will be created on the first publish), with its
        public half `public_key.pem` beside it: see `PublishSettings.signing_key`."""
        if self.publishing.signing_key:
            return self.publishing.signing_key
        if os.environ.get("ROUTEOPT_SIGNING_KEY"):
            return Path(os.environ["ROUTEOPT_SIGNING_KEY"])
        base = self.state_base or (self.source_path.parent if self.source_path else Path.cwd())
        return base / ".routeopt" / "keys" / "signing_key.pem"

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(f"no candidate {name!r}; the config has {[c.name for c in self.candidates]}")

    def fingerprint(self) -> str:
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]


BATCH_ALL = "all"
"""`--batch all`: every candidate of the run that has a Batch API."""


def batch_option(cfg: Config, given: Sequence[str], among: Sequence[str] | None = None) -> list[str]:
    """The candidates `--batch` turns batch mode on for, checked against the config: names of
    candidates of the run (`among`, default all), or `all` for every one that can batch.
    Raises ConfigError naming `--batch` and what is wrong."""
    names = [c.name for c in cfg.candidates]
    run = list(among) if among is not None else names
    if BATCH_ALL in given:
        picked = [n for n in run if cfg.candidate(n).unbatchable() is None]
        if not picked:
            raise ConfigError(
                f"--batch all: none of this run's candidates {run} has a batch API (only openai "
                "and anthropic candidates priced by tokens batch)"
            )
        return picked
    picked = []
    for name in given:
        if name not in names:
            raise ConfigError(f"--batch: no candidate {name!r}; the config has {names}")
        if name not in run:
            raise ConfigError(f"--batch: candidate {name!r} is not in this run (--candidate {run})")
        why = cfg.candidate(name).unbatchable()
        if why is not None:
            raise ConfigError(f"--batch: candidate {name!r}: {why}; leave it out of --batch")
        if name not in picked:
            picked.append(name)
    return picked


def with_batch(cfg: Config, names: Sequence[str]) -> Config:
    """The config with batch mode on for `names` (checked by `batch_option`): a candidate's own
    `batch:` settings with `enabled`, else the default `BatchSpec`."""
    if not names:
        return cfg
    candidates = [
        c.model_copy(update={"batch": (c.batch or BatchSpec()).model_copy(update={"enabled": True})})
        if c.name in names
        else c
        for c in cfg.candidates
    ]
    return cfg.model_copy(update={"candidates": candidates, "batch_option": sorted(names)})


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p).resolve()


def _local_path(base: Path, model: str) -> str:
    """A local checkpoint path relative to the config file, resolved; anything else as is."""
    if not Path(model).is_absolute() and (base / model).exists():
        return str(base / model)
    return model


def _resolve_checkpoints(base: Path, c: Candidate) -> Candidate:
    if c.provider != "local":
        return c
    update: dict = {"model": _local_path(base, c.model)}
    if c.speculative is not None:
        update["speculative"] = c.speculative.model_copy(
            update={"model": _local_path(base, c.speculative.model)}
        )
    return c.model_copy(update=update)


def _format_errors(path: Path, err: ValidationError, lines: LineMap) -> str:
    """One `file:line: field: message` line per problem, as `routeopt suites validate` prints."""
    problems = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        line = line_of(lines, e["loc"])
        msg = e["msg"] + (did_you_mean(Config, e["loc"]) if e["type"] == "extra_forbidden" else "")
        problems.append(f"{path}:{line}: {loc}: {msg}" if line else f"{path}: {loc}: {msg}")
    if len(problems) == 1:
        return problems[0]
    return "\n  ".join([f"{path}: {len(problems)} problems in the config"] + problems)


def load_config(path: str | os.PathLike) -> Config:
    """Read and validate a config file; raise ConfigError naming the file and each bad field."""
    path = Path(path).resolve()
    try:
        raw, lines = load_yaml(path)
    except YamlError as exc:
        raise ConfigError(str(exc)) from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}:1: expected a mapping at the top level")
    try:
        cfg = Config.model_validate(raw)
    except ValidationError as err:
        raise ConfigError(_format_errors(path, err, lines)) from None
    base = path.parent
    # The demo shipped in the package reads its fleet and suites beside itself but keeps its
    # state (database, registry, cache, keys) under the current folder, never in site-packages.
    state = Path.cwd().resolve() if path == DEMO_CONFIG.resolve() else base
    candidates = [_resolve_checkpoints(base, c) for c in cfg.candidates]
    return cfg.model_copy(
        update={
            "candidates": candidates,
            "suites_dir": _resolve(base, cfg.suites_dir),
            "db_path": _resolve(state, cfg.db_path),
            "registry_dir": _resolve(state, cfg.registry_dir),
            "cache_dir": _resolve(state, cfg.cache_dir),
            "publishing": cfg.publishing.model_copy(
                update={
                    "signing_key": _resolve(state, cfg.publishing.signing_key)
                    if cfg.publishing.signing_key
                    else None
                }
            ),
            "traffic": cfg.traffic.model_copy(
                update={
                    k: _resolve(base, v)
                    for k, v in (
                        ("log_dir", cfg.traffic.log_dir),
                        ("suites_dir", cfg.traffic.suites_dir),
                        ("data_dir", cfg.traffic.data_dir),
                    )
                    if v is not None
                }
            ),
            "source_path": path,
            "state_base": state,
        }
    )


DEMO_CONFIG = Path(__file__).resolve().parent / "demo" / "routeopt.yaml"
"""The demo fleet's config, shipped in the package with its suites and model checkpoints."""


def default_config_path() -> Path:
    """`$ROUTEOPT_CONFIG`, else `./routeopt.yaml`, else the demo config shipped in the package."""
    env = os.environ.get("ROUTEOPT_CONFIG")
    if env:
        return Path(env)
    local = Path("routeopt.yaml")
    if local.exists():
        return local
    return DEMO_CONFIG
