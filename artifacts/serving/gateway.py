"""Decision logs, exploration, shadow and canary: what a gateway records so the nightly learns from it.

A `Gateway` wraps the champion `Router` (and, for shadow or canary, the `candidate` channel's) and,
per request:

1. picks the policy that serves it: the candidate for a sticky `canary_share` of request ids, the
   champion for the rest;
2. takes that policy's decision and explores: with probability `Exploration.rate` the request goes
   to a candidate drawn uniformly from the eligible ones (never an excluded one, never one above
   the cost cap, never one predicted to miss the request's latency budget), so any other policy
   can later be evaluated on the logs without bias;
3. returns the decision with `propensity`, the exact probability that this request was served the
   chosen model, and `policy_probability`, the policy's own probability for its choice (below 1
   at a knob point that mixes two rules), and hands the rest to the `DecisionLog`.

The routing thread pays for two keyed hashes and a deque append. The log's writer thread does the
rest: it hashes the prompt, runs the redaction hook (text is logged only through it), computes the
shadow decision, serialises and writes rotated JSONL files. A full queue drops the record and
counts it; nothing in logging ever blocks or fails a routing call. Standard library and the
policy's own modules only.

The draws and the propensity (`unit_draw`, `Exploration`, `choose`) are part of the policy
format, so other runtimes draw the same: they live in `routeopt.router_training.policy.draws` and are re-exported
here. The propensity composes the policy's own randomisation with exploration:
``P(model) = (1 - rate) * P_policy(model) + rate * [model eligible] / n_eligible``.
"""

from __future__ import annotations

import atexit
import collections
import hashlib
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Callable

from routeopt.artifacts.serving.loader import ServedDecision, Router, RouterStatus
from routeopt.common import tracing
from routeopt.router_training.policy.draws import (  # noqa: F401  (re-exported: the draws are the format's)
    Choice,
    Exploration,
    choose,
    derive_key,
    policy_distribution,
    unit_draw,
)
from routeopt.router_training.policy.features import n_chars, text_bytes

log = logging.getLogger("routeopt.decisions")
FORMAT_VERSION = 1
Redactor = Callable[[str], "str | None"]


def verbatim(text: str) -> str:
    """The redaction hook that keeps prompt text as it is (for traffic without personal data)."""
    return text


_key = derive_key  # the exploration and canary keys: SHA-256 of "routeopt-<label>:<seed>"


# -- the log writer ---------------------------------------------------------------------------


@dataclass(frozen=True)
class LogStatus:
    folder: str
    written: int
    dropped: int
    queued: int
    write_errors: int
    record_errors: int
    redaction_errors: int
    files: int
    current_file: str | None
    last_error: str | None


