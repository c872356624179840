"""The decision service: routeopt's decision over HTTP, for gateways that cannot embed Python.

`routeopt gateway serve` (or `routeopt-gateway serve` from the gateway-only install) serves it
with `routeopt.artifacts.serving.http_server`; it is also an ASGI app, for hosts that mount one.
A gateway sends it the request it is about to forward (an OpenAI chat body
works as it is) and copies the answer into the upstream request:

- `POST /v1/route` (and `POST /v1/route/<anything>`, for Envoy's ext_authz `path_prefix`): the
  decision as JSON (`?explain=1` adds every candidate's pass probability and expected cost) and
  as `x-routeopt-*` response headers; see `routeopt.artifacts.serving.route_request` for what is read from the
  body and headers. With `x-routeopt-accel-redirect: @location` the answer
  also carries `X-Accel-Redirect: @location`, which makes nginx replay the original request,
  body included, into that location (nginx's `auth_request` cannot: its subrequests carry no body).
- `GET /healthz`: the process answers. `GET /readyz`: 200 only while a verified policy or the
  default model serves. `GET /metrics`: Prometheus text. `GET /v1/status`: the gateway's status.

Bad input is a JSON error with a 4xx status, never a guess: a body that is not JSON, not an
object or too large, messages of the wrong shape, a request without a prompt. While no policy is
loaded and no default model is set, routing answers 503 and a background thread keeps trying.
Decisions go through `routeopt.artifacts.serving.gateway.Gateway`: the same hot swap, exploration, shadow,
canary and JSONL decision logs as an embedded gateway.
"""

from __future__ import annotations

import json
import logging
import math
import mmap
import multiprocessing
import struct
import time
import urllib.parse
from dataclasses import asdict, dataclass
from typing import Any, Awaitable, Callable

from routeopt.artifacts.serving.gateway import Gateway
from routeopt.artifacts.serving.http_server import JSON, Request, Response
from routeopt.artifacts.serving.settings import GatewayLoader, GatewaySettings
from routeopt.artifacts.serving.route_request import ALIAS, BadRequest, RouteRequest, route_request
from routeopt.artifacts.serving.loader import ServedDecision, PolicyLoadError
from routeopt.artifacts.serving.service_metrics import CONTENT_TYPE, Metrics, SharedMetrics, merge

log = logging.getLogger("routeopt.service")
Send = Callable[[dict], Awaitable[None]]
Receive = Callable[[], Awaitable[dict]]
ACCEL_HEADER = "x-routeopt-accel-redirect"
PARTIAL_BODY_HEADER = "x-envoy-auth-partial-body"  # Envoy's ext_authz: "true" when it cut the body


class _Disconnected(Exception):
    """The client went away before sending the whole body."""


class Refused(Exception):
    """A routing request answered with an error status; `reason` labels the metric."""

    def __init__(self, status: int, reason: str, message: str) -> None:
        super().__init__(message)
        self.status, self.reason = status, reason


@dataclass(frozen=True)
class ServiceOptions:
    """How requests are read and answered (the policy itself is in `GatewaySettings`).

    `model_headers` repeat the chosen model under more header names (Envoy AI Gateway routes on
    `x-ai-eg-model`); `require_suite` refuses requests that name no suite.
    """

    alias: str = ALIAS
    require_suite: bool = False
    max_body_bytes: int = 16 << 20
    model_headers: tuple[str, ...] = ()


