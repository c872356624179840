"""The gateway side: load a verified routing policy and keep it fresh without ever serving a bad one.

Imports stay small on purpose (numpy, `cryptography`, the standard
library): a gateway embeds this module, so nothing here may pull in prefect, duckdb, pandas,
sklearn or torch, and boto3 is imported only if an `s3://` registry is opened.

    router = load("https://registry.internal:8600", public_key="public_key.pem", refresh_s=30)
    router.route("Reverse the word 'stone'", suite="reverse").model

A refresher thread polls the channel (a cheap conditional GET), checks the pointer's signature
and order, the manifest's signature, digest and expiry and every file's hash, then swaps the
policy in one reference assignment. On any failure it keeps serving the last good policy and
reports why through `status()`, the `on_event` callback and the `routeopt.runtime` logger.

Secure by default: signatures are checked with `public_key` (or `$ROUTEOPT_PUBLIC_KEY`); without
one, loading fails unless `allow_unsigned=True`. The newest channel move accepted is kept in a
state file (`routeopt.artifacts.serving.state`), so a restarted gateway still refuses a replayed pointer.
With `default_model` (or `$ROUTEOPT_DEFAULT_MODEL`) a gateway that has no valid policy (none
published yet, expired, refused, registry unreachable at start) routes every request to that
model and says why, instead of failing to start.
"""

from __future__ import annotations

import logging
import os
import re
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass, field, replace
from datetime import datetime, timezone
from functools import partial
from pathlib import Path
from typing import Any, Callable

from routeopt.artifacts.serving.backends import Backend, LocalBackend, RegistryError, exists, open_backend
from routeopt.common import tracing
from routeopt.artifacts.serving.state import SeenFile, default_state_dir
from routeopt.artifacts.serving.manifest import MANIFEST_NAME, Manifest, Pointer, format_time
from routeopt.artifacts.serving.signatures import trusted_keys
from routeopt.router_training.policy.latency import budget_request, serves
from routeopt.router_training.policy.live import LiveLatency, LiveSettings, live_move
from routeopt.artifacts.serving.verify import (
    Seen,
    SignedPointer,
    VerificationError,
    VerifiedVersion,
    check_order,
    materialize,
    read_pointer,
    verify_version,
)

log = logging.getLogger("routeopt.runtime")
DEFAULT_LIVE = LiveSettings()  # what a router remembers of live latency (docs/policy-format.md, 8.4)
_VERSION_IN_URL = re.compile(r"^(.*?)/?(versions/\d{6,}-[0-9a-f]{12})/?$")
EventCallback = Callable[[str, str], None]
PolicyLoader = Callable[[Path], Any]
DEFAULT_MODEL_ENV = "ROUTEOPT_DEFAULT_MODEL"
NO_KEY = (
    "no public key to verify policies with: pass public_key= (a PEM file), set "
    "$ROUTEOPT_PUBLIC_KEY, or pass allow_unsigned=True to accept unsigned policies"
)


class PolicyLoadError(RuntimeError):
    """No policy could be loaded at all (there is no last good one to fall back to).

    `kind` is VerificationError's ("expired", "unsigned", "order", "rejected"), "unreachable"
    (the registry could not be read) or "config" (no key to verify with)."""

    def __init__(self, message: str, kind: str = "rejected") -> None:
        super().__init__(message)
        self.kind = kind


def _kind(exc: Exception) -> str:
    return exc.kind if isinstance(exc, VerificationError) else "unreachable"