class DecisionLog:
    """A bounded queue drained by one writer thread into rotated JSONL files.

    `redact` opts in to logging prompt text: its return value is logged (None keeps no text for
    that request; a hook that raises keeps none and is counted). Without it only a hash of the
    prompt (keyed with `hash_key`, so short prompts cannot be guessed) and its length are kept.
    Files rotate at `max_file_bytes` or `rotate_s`; `keep_files` deletes this writer's oldest.
    """

    def __init__(
        self,
        folder: str | os.PathLike,
        *,
        redact: Redactor | None = None,
        hash_key: bytes | None = None,
        max_queue: int = 10_000,
        max_file_bytes: int = 64 << 20,
        rotate_s: float = 3600.0,
        flush_s: float = 0.5,
        keep_files: int | None = None,
        name: str = "decisions",
    ) -> None:
        if max_queue < 1 or max_file_bytes < 1 or rotate_s <= 0 or flush_s <= 0:
            raise ValueError("max_queue, max_file_bytes, rotate_s and flush_s must be positive")
        self.folder = Path(folder)
        self.folder.mkdir(parents=True, exist_ok=True)
        self._redact, self._hash_key = redact, hash_key or b""
        self._max_queue, self._max_bytes, self._rotate_s = max_queue, max_file_bytes, rotate_s
        self._flush_s, self._keep, self._name = flush_s, keep_files, name
        self._queue: collections.deque = collections.deque()
        self._count_lock = threading.Lock()
        self._dropped = self._written = self._write_errors = self._record_errors = 0
        self._redaction_errors = 0
        self._last_error: str | None = None
        self._file: Any = None
        self._file_path: Path | None = None
        self._file_opened = 0.0
        self._files: list[Path] = []
        self._busy = False
        self._eager = False  # write_through(): wake the writer for every record
        self._wake, self._stopped = threading.Event(), False
        self._thread = threading.Thread(target=self._run, name="routeopt-decision-log", daemon=True)
        self._thread.start()
        atexit.register(self.close)

    def submit(self, build: Callable[..., dict | None], *args: Any) -> bool:
        """Queue `build(*args)` (run in the writer thread); False, counted, when the queue is full."""
        if self._stopped or len(self._queue) >= self._max_queue:
            with self._count_lock:
                self._dropped += 1
            return False
        self._queue.append((build, args))
        if self._eager:
            self._wake.set()
        return True

    def write_through(self) -> None:
        """From now on write each record as soon as it is queued, and write what is queued now.

        For a process that is shutting down: a host that ends by re-raising its termination
        signal (uvicorn does, after its graceful shutdown) dies without running atexit, so
        whatever waited for the next `flush_s` tick would be lost."""
        self._eager = True
        self._wake.set()

    def prompt_fields(self, prompt: str) -> dict[str, Any]:
        """The prompt's hash and length, and its redacted text when the operator opted in."""
        data = text_bytes(prompt)  # the spec's bytes: a JavaScript gateway hashes the same
        out: dict[str, Any] = {
            "prompt_hash": hashlib.blake2b(data, digest_size=16, key=self._hash_key).hexdigest(),
            "prompt_chars": n_chars(prompt),
        }
        if self._redact is not None:
            try:
                text = self._redact(prompt)
            except Exception:  # a failing hook must never let the raw text through
                self._redaction_errors += 1
                text = None
            if isinstance(text, str):
                out["text"] = text
        return out

    def flush(self, timeout: float = 10.0) -> bool:
        """Wait until everything queued so far is written (tests, shutdown); False on timeout."""
        deadline = time.monotonic() + timeout
        self._wake.set()
        while (self._queue or self._busy) and time.monotonic() < deadline:
            time.sleep(0.002)
            self._wake.set()
        return not self._queue and not self._busy

    def close(self) -> None:
        """Write what is queued, stop the writer and close the file. Later submits are dropped."""
        if self._stopped:
            return
        self._stopped = True
        self._wake.set()
        self._thread.join(timeout=30)
        atexit.unregister(self.close)

    def status(self) -> LogStatus:
        return LogStatus(
            str(self.folder),
            self._written,
            self._dropped,
            len(self._queue),
            self._write_errors,
            self._record_errors,
            self._redaction_errors,
            len(self._files),
            str(self._file_path) if self._file_path else None,
            self._last_error,
        )

    # -- writer thread ----------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            self._wake.wait(self._flush_s)
            self._wake.clear()
            stopping = self._stopped
            self._drain()
            if stopping:
                break
        self._close_file()

    def _drain(self) -> None:
        self._busy = True
        try:
            lines: list[str] = []
            while self._queue:
                build, args = self._queue.popleft()
                try:
                    record = build(*args)
                    if record is not None:
                        lines.append(
                            json.dumps(record, separators=(",", ":"), ensure_ascii=False, default=str)
                        )
                except Exception as exc:  # one bad record must not stop the others
                    self._record_errors += 1
                    self._last_error = f"record: {exc!r}"
                if len(lines) >= 2000:
                    self._write(lines)
                    lines = []
            if lines:
                self._write(lines)
        finally:
            self._busy = False

    def _write(self, lines: list[str]) -> None:
        try:
            self._rotate_if_due()
            self._file.write("\n".join(lines) + "\n")
            self._file.flush()
            self._written += len(lines)
        except (OSError, ValueError) as exc:
            with self._count_lock:
                self._dropped += len(lines)
            self._write_errors += 1
            self._last_error = f"write: {exc}"
            if self._write_errors == 1 or self._write_errors % 100 == 0:
                log.warning("decision log %s: %d records dropped: %s", self.folder, len(lines), exc)
            self._close_file()

    def _rotate_if_due(self) -> None:
        f = self._file
        if (
            f is not None
            and f.tell() < self._max_bytes
            and time.monotonic() - self._file_opened < self._rotate_s
        ):
            return
        self._close_file()
        stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
        path = self.folder / f"{self._name}-{stamp}-{os.getpid()}-{os.urandom(3).hex()}.jsonl"
        # a lone surrogate in a kept prompt is written as a JSON \u escape, not a failed batch
        self._file = open(path, "a", encoding="utf-8", errors="backslashreplace")
        self._file_path, self._file_opened = path, time.monotonic()
        self._files.append(path)
        if self._keep is not None:
            while len(self._files) > self._keep:
                old = self._files.pop(0)
                try:
                    old.unlink()
                except OSError:
                    pass

    def _close_file(self) -> None:
        if self._file is not None:
            try:
                self._file.close()
            except OSError:
                pass
            self._file, self._file_path = None, None