class SharedObservations:
    """Live-latency observations that every worker of one service applies, whichever worker
    received them: a ring of fixed-size records in memory shared across the fork, written under
    a lock and read without one (a record overwritten before a worker read it is skipped).

    Each reader keeps its own position (`drain(position)`), so a worker applies every
    observation, its own included, in the order they were published.
    """

    NAME_BYTES = 200
    _SECONDS = ("ttft_s", "latency_s", "predicted_ttft_s", "predicted_latency_s")  # NaN for None
    _RECORD = struct.Struct(f"<qH{NAME_BYTES}s5d")  # sequence, name length, name, the 4 seconds, at

    def __init__(self, slots: int = 4096) -> None:
        self.slots = slots
        self._lock = multiprocessing.Lock()
        self._memory = mmap.mmap(-1, 8 + slots * self._RECORD.size)
        self._head = memoryview(self._memory)[:8].cast("q")

    def publish(self, observations: list[dict[str, Any]], at: float) -> None:
        with self._lock:
            seq = self._head[0]
            for o in observations:
                name = o["model"].encode("utf-8")
                seconds = [math.nan if o[k] is None else o[k] for k in self._SECONDS]
                offset = 8 + (seq % self.slots) * self._RECORD.size
                self._RECORD.pack_into(self._memory, offset, seq + 1, len(name), name, *seconds, at)
                seq += 1
            self._head[0] = seq

    def drain(self, position: int) -> tuple[list[dict[str, Any]], int]:
        """The observations published since `position`, and the position after them."""
        head = self._head[0]
        if head == position:
            return [], position
        out = []
        for seq in range(max(position, head - self.slots), head):
            offset = 8 + (seq % self.slots) * self._RECORD.size
            mark, size, name, *seconds, at = self._RECORD.unpack_from(self._memory, offset)
            if mark != seq + 1 or self._RECORD.unpack_from(self._memory, offset)[0] != mark:
                continue  # overwritten by writers a whole ring ahead
            fields = {k: None if math.isnan(v) else v for k, v in zip(self._SECONDS, seconds)}
            out.append({"model": name[:size].decode("utf-8"), **fields, "at": at})
        return out, head


@dataclass(frozen=True)
class WorkerShare:
    """What the workers of one service share (made before they fork), and which one this is."""

    observations: SharedObservations
    metrics: SharedMetrics
    index: int


def header_value(text: str) -> bytes:
    """A header-safe form of `text`: printable ASCII as is, anything else percent-encoded."""
    if text.isascii() and text.isprintable():
        return text.encode("ascii")
    return urllib.parse.quote(text, safe="").encode("ascii")