@dataclass(frozen=True)
class ServedDecision:
    """The policy's choice plus which policy version made it (for logs and audits).

    Two probabilities, two names (docs/policy-format.md, section 8.2): `propensity` is the
    probability that this request, given its id and contents, is served `model`: 1.0 unless
    exploration (`routeopt.artifacts.serving.gateway.Gateway`) could have sent it elsewhere, since the
    policy's own mixing draw is a hash of the request. `policy_probability` is the policy's own
    probability for the model it chose: below 1 at a knob point that mixes two rules (the share
    of such requests its hash sends that way). `request_id` is the id the Gateway logged it under.
    `unknown_suite` is True when the request named a suite the policy was not trained on.
    """

    model: str
    fallbacks: tuple[str, ...]
    pass_probabilities: dict[str, float]
    expected_cost_usd: dict[str, float]
    policy_version: int
    default_reason: str | None = None  # set when no valid policy chose: the default model did (version 0)
    propensity: float = 1.0
    request_id: str | None = None
    # Tracing (routeopt.common.tracing): the trace this decision belongs to, and the W3C header to send
    # back so that the application's own call of the model is a child of the decision's span.
    trace_id: str | None = None
    traceparent: str | None = None
    policy_probability: float = 1.0
    unknown_suite: bool = False
    # with a latency budget: {"kind", "budget_s", "tier_s", "met", "predicted_s", "mask_s"}
    # (docs/policy-format.md, 8.3), or {"kind", "budget_s", "met": None, "unserved": why} when the policy cannot serve it
    budget: dict[str, Any] | None = None
    # when live latency moved the decision (8.4): {"from": the policy's model, "over": the
    # candidates slow enough live to be predicted past the tier's mask}
    live: dict[str, Any] | None = None

    def traced(self, trace_id: str | None, traceparent: str | None) -> "ServedDecision":
        """This decision with its trace named: a copy of its fields, without the frozen
        dataclass's per-field `__init__` (dataclasses.replace costs 5 us, this 0.5; on every
        traced request)."""
        copy = object.__new__(type(self))
        fields = copy.__dict__
        fields.update(self.__dict__)
        fields["trace_id"], fields["traceparent"] = trace_id, traceparent
        return copy


@dataclass(frozen=True)
class _Active:
    policy: Any
    version: int
    digest: str
    signed: bool
    key_id: str | None
    manifest: Manifest
    pointer: Pointer | None
    loaded_at: datetime
    stale_at: float | None  # time.time() from which the default model serves instead (expiry)
    conformance: str | None = None  # what the policy's self-check against its vectors found
    suites: frozenset[str] | None = None  # the suites it was trained on (None: it does not say)


def known_suites(policy: Any) -> frozenset[str] | None:
    """The suite vocabulary a policy carries (`features.suites` in policy.json), if it has one."""
    suites = getattr(getattr(policy, "spec", None), "suites", None)
    return frozenset(suites) if suites is not None else None


@dataclass(frozen=True)
class RouterStatus:
    source: str
    channel: str | None
    version: int
    digest: str
    signed: bool
    expires_at: str | None
    expired: bool
    loaded_at: str
    last_check_at: str | None
    last_error: str | None
    consecutive_failures: int
    checks: int
    swaps: int
    serving_default: bool = False
    default_model: str | None = None
    default_reason: str | None = None
    state_file: str | None = None
    state_error: str | None = None
    conformance: str | None = None  # the served policy's self-check against its conformance vectors
    # requests that named a suite the serving policy was not trained on: by name (the first
    # MAX_UNKNOWN_SUITE_NAMES names), and in all
    unknown_suites: dict[str, int] = field(default_factory=dict)
    unknown_suite_requests: int = 0


MAX_UNKNOWN_SUITE_NAMES = 100  # names counted one by one; a client sending random names costs no more


def _default_loader(folder: Path) -> Any:
    from routeopt.router_training.policy.routing import RoutingPolicy

    return RoutingPolicy.load(folder)