def write_through_on_signals(
    current_log: Callable[[], DecisionLog | None], signals: tuple[int, ...] | None = None
) -> bool:
    """Chain a handler to SIGTERM and SIGINT that makes `current_log()` write through.

    For a log inside a host process whose shutdown it does not control (the LiteLLM proxy).
    At the signal, what the log holds is written (for up to 2 s), then the host's own handler
    runs, so its graceful shutdown proceeds, and every record made meanwhile is written at once;
    where the signal would end the process on the spot (SIG_DFL), it then does. Only the main
    thread may set signal handlers: elsewhere nothing is installed and False is returned (atexit
    and the `flush_s` ticks remain).
    """
    if threading.current_thread() is not threading.main_thread():
        return False
    for sig in signals or (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def on_signal(signum: int, frame: Any, previous: Any = previous) -> None:
            decision_log = current_log()
            if decision_log is not None:  # what is queued is on disk before the host goes on
                decision_log.write_through()
                decision_log.flush(timeout=2.0)
            if callable(previous):
                previous(signum, frame)
            elif previous != signal.SIG_IGN:  # SIG_DFL (or unknown): the process ends now
                signal.signal(signum, signal.SIG_DFL)
                signal.raise_signal(signum)

        signal.signal(sig, on_signal)
    return True


# -- the gateway --------------------------------------------------------------------------


def iso_time(t: float) -> str:
    """UTC ISO-8601 with microseconds and a Z, from a time.time() value."""
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int(t % 1 * 1e6):06d}Z"


@dataclass(frozen=True)
class GatewayStatus:
    champion: RouterStatus
    candidate: RouterStatus | None
    log: LogStatus | None
    mode: dict[str, Any] = field(default_factory=dict)
    errors: int = 0
    last_error: str | None = None