class DecisionService:
    """The ASGI app. Give it settings (it opens the gateway on start-up) or an open `gateway`."""

    def __init__(
        self,
        settings: GatewaySettings | None = None,
        *,
        gateway: Gateway | None = None,
        options: ServiceOptions | None = None,
        shared: WorkerShare | None = None,
    ) -> None:
        """`shared`: what this worker shares with the others of a service run as several
        (`--workers`): live-latency observations, and metrics that count the whole service."""
        if (settings is None) == (gateway is None):
            raise ValueError("give settings or an open gateway, not both")
        self.options = options or ServiceOptions()
        self._shared, self._observed_to, self._publish_at = shared, 0, 0.0
        self.metrics = Metrics()
        self._gateway = gateway
        self._loader = GatewayLoader(settings, on_event=self.metrics.event) if settings is not None else None
        self._model_headers = tuple(h.lower().encode("ascii") for h in self.options.model_headers)

    # -- life cycle -------------------------------------------------------------------------
    def start(self) -> None:
        """Open the gateway. A policy that cannot load yet leaves the service unready and a thread
        retrying every `refresh_s`; a configuration error (an unreadable key) raises."""
        if self._loader is not None:
            self._loader.start()

    @property
    def gateway(self) -> Gateway | None:
        return self._gateway if self._loader is None else self._loader.gateway

    @property
    def not_ready_reason(self) -> str | None:
        return None if self._loader is None else self._loader.reason

    def close(self) -> None:
        """Stop retrying and refreshing, and write what the decision log still holds."""
        if self._loader is not None:
            self._loader.close()
        elif self._gateway is not None:
            self._gateway.close()

    @property
    def ready(self) -> bool:
        return self.gateway is not None

    # -- requests ---------------------------------------------------------------------------
    def respond(self, request: Request) -> Response:
        """The answer to one request: what both the HTTP server and the ASGI app send."""
        if self._shared is not None and time.monotonic() >= self._publish_at:
            self._publish_metrics()
        path, method = request.path, request.method
        if path == "/v1/route" or path.startswith("/v1/route/"):
            if method != "POST":
                self.metrics.refuse("method")
                return _json(
                    405,
                    {
                        "error": "POST the request to route as the body "
                        "(an nginx auth_request subrequest carries no body: "
                        "use X-Accel-Redirect, see gateways/nginx)"
                    },
                    [(b"allow", b"POST")],
                )
            return self._route(request)
        if path == "/v1/observe":
            if method != "POST":
                return _json(405, {"error": "POST observations to /v1/observe"}, [(b"allow", b"POST")])
            return self._observe(request)
        pages = {
            "/healthz": self._healthz,
            "/readyz": self._readyz,
            "/metrics": self._metrics_page,
            "/v1/status": self._status,
        }
        page = pages.get(path)
        if page is None:
            return _json(404, {"error": f"no such path {path!r}; POST /v1/route"})
        if method not in ("GET", "HEAD"):
            return _json(405, {"error": f"{path} answers GET"}, [(b"allow", b"GET, HEAD")])
        status, body, content_type = page()
        if method == "HEAD":
            return Response(status, b"", content_type, [(b"content-length", str(len(body)).encode())])
        return Response(status, body, content_type)

    # -- ASGI -------------------------------------------------------------------------------
    async def __call__(self, scope: dict, receive: Receive, send: Send) -> None:
        """The same service as an ASGI app, to mount in an ASGI server or test client."""
        kind = scope["type"]
        if kind == "lifespan":
            await self._lifespan(receive, send)
        elif kind == "http":
            headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
            try:
                body = await self._read(headers, receive) if scope["method"] == "POST" else b""
            except _Disconnected:
                self.metrics.refuse("disconnect")
                return
            request = Request(scope["method"], scope["path"], scope.get("query_string", b""), headers, body)
            response = self.respond(request)
            headers_out = [(b"content-type", response.content_type), *response.headers]
            if not any(k == b"content-length" for k, _ in headers_out):
                headers_out.append((b"content-length", str(len(response.body)).encode()))
            await send({"type": "http.response.start", "status": response.status, "headers": headers_out})
            await send({"type": "http.response.body", "body": response.body})

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    self.start()
                except PolicyLoadError as exc:
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _read(self, headers: dict[str, str], receive: Receive) -> bytes | None:
        """An ASGI request's body, or None once it is over the limit (the rest is not read)."""
        limit = self.options.max_body_bytes
        declared = headers.get("content-length", "")
        if declared.isdigit() and int(declared) > limit:
            return None
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise _Disconnected
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                return None
            chunks.append(chunk)
            if not message.get("more_body"):
                return b"".join(chunks)

    def _healthz(self) -> tuple[int, bytes, bytes]:
        return 200, b'{"status":"ok"}', JSON

    def _readyz(self) -> tuple[int, bytes, bytes]:
        if self.gateway is None:
            return 503, _dumps({"ready": False, "reason": self.not_ready_reason}), JSON
        s = self.gateway.status().champion
        return (
            200,
            _dumps(
                {
                    "ready": True,
                    "version": s.version,
                    "serving_default": s.serving_default,
                    "default_reason": s.default_reason,
                    "expired": s.expired,
                }
            ),
            JSON,
        )

    def _metrics_page(self) -> tuple[int, bytes, bytes]:
        text = self._publish_metrics()
        if self._shared is not None:
            text = merge(text, self._shared.metrics.others(self._shared.index))
        return 200, text.encode(), CONTENT_TYPE.encode()

    def _publish_metrics(self) -> str:
        """This worker's exposition text, also left for its siblings' `/metrics` (at most
        half a second old when one is answered, for a worker that is answering requests)."""
        status = self.gateway.status() if self.gateway is not None else None
        text = self.metrics.render(status, self.ready)
        if self._shared is not None:
            self._shared.metrics.publish(self._shared.index, text)
            self._publish_at = time.monotonic() + 0.5
        return text

    def _status(self) -> tuple[int, bytes, bytes]:
        if self.gateway is None:
            return 503, _dumps({"ready": False, "reason": self.not_ready_reason}), JSON
        return 200, _dumps(asdict(self.gateway.status())), JSON

    # -- routing ----------------------------------------------------------------------------
    def _route(self, http: Request) -> Response:
        start = time.perf_counter()
        headers = http.headers
        try:
            request = _parse(self._body(http), headers, self.options)
            if request.passthrough is not None:
                self.metrics.passthrough += 1
                return Response(
                    200,
                    _dumps({"model": request.passthrough, "routed": False}),
                    JSON,
                    self._decision_headers(request.passthrough, None, headers),
                )
            decision = self._decide(request, headers.get("traceparent"))
            body = _answer(decision, request, b"explain=1" in http.query)
        except Refused as exc:
            self.metrics.refuse(exc.reason)
            return _json(exc.status, {"error": str(exc)})
        self.metrics.decided(decision.model, decision.default_reason is not None, time.perf_counter() - start)
        return Response(200, body, JSON, self._decision_headers(decision.model, decision, headers))

    def _observe(self, http: Request) -> Response:
        """Live latency (docs/policy-format.md, 8.4): one observation or a list of them,
        `{"model", "ttft_s"?, "latency_s"?, "predicted_ttft_s"?, "predicted_latency_s"?}`, each
        a call the caller made and timed, with the p95 its decision predicted where it had one."""
        try:
            body = _json_body(self._body(http))
            items = body if isinstance(body, list) else [body]
            parsed = [
                _observation(item, f"[{i}]" if isinstance(body, list) else "the body")
                for i, item in enumerate(items)
            ]
        except Refused as exc:
            return _json(exc.status, {"error": str(exc)})
        except BadRequest as exc:
            return _json(400, {"error": str(exc)})
        gateway = self.gateway
        if gateway is None:
            return _json(503, {"error": f"the service cannot route yet: {self.not_ready_reason}"})
        if self._shared is None:
            for observation in parsed:
                gateway.observe(**observation)
        else:  # every worker applies it (this one now), stamped with the time it arrived
            self._shared.observations.publish(parsed, time.monotonic())
            self._catch_up(gateway)
        return _json(200, {"observed": len(parsed)})

    def _catch_up(self, gateway: Gateway) -> None:
        """Apply what other workers were told since this one last looked."""
        assert self._shared is not None
        observations, self._observed_to = self._shared.observations.drain(self._observed_to)
        for observation in observations:
            gateway.observe(**observation)

    def _body(self, http: Request) -> bytes:
        """The request's body, or Refused when it was over the limit."""
        if http.body is None:
            limit = self.options.max_body_bytes
            declared = http.headers.get("content-length", "")
            message = (
                f"the body has {declared} bytes; the limit is {limit} (--max-body-bytes)"
                if declared.isdigit()
                else f"the body is over the {limit}-byte limit (--max-body-bytes)"
            )
            raise Refused(413, "too_large", message)
        return http.body

    def _decide(self, request: RouteRequest, traceparent: str | None) -> ServedDecision:
        """The decision for one parsed request. `traceparent`, the caller's W3C trace context,
        parents the decision's span when tracing is on (`routeopt.common.tracing`); the answer's header
        then names that span, else it is the caller's, unchanged."""
        gateway = self.gateway
        if gateway is None:
            raise Refused(503, "not_ready", f"the service cannot route yet: {self.not_ready_reason}")
        if self._shared is not None:
            self._catch_up(gateway)
        try:
            return gateway.route(
                request.prompt,
                request.suite,
                request.quality_target,
                request_id=request.request_id,
                traceparent=traceparent,
                **request.budgets(),
            )
        except Exception as exc:  # a policy that fails on one request must not take the service down
            log.exception("the policy failed to decide")
            raise Refused(500, "policy_error", f"the policy failed to decide: {exc!r}") from None

    def _decision_headers(
        self, model: str, d: ServedDecision | None, request_headers: dict[str, str]
    ) -> list[tuple[bytes, bytes]]:
        m = header_value(model)
        out = [(b"x-routeopt-model", m), *((name, m) for name in self._model_headers)]
        if d is not None:
            out += [
                (b"x-routeopt-fallbacks", header_value(",".join(d.fallbacks))),
                (b"x-routeopt-policy-version", str(d.policy_version).encode()),
                (b"x-routeopt-decision-id", header_value(d.request_id or "")),
                (b"x-routeopt-propensity", repr(float(d.propensity)).encode()),
                (b"x-routeopt-policy-probability", repr(float(d.policy_probability)).encode()),
            ]
            if d.default_reason is not None:
                out.append((b"x-routeopt-default-reason", header_value(d.default_reason)))
        else:
            out.append((b"x-routeopt-routed", b"false"))
        accel = request_headers.get(ACCEL_HEADER)
        if accel:
            out.append((b"x-accel-redirect", header_value(accel)))
        trace = (d.traceparent if d is not None else None) or request_headers.get("traceparent")
        if trace:
            out.append((b"traceparent", header_value(trace)))
        return out


