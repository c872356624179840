"""Preflight: before the first suite, every candidate answers one tiny request.

A wrong key, a model-name typo, a dead port or a wrong path makes every call of a candidate fail
the same way. Measured as it is, that candidate fails every item, and the router learns to avoid a
model that was never asked; found after a whole run, it has cost the run. So each candidate is
probed first, with the smallest request its provider takes (one user message, `max_tokens` 1,
streamed if the candidate streams), and the probe's verdict is one of:

- `ok`: it answered. The probe's cost is what its tokens (or GPU time) cost, recorded with the run.
- `broken`: the answer says the configuration is wrong: no connection made (refused, DNS, TLS), HTTP
  401/403/404, a 4xx whose body names the model, the key or the route, an `api_key_env` that is
  not set, or a local checkpoint that does not load or generate. The run stops before its first
  suite, unless told to go on without it (`--skip-broken`, `preflight.skip_broken`).
- `unsure`: a fault that says nothing about the configuration (429, 5xx, a timeout, a connection
  the server dropped, a malformed answer). It is shown, and the run goes on: its breaker and
  retries deal with the endpoint.

Local (in-process) candidates load their checkpoint and generate one token; the load is outside
the probe's timeout, as it is outside the runner's.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import os
import re
import time
from dataclasses import asdict, dataclass
from typing import Any, Iterable, Literal

from routeopt.evals.config import Candidate
from routeopt.evals.execution.budget import gpu_provisional_cost
from routeopt.evals.execution.calls import failed_attempt_cost, token_cost
from routeopt.evals.execution.limits import endpoint_of
from routeopt.evals.providers import make_provider
from routeopt.evals.providers.base import (
    CALL_PROGRESS,
    CallProgress,
    Completion,
    GenerationSettings,
    Message,
    Provider,
    ProviderError,
    Request,
)

Verdict = Literal["ok", "broken", "unsure"]

PROBE_REQUEST = Request(
    (Message("user", "Reply with the word OK."),), GenerationSettings(max_tokens=1, temperature=0.0)
)
CONNECTION_RETRY_S = 0.5  # a refused connection is tried once more, in case the server restarted

# Error kinds that say the candidate's configuration is wrong, whatever the body says.
_BROKEN_KINDS = frozenset({"auth", "config", "internal"})
# A connection that could not be made (refused, DNS, TLS: the transport's ConnectError or
# ConnectTimeout) is a wrong URL; one the server dropped after accepting it says nothing.
_NOT_CONNECTED = re.compile(r"\bConnect(?:Error|Timeout)\b")
# A 4xx body that names the model, the key or the route. LiteLLM's proxy answers a key it cannot
# look up with 400 `No connected db.` (type no_db_connection), and an unknown model with 400
# `Invalid model name passed in model=...`.
_CONFIG_BODY = re.compile(
    r"model|api.?key|\bkey\b|auth|credential|permission|forbidden|unauthori[sz]ed|not found|"
    r"no such|does not exist|unknown|route|\bpath\b|endpoint|deployment|no_db_connection|"
    r"no connected db",
    re.IGNORECASE,
)
_SENT_TO = re.compile(r" \((?:GET|POST|PUT|PATCH|DELETE) \S+\)$")  # `sdk._sent_to`'s suffix


class PreflightFailed(RuntimeError):
    """A candidate failed its preflight and the run was not told to go on without it."""


@dataclass
class Probe:
    """One candidate's preflight: the verdict, what the endpoint said, and what it cost."""

    candidate: str
    endpoint: str
    verdict: Verdict
    error_kind: str | None = None
    error: str | None = None
    status: int | None = None
    latency_s: float | None = None
    cost_usd: float | None = None
    input_tokens: int | None = None
    output_tokens: int | None = None
    streamed: bool | None = None

    @property
    def broken(self) -> bool:
        return self.verdict == "broken"

    def line(self) -> str:
        """One line naming the candidate, its URL and what the provider said."""
        if self.verdict == "ok":
            took = f" in {self.latency_s:.2f}s" if self.latency_s is not None else ""
            return f"candidate {self.candidate} ({self.endpoint}): answered{took}"
        return f"candidate {self.candidate} ({self.endpoint}): {self.error}"

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Probe":
        return cls(**{k: data.get(k) for k in cls.__dataclass_fields__})


def unset_keys(candidates: Iterable[Candidate]) -> dict[str, str]:
    """Candidate name -> 'candidate X: $VAR is not set', for each `api_key_env` naming an unset
    (or empty) variable: known before anything starts, and never worth a call."""
    return {
        c.name: f"candidate {c.name}: ${c.api_key_env} is not set"
        for c in candidates
        if c.api_key_env and not os.environ.get(c.api_key_env)
    }