class Gateway:
    """Routes with the champion (or, for a canary share, the candidate), explores and logs.

    `shadow=True` also computes the other channel's decision for every request and logs it beside
    the served one without acting on it. `canary_share` routes that share of request ids by the
    candidate, the same ids every time (the draw is a hash of the id keyed by `canary_seed`, the
    same in every gateway process).
    """

    def __init__(
        self,
        champion: Router,
        *,
        log: DecisionLog | None = None,
        exploration: Exploration | None = None,
        candidate: Router | None = None,
        shadow: bool = False,
        canary_share: float = 0.0,
        canary_seed: int | str = "routeopt",
    ) -> None:
        if not 0 <= canary_share <= 1:
            raise ValueError(f"canary_share must be in [0, 1], got {canary_share!r}")
        self.champion, self.candidate, self.log = champion, candidate, log
        self.exploration = exploration if exploration is not None and exploration.rate > 0 else None
        self.shadow, self.canary_share = bool(shadow), float(canary_share)
        self._explore_key = _key("explore", exploration.seed if exploration else None)
        self._canary_key = _key("canary", canary_seed)
        self._id_prefix = os.urandom(6).hex() + "-"
        self._ids = iter(range(1, 1 << 62))
        self._canary = self.canary_share > 0 and candidate is not None
        self._eligible: tuple[Any, tuple[str, ...]] | None = None
        self._error_lock = threading.Lock()
        self._errors, self._last_error = 0, None

    @property
    def policy(self) -> Any:
        return self.champion.policy

    @property
    def version(self) -> int:
        return self.champion.version

    def route(
        self,
        prompt: str,
        suite: str | None = None,
        quality_target: float | None = None,
        *,
        request_id: str | None = None,
        traceparent: str | None = None,
        ttft_budget_s: float | None = None,
        latency_budget_s: float | None = None,
    ) -> ServedDecision:
        """Route one request; pass the request id your outcomes will carry (else one is made).
        A latency budget (`ttft_budget_s` or `latency_budget_s`, seconds on the p95) is the
        router's (`routeopt.artifacts.serving.loader.Router.route`); the log records its outcome.

        `traceparent`: the caller's W3C header. With tracing on, the decision is a span, a child
        of it (else of the caller's current span), and `decision.traceparent` is the header to
        return, so that the application's call of the model becomes a child of the decision;
        the log records the trace id. With tracing off the caller's header is handed back."""
        budget = {  # only what was asked: a router without budgets keeps its signature
            k: v
            for k, v in (("ttft_budget_s", ttft_budget_s), ("latency_budget_s", latency_budget_s))
            if v is not None
        }
        if traceparent is None and tracing.tracer() is None:
            return self._route(prompt, suite, quality_target, rid=request_id, budget=budget)
        start = time.time_ns()
        token = tracing.IN_DECISION.set(True)
        try:
            d = self._route(
                prompt, suite, quality_target, rid=request_id, traced=(traceparent, start), budget=budget
            )
        finally:
            tracing.IN_DECISION.reset(token)
        return d

    def _route(
        self,
        prompt: str,
        suite: str | None,
        quality_target: float | None,
        *,
        rid: str | None,
        traced: tuple[str | None, int] | None = None,
        budget: dict[str, float | None] | None = None,
    ) -> ServedDecision:
        rid = rid if rid is not None else f"{self._id_prefix}{next(self._ids):x}"
        router, channel = self._arm(rid) if self._canary else (self.champion, "champion")
        d = router.route(prompt, suite, quality_target, **(budget or {}))
        try:
            choice = self._choose(d, rid)
            fallbacks = (
                d.fallbacks
                if choice.model == d.model
                else (d.model, *(f for f in d.fallbacks if f != choice.model))
            )
            header = trace_id = span_id = None
            if traced is not None:
                knob = (
                    quality_target
                    if quality_target is not None
                    else getattr(getattr(router, "policy", None), "quality_target", None)
                )
                # the attributes are made by tracing's writer thread, from these immutable values
                header, trace_id, span_id = tracing.record_decision(
                    traced[0],
                    traced[1],
                    partial(
                        tracing.attributes_for,
                        choice.model,
                        fallbacks,
                        choice.propensity,
                        d.policy_version,
                        rid,
                        default_reason=d.default_reason,
                        channel=channel,
                        explored=choice.explored,
                        knob_target=knob,
                        suite=suite,
                    ),
                )
            # ServedDecision(...) rather than dataclasses.replace: half the cost on every request
            out = ServedDecision(
                model=choice.model,
                fallbacks=fallbacks,
                pass_probabilities=d.pass_probabilities,
                expected_cost_usd=d.expected_cost_usd,
                policy_version=d.policy_version,
                default_reason=d.default_reason,
                propensity=choice.propensity,
                request_id=rid,
                trace_id=trace_id,
                traceparent=header,
                policy_probability=choice.policy_probability,
                unknown_suite=d.unknown_suite,
                budget=d.budget,
                live=d.live,
            )
            if self.log is not None:
                other = self._other(channel) if self.shadow else None
                self.log.submit(
                    self._record,
                    time.time(),
                    rid,
                    prompt,
                    suite,
                    quality_target,
                    channel,
                    d,
                    choice,
                    other,
                    trace_id,
                    span_id,
                )
            return out
        except Exception as exc:  # exploration or logging broke: serve the policy's own choice
            self._failed(exc)
            return replace(d, request_id=rid)

    def record_usage(
        self,
        request_id: str,
        model: str,
        *,
        input_tokens: int | None = None,
        output_tokens: int | None = None,
        cost_usd: float | None = None,
    ) -> bool:
        """Log what the call cost once it is done (tokens from the API's usage fields)."""
        if self.log is None:
            return False
        return self.log.submit(
            _usage_record, time.time(), request_id, model, input_tokens, output_tokens, cost_usd
        )

    def observe(
        self,
        model: str,
        *,
        ttft_s: float | None = None,
        latency_s: float | None = None,
        predicted_ttft_s: float | None = None,
        predicted_latency_s: float | None = None,
        at: float | None = None,
    ) -> None:
        """One call of `model` as measured (TTFT and end-to-end seconds, each with the p95 its
        decision predicted where it had one): both channels' routers learn from it
        (`Router.observe`; docs/policy-format.md, 8.4)."""
        for router in (self.champion, self.candidate):
            observe = getattr(router, "observe", None)
            if observe is not None:
                observe(
                    model,
                    ttft_s=ttft_s,
                    latency_s=latency_s,
                    predicted_ttft_s=predicted_ttft_s,
                    predicted_latency_s=predicted_latency_s,
                    at=at,
                )

    def status(self) -> GatewayStatus:
        mode = {
            "exploration_rate": self.exploration.rate if self.exploration else 0.0,
            "shadow": self.shadow and self.candidate is not None,
            "canary_share": self.canary_share if self.candidate is not None else 0.0,
        }
        return GatewayStatus(
            self.champion.status(),
            self.candidate.status() if self.candidate is not None else None,
            self.log.status() if self.log is not None else None,
            mode,
            self._errors,
            self._last_error,
        )

    def close(self) -> None:
        """Stop the refreshers and write what the log still holds."""
        if self.log is not None:
            self.log.close()
        self.champion.close()
        if self.candidate is not None:
            self.candidate.close()

    def __enter__(self) -> "Gateway":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    @classmethod
    def open(
        cls,
        source: str | os.PathLike,
        public_key: Any = None,
        *,
        log_dir: str | os.PathLike | None = None,
        redact: Redactor | None = None,
        hash_key: bytes | None = None,
        exploration: Exploration | None = None,
        shadow: bool = False,
        canary_share: float = 0.0,
        canary_seed: int | str = "routeopt",
        refresh_s: float | None = None,
        on_event: Any = None,
        log_options: dict[str, Any] | None = None,
        **load_options: Any,
    ) -> "Gateway":
        """Load the champion (and, for shadow or canary, the candidate channel) from a registry.

        `load_options` go to `routeopt.artifacts.serving.loader.load` for both channels (`allow_unsigned`,
        `default_model`, `state_dir`). A registry without a loadable candidate still routes:
        shadow and canary stay off, and the reason is logged.
        """
        from routeopt.artifacts.serving.loader import PolicyLoadError, load

        champion = load(source, public_key, refresh_s=refresh_s, on_event=on_event, **load_options)
        candidate = None
        if shadow or canary_share > 0:
            try:
                candidate = load(
                    source,
                    public_key,
                    channel="candidate",
                    refresh_s=refresh_s,
                    on_event=on_event,
                    **{**load_options, "default_model": ""},
                )
            except PolicyLoadError as exc:
                log.warning("no candidate policy, shadow and canary are off: %s", exc)
        decision_log = (
            DecisionLog(log_dir, redact=redact, hash_key=hash_key, **(log_options or {}))
            if log_dir is not None
            else None
        )
        return cls(
            champion,
            log=decision_log,
            exploration=exploration,
            candidate=candidate,
            shadow=shadow,
            canary_share=canary_share,
            canary_seed=canary_seed,
        )

    # -- internals ------------------------------------------------------------------------
    def _choose(self, d: Any, rid: str) -> Choice:
        x = self.exploration
        if x is None:
            return choose(d, None, 1.0, 0.0)
        eligible = None
        if not x.capped and d.budget is None:  # eligibility then depends on the names only: reuse it
            names = d.pass_probabilities.keys()
            cached = self._eligible
            if cached is None or cached[0] != names:
                cached = self._eligible = (names, x.eligible(d))
            eligible = cached[1]
        return choose(d, x, *unit_draw(self._explore_key, rid), eligible=eligible)

    def _arm(self, rid: str) -> tuple[Router, str]:
        if unit_draw(self._canary_key, rid)[0] < self.canary_share:
            return self.candidate, "candidate"
        return self.champion, "champion"

    def _other(self, channel: str) -> Router | None:
        return self.candidate if channel == "champion" else self.champion

    def _failed(self, exc: Exception) -> None:
        with self._error_lock:
            self._errors += 1
            self._last_error = repr(exc)
        if self._errors == 1 or self._errors % 1000 == 0:
            log.warning("decision logging failed (%d so far), routing unaffected: %r", self._errors, exc)

    def _record(
        self,
        t: float,
        rid: str,
        prompt: str,
        suite: str | None,
        quality_target: float | None,
        channel: str,
        d: Any,
        choice: Choice,
        shadow: Router | None,
        trace_id: str | None = None,
        span_id: str | None = None,
    ) -> dict[str, Any]:
        """The log line of one decision (runs in the writer thread)."""
        assert self.log is not None
        rec: dict[str, Any] = {
            "v": FORMAT_VERSION,
            "kind": "decision",
            "time": iso_time(t),
            "request_id": rid,
            "suite": suite,
            "quality_target": quality_target,
            **self.log.prompt_fields(prompt),
            "channel": channel,
            "policy_version": d.policy_version,
            "model": choice.model,
            "propensity": choice.propensity,
            "policy_model": d.model,
            "policy_probability": choice.policy_probability,
            "explored": choice.explored,
            "pass_probabilities": d.pass_probabilities,
            "expected_cost_usd": d.expected_cost_usd,
        }
        if d.unknown_suite:
            rec["unknown_suite"] = True
        if d.budget is not None:
            rec["budget"] = {k: v for k, v in d.budget.items() if k not in ("predicted_s", "mask_s")}
        if d.live is not None:
            rec["live"] = d.live
        if trace_id is not None:  # feedback, decisions and traces join on it
            rec["trace_id"] = trace_id
            if span_id is not None:
                rec["span_id"] = span_id
        if self.exploration is not None:
            rec["exploration"] = {"rate": self.exploration.rate, "eligible": list(choice.eligible)}
        if self.canary_share > 0 and self.candidate is not None:
            rec["canary_share"] = self.canary_share
        if shadow is not None:
            other = _shadow(shadow, prompt, suite, quality_target, channel, d.policy_version)
            if other is not None:
                rec["shadow"] = other
        return rec