def _parse(body: bytes, headers: dict[str, str], options: ServiceOptions) -> RouteRequest:
    """The routing request in a body (JSON, or the prompt itself as text/plain bytes)."""
    if headers.get(PARTIAL_BODY_HEADER, "").lower() == "true":
        raise Refused(
            413,
            "partial_body",
            "the proxy cut the body before sending it "
            "(Envoy ext_authz with_request_body.max_request_bytes): "
            "raise that limit, a cut prompt would route wrongly",
        )
    kind = headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        if kind in ("text/plain", "application/octet-stream"):
            request = route_request({"prompt": body.decode("utf-8", "replace")}, headers, alias=options.alias)
        else:
            request = route_request(_json_body(body), headers, alias=options.alias)
    except BadRequest as exc:
        raise Refused(400, "bad_request", str(exc)) from None
    if options.require_suite and request.suite is None and request.passthrough is None:
        raise Refused(
            400,
            "no_suite",
            "no suite: give suite (or metadata.routeopt_suite, or the "
            "x-routeopt-suite header); this service requires one",
        )
    return request


def _observation(item: Any, where: str) -> dict[str, Any]:
    """One observation as `Gateway.observe`'s keywords (model included), or Refused naming the
    field: seconds measured, and the p95 the decision predicted for each where given."""
    if not isinstance(item, dict):
        raise Refused(400, "bad_request", f"{where} is not an object")
    model = item.get("model")
    if not isinstance(model, str) or not model or len(model.encode("utf-8")) > SharedObservations.NAME_BYTES:
        raise Refused(
            400,
            "bad_request",
            f"{where}.model must be the candidate's name ({SharedObservations.NAME_BYTES} bytes at most)",
        )
    out: dict[str, Any] = {"model": model}
    for kind in ("ttft", "latency"):
        for name, positive in ((f"{kind}_s", False), (f"predicted_{kind}_s", True)):
            v = item.get(name)
            if v is not None and (
                isinstance(v, bool)
                or not isinstance(v, (int, float))
                or not (math.isfinite(v) and (v > 0 if positive else v >= 0))
            ):
                what = "positive" if positive else "non-negative"
                raise Refused(400, "bad_request", f"{where}.{name} must be a {what} number of seconds")
            out[name] = None if v is None else float(v)
        if out[f"{kind}_s"] is None and out[f"predicted_{kind}_s"] is not None:
            raise Refused(
                400, "bad_request", f"{where}.predicted_{kind}_s needs {kind}_s, what the call took"
            )
    if out["ttft_s"] is None and out["latency_s"] is None:
        raise Refused(400, "bad_request", f"{where} has neither ttft_s nor latency_s")
    unknown = sorted(set(item) - set(out))
    if unknown:
        raise Refused(400, "bad_request", f"{where}.{unknown[0]} is not a field of an observation")
    return out


