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

ProviderName = Literal["openai", "anthropic", "local"]
Variant = Literal["api", "fp32", "bf16", "fp16", "fp8", "int8", "fp8-dyn", "int8-dyn"]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the line and the field."""


# --- YAML with line numbers: routeopt.yaml and the suite files (`evals.suite.files`) ---

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
        raise YamlError(path, line, f"duplicate key {'.'.join(map(str, loc))!r} (first at line {first}); "
                        "YAML keeps only the last, so merge them")
    return data, lines


def line_of(lines: LineMap, loc: Sequence[str | int]) -> int | None:
    """The line of the deepest known key on `loc` (a pydantic error location, say)."""
    loc = tuple(loc)
    while loc:
        if loc in lines:
            return lines[loc]
        loc = loc[:-1]
    return lines.get(())


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
    cached_input_price_per_mtok: float | None = Field(default=None, ge=0)
    output_price_per_mtok: float | None = Field(default=None, ge=0)
    gpu_hour_usd: float | None = Field(default=None, ge=0)
    utilization: float = Field(default=1.0, gt=0, le=1)
    max_concurrency: int = Field(default=8, ge=1, le=4096)
    requests_per_minute: float | None = Field(default=None, gt=0)
    tokens_per_minute: float | None = Field(default=None, gt=0)
    timeout_s: float = Field(default=60.0, gt=0)
    max_retries: int = Field(default=4, ge=0, le=20)
    stream: bool = True  # stream answers (TTFT/TPOT measured); false for servers without SSE
    circuit_breaker_failures: int = Field(default=10, ge=1)  # consecutive endpoint faults
    circuit_breaker_cooldown_s: float = Field(default=30.0, gt=0)  # open -> half-open probe

    @model_validator(mode="after")
    def _priced(self) -> "Candidate":
        token_priced = self.input_price_per_mtok is not None or self.output_price_per_mtok is not None
        if token_priced and self.gpu_hour_usd is not None:
            raise ValueError("give either token prices or gpu_hour_usd, not both")
        if not token_priced and self.gpu_hour_usd is None:
            raise ValueError(
                "needs a price: input_price_per_mtok/output_price_per_mtok, or gpu_hour_usd"
            )
        if self.provider == "local" and self.variant == "api":
            self.variant = "fp32"
        return self

    def api_key(self) -> str | None:
        """The secret, read from the environment at call time only; never stored."""
        return os.environ.get(self.api_key_env) if self.api_key_env else None

    def public_dict(self) -> dict:
        """What may be recorded in the database and artifacts: everything but secrets."""
        return self.model_dump(mode="json")


class RouterSettings(BaseModel):
    model_config = ConfigDict(extra="forbid")

    quality_target: float = Field(default=0.95, ge=0, le=1)
    holdout_fraction: float = Field(default=0.3, gt=0, lt=1)
    seed: int = 0


class PublishSettings(BaseModel):
    """How the nightly flow publishes and promotes policies (`artifacts.registry`)."""

    model_config = ConfigDict(extra="forbid")

    signing_key: Path | None = Field(
        default=None, description="Ed25519 private key file; else $ROUTEOPT_SIGNING_KEY; else unsigned"
    )
    promote_tolerance: float = Field(default=0.01, ge=0, le=1)
    expires_days: float = Field(default=30.0, gt=0)


class BudgetSettings(BaseModel):
    """Spend caps of one run in USD (enforced by `evals.execution.budget.Budget`); None is no cap."""

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
    """Drift alerts (`flows/drift.py`): thresholds, and where to send them besides Prefect.

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
    alerts: AlertSettings = AlertSettings()
    source_path: Path | None = Field(default=None, exclude=True)

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
    def _budget_names(self) -> "Config":
        names = {c.name for c in self.candidates}
        unknown = sorted(set(self.budget.per_candidate_usd) - names)
        if unknown:
            raise ValueError(
                f"budget.per_candidate_usd names unknown candidates {unknown}; "
                f"the config has {sorted(names)}"
            )
        return self

    def candidate(self, name: str) -> Candidate:
        for c in self.candidates:
            if c.name == name:
                return c
        raise KeyError(f"no candidate {name!r}; the config has {[c.name for c in self.candidates]}")

    def fingerprint(self) -> str:
        payload = json.dumps(self.model_dump(mode="json"), sort_keys=True).encode()
        return hashlib.sha256(payload).hexdigest()[:16]


def _resolve(base: Path, p: Path) -> Path:
    return p if p.is_absolute() else (base / p).resolve()


def _format_errors(path: Path, err: ValidationError, lines: LineMap) -> str:
    """One `file:line: field: message` line per problem, as `routeopt suites validate` prints."""
    problems = []
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        line = line_of(lines, e["loc"])
        problems.append(f"{path}:{line}: {loc}: {e['msg']}" if line else f"{path}: {loc}: {e['msg']}")
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
    candidates = [
        c.model_copy(update={"model": str(base / c.model)})
        if c.provider == "local" and not Path(c.model).is_absolute() and (base / c.model).exists()
        else c
        for c in cfg.candidates
    ]
    return cfg.model_copy(
        update={
            "candidates": candidates,
            "suites_dir": _resolve(base, cfg.suites_dir),
            "db_path": _resolve(base, cfg.db_path),
            "registry_dir": _resolve(base, cfg.registry_dir),
            "cache_dir": _resolve(base, cfg.cache_dir),
            "publishing": cfg.publishing.model_copy(
                update={
                    "signing_key": _resolve(base, cfg.publishing.signing_key)
                    if cfg.publishing.signing_key
                    else None
                }
            ),
            "source_path": path,
        }
    )


def default_config_path() -> Path:
    """`$ROUTEOPT_CONFIG`, else `./routeopt.yaml`, else the demo config shipped in the package."""
    env = os.environ.get("ROUTEOPT_CONFIG")
    if env:
        return Path(env)
    local = Path("routeopt.yaml")
    if local.exists():
        return local
    return Path(__file__).resolve().parent.parent / "routeopt.yaml"