def verdict_of(err: ProviderError) -> Verdict:
    """Whether a probe's error says the configuration is wrong (module docstring)."""
    if err.kind in _BROKEN_KINDS:
        return "broken"
    if err.kind == "connection" and _NOT_CONNECTED.search(err.message):
        return "broken"
    if err.kind == "client_error" and _CONFIG_BODY.search(_SENT_TO.sub("", err.message)):
        return "broken"
    return "unsure"


def _cost(
    candidate: Candidate, completion: Completion | None, progress: CallProgress, elapsed_s: float
) -> float:
    if candidate.gpu_metered:  # priced by GPU time: the probe held the GPU this long
        return gpu_provisional_cost(candidate, elapsed_s) or 0.0
    if completion is not None:
        return token_cost(candidate, completion) or 0.0
    return failed_attempt_cost(candidate, PROBE_REQUEST, progress)


async def _attempt(
    candidate: Candidate, provider: Provider, timeout_s: float
) -> tuple[Completion | None, ProviderError | None, float, float]:
    """(completion, error, seconds, cost) of one probe call under the timeout."""
    progress = CallProgress()
    token = CALL_PROGRESS.set(progress)
    started = time.perf_counter()
    completion, error = None, None
    try:
        async with asyncio.timeout(timeout_s):
            completion = await provider.generate(PROBE_REQUEST)
    except TimeoutError:
        error = ProviderError("timeout", f"no answer to a 1-token request within {timeout_s:g}s")
    except ProviderError as err:
        error = err
    except Exception as exc:  # a provider bug is this candidate's problem, not the run's
        error = ProviderError("internal", f"{type(exc).__name__}: {exc}")
    finally:
        CALL_PROGRESS.reset(token)
    elapsed = time.perf_counter() - started
    return completion, error, elapsed, _cost(candidate, completion, progress, elapsed)


async def probe(candidate: Candidate, timeout_s: float = 20.0, provider: Provider | None = None) -> Probe:
    """Send the probe request to one candidate and judge the answer."""
    endpoint = endpoint_of(candidate)
    missing = unset_keys([candidate])
    if missing:
        return Probe(candidate.name, endpoint, "broken", "auth", missing[candidate.name])
    own = provider is None
    provider = provider or make_provider(candidate)
    try:
        prepare = getattr(provider, "prepare", None)
        if prepare is not None:  # SDK import, client set-up, a local model's load: not timed
            await prepare()
        limit = min(timeout_s, candidate.timeout_s)
        completion, err, elapsed, spent = await _attempt(candidate, provider, limit)
        if err is not None and err.kind == "connection":
            await asyncio.sleep(CONNECTION_RETRY_S)
            completion, err, elapsed, more = await _attempt(candidate, provider, limit)
            spent += more
    finally:
        if own:
            await provider.aclose()
    if err is not None:
        return Probe(
            candidate.name,
            endpoint,
            verdict_of(err),
            err.kind,
            err.message[:2000],
            err.status,
            elapsed,
            spent,
        )
    assert completion is not None
    return Probe(
        candidate.name,
        endpoint,
        "ok",
        latency_s=elapsed,
        cost_usd=spent,
        input_tokens=completion.input_tokens,
        output_tokens=completion.output_tokens,
        streamed=completion.streamed,
    )


async def probe_all(candidates: Iterable[Candidate], timeout_s: float = 20.0) -> list[Probe]:
    """Every candidate's probe, at once; in the candidates' order."""
    return list(await asyncio.gather(*(probe(c, timeout_s) for c in candidates)))


def run_preflight(candidates: Iterable[Candidate], timeout_s: float = 20.0) -> list[Probe]:
    """`probe_all` from synchronous code, in a thread of its own when an event loop runs here."""
    chosen = list(candidates)
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(probe_all(chosen, timeout_s))
    with concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="routeopt-preflight") as pool:
        return pool.submit(asyncio.run, probe_all(chosen, timeout_s)).result()


def broken(probes: Iterable[Probe]) -> list[Probe]:
    return [p for p in probes if p.broken]


def refusal(probes: Iterable[Probe]) -> str:
    """The sentence a run that stops on a failed preflight ends with."""
    names = [p.candidate for p in broken(probes)]
    return (
        f"preflight failed for {', '.join(names)}: nothing was evaluated. Fix the configuration "
        f"named above, or go on without {'it' if len(names) == 1 else 'them'} with --skip-broken "
        "(preflight.skip_broken in the config)"
    )