def _json_body(body: bytes) -> Any:
    if not body.strip():
        raise BadRequest("the body is empty: POST the request to route (JSON with prompt or messages)")
    try:
        return json.loads(body)
    except UnicodeDecodeError as exc:
        raise BadRequest(f"the body is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except json.JSONDecodeError as exc:
        raise BadRequest(f"the body is not JSON: {exc.msg} at line {exc.lineno} column {exc.colno}") from None
    except RecursionError:
        raise BadRequest("the body's JSON nests too deeply") from None


def _answer(d: ServedDecision, request: RouteRequest, explain: bool) -> bytes:
    """The decision as the JSON body of the answer; `explain` adds every candidate's figures."""
    out = {
        "model": d.model,
        "fallbacks": list(d.fallbacks),
        "policy_version": d.policy_version,
        "decision_id": d.request_id,
        "propensity": d.propensity,
        "policy_probability": d.policy_probability,
        "suite": request.suite,
        "default_reason": d.default_reason,
    }
    if d.unknown_suite:
        out["unknown_suite"] = True
    if d.budget is not None:
        # predicted_s stays: a caller observing its call passes the model's back (8.4)
        out["budget"] = d.budget if explain else {k: v for k, v in d.budget.items() if k != "mask_s"}
    if explain:
        out.update(pass_probabilities=d.pass_probabilities, expected_cost_usd=d.expected_cost_usd)
    try:
        return _dumps(out)
    except ValueError as exc:  # a NaN from the policy: say so rather than send invalid JSON
        raise Refused(500, "policy_error", f"the policy's decision is not valid JSON: {exc}") from None


def _dumps(obj: Any) -> bytes:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False, default=str).encode(
        "utf-8"
    )


def _json(status: int, obj: Any, extra: list[tuple[bytes, bytes]] | None = None) -> Response:
    return Response(status, _dumps(obj), JSON, extra or ())