def _shadow(
    router: Router,
    prompt: str,
    suite: str | None,
    quality_target: float | None,
    served_channel: str,
    served_version: int,
) -> dict[str, Any] | None:
    """The other channel's decision on the same request, or why there is none."""
    channel = "candidate" if served_channel == "champion" else "champion"
    try:
        d = router.route(prompt, suite, quality_target)
    except Exception as exc:  # the shadow policy failing must not lose the served record
        return {"channel": channel, "error": repr(exc)}
    if d.policy_version == served_version:
        return None  # the same policy: nothing to compare
    return {
        "channel": channel,
        "policy_version": d.policy_version,
        "model": d.model,
        "policy_probability": policy_distribution(d)[1],
        "pass_probabilities": d.pass_probabilities,
        "expected_cost_usd": d.expected_cost_usd,
    }


def _usage_record(
    t: float,
    rid: str,
    model: str,
    input_tokens: int | None,
    output_tokens: int | None,
    cost_usd: float | None,
) -> dict[str, Any]:
    return {
        "v": FORMAT_VERSION,
        "kind": "usage",
        "time": iso_time(t),
        "request_id": rid,
        "model": model,
        "input_tokens": input_tokens,
        "output_tokens": output_tokens,
        "cost_usd": cost_usd,
    }