class Router:
    """Routes requests with the current verified policy (or the default model while there is
    none); `refresh()` polls once, `start()` keeps polling. Build it with `load()`."""

    def __init__(
        self,
        backend: Backend,
        *,
        prefix: str = "",
        channel: str | None = None,
        public_key: Any = None,
        allow_unsigned: bool = False,
        default_model: str | None = None,
        state_dir: str | os.PathLike | bool = True,
        on_event: EventCallback | None = None,
        policy_loader: PolicyLoader | None = None,
        live: LiveSettings | None = DEFAULT_LIVE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._backend, self._prefix, self._channel = backend, prefix, channel
        # what this gateway sees of each candidate's latency now (None: budgets use the policy's
        # predictions only); `clock` is the time observations and decisions are stamped with
        self.live = LiveLatency(live) if live is not None else None
        self._clock = clock
        self._key = trusted_keys(public_key)
        if self._key is None and not allow_unsigned:
            raise PolicyLoadError(NO_KEY, "config")
        self._default = default_model or None
        self._on_event, self._loader = on_event, policy_loader or _default_loader
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._etag: str | None = None
        self._last_check: datetime | None = None
        self._last_error: str | None = None
        self._failures = self._checks = self._swaps = 0
        self._state = (
            None
            if channel is None or state_dir is False
            else SeenFile(default_state_dir() if state_dir is True else state_dir, backend.location, channel)
        )
        self._state_error: str | None = None
        self._seen: Seen | None = None
        self._active: _Active | None = None
        self._default_reason: str | None = None
        self._unknown_suites: dict[str, int] = {}
        self._unknown_total = 0
        self._unknown_lock = threading.Lock()
        self._warned: set[str] = set()
        try:
            self._active = self._initial()
        except (VerificationError, RegistryError, OSError) as exc:
            self._start_on_default(exc)

    def _start_on_default(self, exc: Exception) -> None:
        """Nothing valid at start: serve the default model and say why, or fail without one."""
        if self._default is None:
            hint = (
                (" (give default_model= or $ROUTEOPT_DEFAULT_MODEL to serve a default model until then)")
                if _kind(exc) == "expired"
                else ""
            )
            raise PolicyLoadError(f"cannot load a policy: {exc}{hint}", _kind(exc)) from None
        self._failures, self._last_error = 1, str(exc)
        self._default_reason = f"no valid policy: {exc}"
        log.warning("serving the default model %s: %s", self._default, self._default_reason)
        self._emit("default", f"serving the default model {self._default}: {self._default_reason}")

    def route(
        self,
        prompt: str,
        suite: str | None = None,
        quality_target: float | None = None,
        *,
        traceparent: str | None = None,
        ttft_budget_s: float | None = None,
        latency_budget_s: float | None = None,
    ) -> ServedDecision:
        """Decide for one request. With tracing on, the decision is a span (a child of the
        caller's `traceparent`, else of its current span), and `decision.traceparent` names it.

        A latency budget (seconds of TTFT or end to end, on the p95; one of the two) limits the
        choice to the candidates the policy's certified tier allows (docs/policy-format.md, 8.3);
        `decision.budget` says whether the choice is predicted to meet it. A policy trained
        without latency measurements decides as without a budget and says so in `budget`."""
        budget = budget_request(ttft_budget_s, latency_budget_s)
        if traceparent is None and (tracing.tracer() is None or tracing.IN_DECISION.get()):
            return self._decide(prompt, suite, quality_target, budget)
        start = time.time_ns()
        d = self._decide(prompt, suite, quality_target, budget)
        knob = quality_target if quality_target is not None else getattr(self.policy, "quality_target", None)
        # the span's attributes are made by tracing's writer thread, from the decision's few
        # immutable values: the queue holds what the span needs, not the probability dicts
        header, trace_id, _ = tracing.record_decision(
            traceparent,
            start,
            partial(
                tracing.attributes_for,
                d.model,
                d.fallbacks,
                d.propensity,
                d.policy_version,
                d.request_id,
                default_reason=d.default_reason,
                knob_target=knob,
                suite=suite,
            ),
        )
        return d.traced(trace_id, header)

    def _decide(
        self,
        prompt: str,
        suite: str | None,
        quality_target: float | None,
        budget: tuple[str, float] | None = None,
    ) -> ServedDecision:
        active = self._active  # one read: a concurrent swap never mixes two policies
        if active is None or (active.stale_at is not None and time.time() >= active.stale_at):
            return ServedDecision(
                str(self._default),
                (),
                {},
                {},
                0,
                self._why_default(active),
                budget=_unserved(budget, "no policy"),
            )
        served: dict[str, Any] | None = None
        moved: dict[str, Any] | None = None
        if budget is None and getattr(active.policy, "latency", None) is not None:
            budget = active.policy.latency.default_for(suite)  # the policy's default for the suite
        model = fallbacks = None
        if budget is not None and serves(getattr(active.policy, "latency", None), budget[0]):
            kind, seconds = budget
            d = active.policy.decide(prompt, suite, quality_target, **{f"{kind}_budget_s": seconds})
            served = budget_fields(d.budget)
            if self.live is not None:
                model, fallbacks, moved = self._live_move(d, active.policy.candidates)
                if moved is not None:
                    served["met"] = bool(d.budget.predicted_s[model] <= seconds)
        else:
            d = active.policy.decide(prompt, suite=suite, quality_target=quality_target)
            if budget is not None:
                served = _unserved(budget, f"policy version {active.version} has no {budget[0]} model")
                self._emit_once(f"budget-{budget[0]}-{active.version}", served["unserved"])
        unknown = bool(suite) and active.suites is not None and suite not in active.suites
        if unknown:
            self._unknown_suite(suite)  # type: ignore[arg-type]
        return ServedDecision(
            d.model if model is None else model,
            tuple(d.fallbacks) if fallbacks is None else fallbacks,
            d.pass_probabilities,
            d.expected_cost_usd,
            active.version,
            policy_probability=getattr(d, "propensity", 1.0),
            unknown_suite=unknown,
            budget=served,
            live=moved,
        )

    def _live_move(
        self, d: Any, candidates: list[str]
    ) -> tuple[str | None, tuple[str, ...] | None, dict[str, Any] | None]:
        """8.4: the decision's model, fallbacks and `live` field where live latency moves it
        (Nones where it stays). Every candidate's factor only when the chosen one is slow."""
        assert self.live is not None
        b, now = d.budget, self._clock()
        slow = self.live.slow([d.model], b.kind, now)
        if not slow or d.budget.predicted_s[d.model] * slow[d.model] <= b.limit_s:
            return None, None, None
        slow = self.live.slow(candidates, b.kind, now)
        move = live_move(
            d.model, d.fallbacks, candidates, d.pass_probabilities, b.predicted_s, b.limit_s, slow
        )
        if move is None:
            return None, None, None
        model, fallbacks, over = move
        return model, fallbacks, {"from": d.model, "over": over}

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
        """One call of `model` as the application measured it (its TTFT and end-to-end latency,
        seconds), each with the p95 the decision predicted for it where there was one (the
        decision's `budget["predicted_s"][model]`, of the budget's kind): decisions under a
        budget move off a candidate whose calls run slower than predicted (docs/policy-format.md,
        8.4). `at` defaults to the router's clock."""
        if self.live is not None:
            self.live.observe(
                model,
                self._clock() if at is None else at,
                ttft_s=ttft_s,
                latency_s=latency_s,
                predicted_ttft_s=predicted_ttft_s,
                predicted_latency_s=predicted_latency_s,
            )

    def _emit_once(self, key: str, message: str) -> None:
        """Warn once per key (a budget this policy cannot serve, say) for the router's life."""
        with self._unknown_lock:
            if key in self._warned:
                return
            self._warned.add(key)
        log.warning("%s: deciding without the budget", message)

    def _unknown_suite(self, suite: str) -> None:
        """Count a request naming a suite the policy does not know, and warn once per name: such
        a request routes on its prompt alone (the suite's one-hot column is empty)."""
        with self._unknown_lock:
            self._unknown_total += 1
            count = self._unknown_suites.get(suite)
            if count is not None:
                self._unknown_suites[suite] = count + 1
                return
            if len(self._unknown_suites) >= MAX_UNKNOWN_SUITE_NAMES:
                return
            self._unknown_suites[suite] = 1
            full = len(self._unknown_suites) == MAX_UNKNOWN_SUITE_NAMES
        known = sorted(self._active.suites or ()) if self._active is not None else []
        message = (
            f"suite {suite!r} is not one the policy was trained on (it knows {known}); such "
            f"requests route on the prompt alone"
        )
        if full:
            message += (
                f"; {MAX_UNKNOWN_SUITE_NAMES} unknown suite names seen, later ones are counted, not named"
            )
        log.warning(message)
        self._emit("unknown_suite", message)

    @property
    def policy(self) -> Any:
        """The loaded policy (None while no valid policy was ever loaded)."""
        return self._active.policy if self._active is not None else None

    @property
    def version(self) -> int:
        """The version that routes requests; 0 while the default model does."""
        return 0 if self._why_default(self._active) else self._active.version  # type: ignore[union-attr]

    def _why_default(self, active: _Active | None) -> str | None:
        """Why the default model serves now, or None when a policy does."""
        if active is None:
            return self._default_reason
        if active.stale_at is not None and time.time() >= active.stale_at:
            return f"version {active.version} expired at {active.manifest.raw.get('expires_at')}"
        return None

    def _build(self, verified: VerifiedVersion, pointer: Pointer | None) -> _Active:
        """Load the checked files (the loader must read eagerly: the folder is then deleted),
        check this runtime against the policy's conformance vectors and make one trial decision,
        so a signed but broken (or misread) policy never replaces a working one."""
        with tempfile.TemporaryDirectory(prefix="routeopt-policy-") as tmp:
            try:
                policy = self._loader(materialize(verified, Path(tmp)))
                conformance = _self_check(policy, verified)
                trial = policy.decide("routeopt load check: 2 + 2 = ?")
                if trial.model not in policy.candidates:
                    raise ValueError(f"chose {trial.model!r}, which is not a candidate")
            except VerificationError:
                raise
            except Exception as exc:  # a verified but unusable policy must not crash the gateway
                raise VerificationError(
                    f"{verified.location}: policy does not load or decide: {exc}"
                ) from None
        expires = verified.manifest.expires_at
        stale_at = expires.timestamp() if expires is not None and self._default else None
        return _Active(
            policy,
            verified.version,
            verified.digest,
            verified.signed,
            verified.key_id,
            verified.manifest,
            pointer,
            datetime.now(timezone.utc),
            stale_at,
            conformance,
            known_suites(policy),
        )

    def _check_order(self, pointer: Pointer) -> None:
        """Refuse a pointer older than the newest move accepted, by this process or (through the
        state file) by any gateway on this host before."""
        seen = self._seen
        if self._state is not None:
            stored = self._state.read()
            if stored is not None and (seen is None or stored.seq > seen.seq):
                seen = stored
        try:
            check_order(pointer, seen)
        except VerificationError as exc:
            if self._state is None:
                raise
            raise VerificationError(
                f"{exc}; the newest move this host accepted is recorded in "
                f"{self._state.path} (delete it only if the registry was "
                f"deliberately recreated)",
                exc.kind,
            ) from None

    def _accept(self, got: SignedPointer) -> None:
        """Remember an accepted pointer: its ETag for cheap polls, and its move for order checks."""
        self._etag, self._seen = got.etag, Seen.of(got.pointer)
        if self._state is None:
            return
        try:
            self._seen = max(self._state.record(self._seen), self._seen, key=lambda s: s.seq)
            self._state_error = None
        except (OSError, VerificationError) as exc:  # keep serving; a restart would forget this move
            self._state_error = f"cannot record the accepted move in {self._state.path}: {exc}"
            log.warning(self._state_error)

    def _initial(self) -> _Active:
        if self._channel is None:
            return self._build(verify_version(self._backend, self._prefix, self._key), None)
        got = read_pointer(self._backend, self._channel, self._key)
        assert got is not None
        self._check_order(got.pointer)
        verified = verify_version(
            self._backend, got.pointer.path, self._key, expected_digest=got.pointer.digest
        )
        active = self._build(verified, got.pointer)
        self._accept(got)
        return active

    def _poll(self) -> _Active | None:
        """The policy to swap in, checked and recorded, or None when nothing new is there."""
        if self._channel is None:  # a version folder is immutable: load it once
            return self._initial() if self._active is None else None
        got = read_pointer(self._backend, self._channel, self._key, etag=self._etag)
        if got is None:
            return None
        pointer, current = got.pointer, self._active
        self._check_order(pointer)
        if current is not None and pointer.version == current.version:
            if pointer.digest != current.digest:
                raise VerificationError(
                    f"channel {self._channel}: version {pointer.version} now has "
                    f"digest {pointer.digest[:12]}, served {current.digest[:12]} (rewritten)"
                )
            self._active = replace(current, pointer=pointer)
            self._accept(got)
            return None
        verified = verify_version(self._backend, pointer.path, self._key, expected_digest=pointer.digest)
        new = self._build(verified, pointer)
        self._accept(got)
        return new

    def _serving(self) -> str:
        why = self._why_default(self._active)
        return f"the default model {self._default}" if why else f"version {self.version}"

    def refresh(self) -> bool:
        """Poll once; True if a new policy was swapped in. Failures are recorded, never raised."""
        with self._lock:
            self._checks += 1
            self._last_check = datetime.now(timezone.utc)
            try:
                new = self._poll()
            except (VerificationError, RegistryError, OSError) as exc:
                self._failures += 1
                self._last_error = str(exc)
                kind = "unreachable" if isinstance(exc, (RegistryError, OSError)) else "rejected"
                log.warning("policy refresh %s, still serving %s: %s", kind, self._serving(), exc)
                self._emit(kind, str(exc))
                return False
            self._failures, self._last_error = 0, None
            if new is None:
                self._report_expiry()
                return False
            self._swaps += 1
            self._default_reason = None
            self._active = new  # last, so whoever sees the new version also sees its counters
            log.info("policy version %d now serving", new.version)
            self._emit("swapped", f"version {new.version}")
            return True

    def _report_expiry(self) -> None:
        a = self._active
        if a is None or not a.manifest.expired(datetime.now(timezone.utc)):
            return
        expired_at = a.manifest.raw.get("expires_at")
        if self._default is not None:
            message = (
                f"version {a.version} expired at {expired_at}; serving the default model "
                f"{self._default} until a newer valid policy is published"
            )
        else:
            message = f"serving version {a.version}, which expired at {expired_at}; no newer valid policy"
        log.warning(message)
        self._emit("expired", message)

    def _emit(self, kind: str, message: str) -> None:
        if self._on_event is not None:
            try:
                self._on_event(kind, message)
            except Exception:  # a broken callback must not stop the refresher
                log.exception("on_event callback failed")

    def start(self, interval_s: float) -> "Router":
        """Poll every `interval_s` seconds in a daemon thread until `close()`."""
        if self._thread is None:

            def loop() -> None:
                while not self._stop.wait(interval_s):
                    self.refresh()

            self._thread = threading.Thread(target=loop, name="routeopt-policy-refresher", daemon=True)
            self._thread.start()
        return self

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None

    def __enter__(self) -> "Router":
        return self

    def __exit__(self, *_: object) -> None:
        self.close()

    def status(self) -> RouterStatus:
        a = self._active
        why = self._why_default(a)
        held = a is not None and not why
        return RouterStatus(
            source=self._backend.location,
            channel=self._channel,
            version=a.version if held else 0,
            digest=a.digest if held else "",
            signed=held and a.signed,
            expires_at=a.manifest.raw.get("expires_at") if a else None,
            expired=a is not None and a.manifest.expired(datetime.now(timezone.utc)),
            loaded_at=format_time(a.loaded_at) if a else "",
            last_check_at=format_time(self._last_check) if self._last_check else None,
            last_error=self._last_error,
            consecutive_failures=self._failures,
            checks=self._checks,
            swaps=self._swaps,
            serving_default=why is not None,
            default_model=self._default,
            default_reason=why,
            state_file=str(self._state.path) if self._state else None,
            state_error=self._state_error,
            conformance=a.conformance if a else None,
            unknown_suites=dict(self._unknown_suites),
            unknown_suite_requests=self._unknown_total,
        )


def _self_check(policy: Any, verified: VerifiedVersion) -> str | None:
    """Run the policy's conformance vectors (docs/policy-format.md); refuse it on any mismatch.
    The manifest's format version must also be the one the policy's files say."""
    stated = verified.manifest.policy_format.get("version")
    actual = getattr(policy, "format_version", None)
    if stated is not None and actual is not None and stated != actual:
        raise VerificationError(
            f"{verified.location}: manifest.json says policy format {stated}, policy.json says {actual}"
        )
    check = getattr(policy, "self_check", None)
    if check is None:
        return None
    report = check()
    if not report.ok:
        raise VerificationError(
            f"{verified.location}: this runtime refuses the policy: {report.summary()}", "conformance"
        )
    return report.summary()


def _default_channel(backend: Backend) -> str:
    """`champion` if the registry has one, else `latest` if it has that, else `champion` (a
    gateway that starts before the first promotion waits for the gated channel)."""
    if exists(backend, "channels/champion.json"):
        return "champion"
    return "latest" if exists(backend, "channels/latest.json") else "champion"


def resolve(source: str | Path) -> tuple[Backend, str, bool]:
    """(backend, prefix, is_version): a version folder/URL, or a registry root."""
    text = str(source)
    if text.startswith(("http://", "https://", "s3://")):
        parsed = urllib.parse.urlsplit(text)
        match = _VERSION_IN_URL.match(parsed.path)
        if match:
            root = urllib.parse.urlunsplit(parsed._replace(path=match.group(1) or "/"))
            return open_backend(root), match.group(2), True
        return open_backend(text), "", False
    path = Path(text)
    if (path / MANIFEST_NAME).is_file():
        name = path.resolve().name
        if re.fullmatch(r"\d{6,}-[0-9a-f]{12}", name) and path.resolve().parent.name == "versions":
            return LocalBackend(path.resolve().parent.parent), f"versions/{name}", True
        return LocalBackend(path), "", True
    if not path.is_dir():
        raise PolicyLoadError(f"{path}: no such policy folder or registry", "unreachable")
    return LocalBackend(path), "", False


def load(
    source: str | Path,
    public_key: Any = None,
    *,
    channel: str | None = None,
    refresh_s: float | None = None,
    on_event: EventCallback | None = None,
    policy_loader: PolicyLoader | None = None,
    allow_unsigned: bool = False,
    default_model: str | None = None,
    state_dir: str | os.PathLike | bool = True,
    live: LiveSettings | None = DEFAULT_LIVE,
    clock: Callable[[], float] = time.monotonic,
) -> Router:
    """Load a policy from a version folder, a registry folder/bucket/URL (+ channel), verified.

    `public_key`: a PEM path, bytes or key, or a list of them while rotating keys; default
    `$ROUTEOPT_PUBLIC_KEY`. Without one, loading fails unless `allow_unsigned=True`.
    `channel` defaults to `champion` if the registry has one, else `latest`. With `refresh_s` a
    background thread keeps the policy fresh. `default_model` (default `$ROUTEOPT_DEFAULT_MODEL`)
    serves every request while no valid policy is there, instead of raising. `state_dir` keeps
    the newest channel move across restarts (True: `$ROUTEOPT_STATE_DIR` or
    ~/.local/state/routeopt/gateway; False: this process only, for one-shot tools). `live`: what
    the router remembers of the latency its application observes (`Router.observe`; None: no
    live latency), on `clock` (seconds).
    """
    fallback = (os.environ.get(DEFAULT_MODEL_ENV) if default_model is None else default_model) or None
    try:
        backend, prefix, is_version = resolve(source)
    except RegistryError as exc:  # a malformed URL or a missing client library
        raise PolicyLoadError(f"cannot load a policy: {exc}", "config") from None
    except PolicyLoadError:
        if fallback is None:
            raise
        backend, prefix, is_version = LocalBackend(Path(source)), "", False  # not there yet: wait
    if not is_version and channel is None:
        try:
            channel = _default_channel(backend)
        except RegistryError as exc:
            if fallback is None:
                raise PolicyLoadError(f"cannot load a policy: {exc}", "unreachable") from None
            channel = "champion"
    router = Router(
        backend,
        prefix=prefix,
        channel=None if is_version else channel,
        public_key=public_key,
        allow_unsigned=allow_unsigned,
        default_model=fallback,
        state_dir=state_dir,
        on_event=on_event,
        policy_loader=policy_loader,
        live=live,
        clock=clock,
    )
    if refresh_s:
        router.start(refresh_s)
    return router


def check(
    source: str | Path,
    public_key: Any = None,
    *,
    channel: str | None = None,
    allow_unsigned: bool = False,
    policy_loader: PolicyLoader | None = None,
) -> dict:
    """What `routeopt policies verify` prints: load exactly as a gateway would, then describe it."""
    router = load(
        source,
        public_key,
        channel=channel,
        allow_unsigned=allow_unsigned,
        policy_loader=policy_loader,
        state_dir=False,
        default_model="",
    )
    active = router._active
    assert active is not None
    if active.signed:
        signature = f"valid (key {active.key_id})"
    elif active.key_id:
        signature = f"present, NOT checked (--allow-unsigned without a public key; key {active.key_id})"
    else:
        signature = "unsigned"
    s = router.status()
    return {
        "source": s.source,
        "channel": s.channel,
        "version": s.version,
        "digest": s.digest,
        "signature": signature,
        "expires_at": s.expires_at,
        "files": [f.path for f in active.manifest.files],
        "policy_format": active.manifest.policy_format,
        "conformance": s.conformance,
    }


def budget_fields(outcome: Any) -> dict[str, Any]:
    """A decision's budget outcome as the log and the APIs carry it (docs/policy-format.md, 8.3)."""
    return {
        "kind": outcome.kind,
        "budget_s": outcome.budget_s,
        "tier_s": outcome.tier_s,
        "met": outcome.met,
        "predicted_s": outcome.predicted_s,
        "mask_s": outcome.mask_s,
    }


def _unserved(budget: tuple[str, float] | None, why: str) -> dict[str, Any] | None:
    if budget is None:
        return None
    return {"kind": budget[0], "budget_s": budget[1], "met": None, "unserved": why}
