"""Route the LiteLLM proxy's `routeopt` alias per prompt: a callback for `litellm --config`.

LiteLLM's proxy has no custom routing strategy (LiteLLM issues #6143, #25297), but its
`CustomLogger.async_pre_call_hook` may rewrite the request before the proxy's router picks a
deployment. This callback does that for requests whose `model` is the alias:

1. it reads the prompt, suite and request id as every routeopt gateway does
   (`routeopt.artifacts.serving.route_request`: `metadata.routeopt_suite`, `x-routeopt-suite`, ...) and asks the
   policy (`routeopt.artifacts.serving.gateway.Gateway`: verified, hot-swapped, decision logs);
2. it sets `model` to the deployment (`model_name` in `model_list`) of the chosen candidate and
   `fallbacks` to the deployments of the policy's fallbacks, in order, so LiteLLM's own retry
   and fallback machinery serves the policy's second choice when the first fails;
3. it answers with `x-routeopt-model` (the policy's choice), `x-routeopt-served-model` (the
   candidate whose deployment answered), `x-routeopt-deployment`, `x-routeopt-policy-version`,
   `x-routeopt-decision-id`, `x-routeopt-fallbacks`, `x-routeopt-propensity` and
   `x-routeopt-policy-probability` response headers (plain and streamed), and
   `x-routeopt-fallback` with the reason when a fallback served instead of the policy's choice
   (the choice has no deployment, or its call failed); it keeps the decision in the request's
   `metadata.routeopt_decision`, and logs token usage of the call under the decision id.

At start-up (once the proxy's router has its deployments) and on every policy swap, the callback
warns, naming them, about policy candidates that have no deployment: their requests are served by
the first fallback that has one.

Candidates map to deployments one to one by name unless `$ROUTEOPT_DEPLOYMENTS` says otherwise
(`candidate=deployment,...`). The decision id is the request's `metadata.routeopt_request_id`
or `x-request-id`, else LiteLLM's own call id. Requests for any other model pass untouched.

    # config.yaml (gateways/litellm/config.yaml is a complete one)
    litellm_settings:
      callbacks: routeopt.artifacts.serving.litellm_proxy.handler
    general_settings:
      master_key: os.environ/LITELLM_MASTER_KEY
    # environment: ROUTEOPT_POLICY=https://policies.internal/ ROUTEOPT_PUBLIC_KEY=/keys/public_key.pem

`handler` is built when LiteLLM first asks for it (loading its config at start-up), from the
variables of `routeopt.artifacts.serving.settings`; importing this module does nothing else.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Mapping

from litellm.integrations.custom_logger import CustomLogger

from routeopt.artifacts.serving.gateway import Gateway, write_through_on_signals
from routeopt.artifacts.serving.settings import GatewayLoader, GatewaySettings, SettingsError
from routeopt.artifacts.serving.route_request import ALIAS, BadRequest, route_request
from routeopt.artifacts.serving.decision_service import header_value

log = logging.getLogger("routeopt.litellm_proxy")
DEPLOYMENTS_ENV = "ROUTEOPT_DEPLOYMENTS"
DECISION_KEY = "routeopt_decision"
ROUTED_CALLS = {"completion", "acompletion", "text_completion", "atext_completion"}


def parse_deployments(text: str) -> dict[str, str]:
    """`small=gpt-4o-mini,large=gpt-4o` -> {candidate: deployment}; a bad entry is a SettingsError."""
    out: dict[str, str] = {}
    for entry in filter(None, (e.strip() for e in text.split(","))):
        candidate, sep, deployment = (s.strip() for s in entry.partition("="))
        if not sep or not candidate or not deployment:
            raise SettingsError(f"${DEPLOYMENTS_ENV}: {entry!r} is not candidate=deployment")
        out[candidate] = deployment
    return out


def _http_error(status: int, message: str) -> Exception:
    """The exception LiteLLM's proxy answers with this status and an OpenAI-style error body."""
    from litellm.proxy._types import ProxyException

    kind = "invalid_request_error" if status < 500 else "internal_server_error"
    return ProxyException(message=message, type=kind, param=None, code=status)


def _deployment_names() -> set[str] | None:
    """The proxy's model group names (None outside a running proxy: no check possible)."""
    try:
        from litellm.proxy.proxy_server import llm_router
    except ImportError:
        return None
    return set(llm_router.get_model_names()) if llm_router is not None else None


def _served_group(response: Any) -> str | None:
    """The model group (deployment name) whose call answered, as LiteLLM's router records it."""
    hidden = getattr(response, "_hidden_params", None)
    extra = hidden.get("additional_headers") if isinstance(hidden, Mapping) else None
    group = extra.get("x-litellm-model-group") if isinstance(extra, Mapping) else None
    return group if isinstance(group, str) and group else None


class RouteoptProxyHandler(CustomLogger):
    """The callback: routes alias requests with `gateway` onto the proxy's deployments."""

    def __init__(
        self,
        gateway: Gateway | GatewayLoader,
        *,
        deployments: Mapping[str, str] | None = None,
        alias: str = ALIAS,
    ) -> None:
        super().__init__()
        self._source, self.alias = gateway, alias
        self.deployments = dict(deployments or {})
        self._candidates = {d: c for c, d in self.deployments.items()}
        self._checked_version: int | None = None

    @property
    def gateway(self) -> Gateway | None:
        """The gateway routing requests (None while its loader still waits for a policy)."""
        return self._source.gateway if isinstance(self._source, GatewayLoader) else self._source

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "RouteoptProxyHandler":
        """From the ROUTEOPT_* variables. With no policy to load yet (and no default model), the
        proxy still starts: alias requests get 503 until one loads, other models are untouched."""
        env = os.environ if env is None else env
        deployments = parse_deployments(env.get(DEPLOYMENTS_ENV, ""))
        checks: list[RouteoptProxyHandler] = []

        def on_event(kind: str, _message: str) -> None:
            if kind == "swapped" and checks:
                checks[0].check_deployments()

        loader = GatewayLoader(GatewaySettings.from_env(env), on_event=on_event).start()
        # The proxy ends by re-raising SIGTERM after its graceful shutdown, so atexit never runs:
        # from the signal on, the decision log writes each record at once.
        write_through_on_signals(lambda: loader.gateway.log if loader.gateway is not None else None)
        if loader.gateway is not None:
            s = loader.gateway.status().champion
            log.warning(
                "routeopt routes the %r alias with policy version %d%s",
                ALIAS,
                s.version,
                f" (default model: {s.default_reason})" if s.serving_default else "",
            )
        handler = cls(loader, deployments=deployments)
        checks.append(handler)
        handler.check_deployments_when_ready()
        return handler

    def missing_deployments(self, names: set[str] | None = None) -> list[str] | None:
        """The serving policy's candidates that have no deployment in the proxy (None: no policy
        yet, or no proxy router to ask)."""
        names = _deployment_names() if names is None else names
        gateway = self.gateway
        policy = gateway.policy if gateway is not None else None
        if names is None or policy is None:
            return None
        return [c for c in policy.candidates if self.deployment(c) not in names]

    def check_deployments(self) -> list[str] | None:
        """Warn, naming them, about the serving policy's candidates that have no deployment."""
        missing = self.missing_deployments()
        gateway = self.gateway
        if missing is None or gateway is None:
            return missing
        self._checked_version = gateway.version
        if missing:
            log.warning(
                "routeopt policy version %d: candidates %s have no deployment in this proxy "
                "(no model_list entry named %s); their requests are served by the first "
                "fallback that has one. Add the deployments or map them with $%s.",
                gateway.version,
                missing,
                [self.deployment(c) for c in missing],
                DEPLOYMENTS_ENV,
            )
        return missing

    def check_deployments_when_ready(self, timeout_s: float = 600.0) -> None:
        """Check once the proxy has built its router (it does so after loading its callbacks)."""

        def wait() -> None:
            deadline = time.monotonic() + timeout_s
            while time.monotonic() < deadline:
                if self.gateway is not None and _deployment_names() is not None:
                    if self._checked_version is None:
                        self.check_deployments()
                    return
                time.sleep(0.2)

        threading.Thread(target=wait, name="routeopt-deployment-check", daemon=True).start()

    def deployment(self, candidate: str) -> str:
        return self.deployments.get(candidate, candidate)

    async def async_pre_call_hook(
        self, user_api_key_dict: Any, cache: Any, data: dict, call_type: Any
    ) -> dict:
        if data.get("model") != self.alias:
            return data
        if call_type not in ROUTED_CALLS:
            raise _http_error(400, f"routeopt routes chat and text completions, not {call_type}")
        metadata = data.get("metadata")
        metadata = metadata if isinstance(metadata, dict) else data.setdefault("metadata", {})
        headers = _headers(data)
        try:
            request = route_request(data, headers, alias=self.alias)
        except BadRequest as exc:
            raise _http_error(400, str(exc)) from None
        rid = request.request_id or data.get("litellm_call_id")  # the request's own id, else LiteLLM's
        gateway = self.gateway
        if gateway is None:
            raise _http_error(
                503,
                f"routeopt cannot route yet ({self._source.reason}); name a model "
                f"instead of {self.alias!r} meanwhile",
            )
        try:
            d = gateway.route(
                request.prompt,
                request.suite,
                request.quality_target,
                request_id=None if rid is None else str(rid),
                traceparent=headers.get("traceparent"),
                **request.budgets(),
            )
        except Exception as exc:  # the proxy must answer, and say why, rather than crash
            log.exception("the routeopt policy failed to decide")
            raise _http_error(500, f"the routeopt policy failed to decide: {exc!r}") from None
        chosen, fallbacks = self._deployments_for([d.model, *d.fallbacks])
        if d.policy_version and d.policy_version != self._checked_version:
            self.check_deployments()  # a policy not checked yet (the loader's first, a missed swap)
        data["model"] = chosen
        if fallbacks and not data.get("fallbacks"):
            data["fallbacks"] = fallbacks
        metadata[DECISION_KEY] = {
            "model": d.model,
            "deployment": chosen,
            "fallbacks": list(d.fallbacks),
            "policy_version": d.policy_version,
            "decision_id": d.request_id,
            "propensity": d.propensity,
            "policy_probability": d.policy_probability,
            "default_reason": d.default_reason,
            "traceparent": d.traceparent,
            "budget": d.budget,
            "fallback": None
            if chosen == self.deployment(d.model)
            else f"no deployment for {d.model!r} (model_name {self.deployment(d.model)!r})",
        }
        return data

    def _deployments_for(self, candidates: list[str]) -> tuple[str, list[str]]:
        """The first candidate that has a deployment, and the rest's deployments, in order."""
        names = _deployment_names()
        mapped = [self.deployment(c) for c in candidates]
        present = [m for m in dict.fromkeys(mapped) if names is None or m in names]
        if not present:
            raise _http_error(
                500,
                f"no LiteLLM deployment is named any of {mapped}; add model_list "
                f"entries with these model_name values or set ${DEPLOYMENTS_ENV}",
            )
        return present[0], present[1:]

    async def async_post_call_response_headers_hook(
        self,
        data: dict,
        user_api_key_dict: Any,
        response: Any,
        request_headers: dict[str, str] | None = None,
        litellm_call_info: dict[str, object] | None = None,
    ) -> dict[str, str] | None:
        d = _decision(data)
        if d is None:
            return None
        deployment = _served_group(response) or d["deployment"]
        served = self._candidates.get(deployment, deployment)
        headers = {
            "x-routeopt-model": d["model"],
            "x-routeopt-served-model": served,
            "x-routeopt-deployment": deployment,
            "x-routeopt-policy-version": str(d["policy_version"]),
            "x-routeopt-decision-id": str(d["decision_id"]),
            "x-routeopt-fallbacks": ",".join(d["fallbacks"]),
            "x-routeopt-propensity": repr(float(d["propensity"])),
            "x-routeopt-policy-probability": repr(float(d["policy_probability"])),
        }
        if served != d["model"]:
            headers["x-routeopt-fallback"] = d.get("fallback") or f"the call of {d['model']!r} failed"
        if d["default_reason"]:
            headers["x-routeopt-default-reason"] = d["default_reason"]
        return {k: header_value(v).decode("ascii") for k, v in headers.items()}

    async def async_log_success_event(
        self, kwargs: dict, response_obj: Any, start_time: Any, end_time: Any
    ) -> None:
        """Log the served call's tokens and cost under the decision id (a `usage` record)."""
        d = _decision(kwargs.get("litellm_params") or {}) or _decision(kwargs)
        if d is None:
            return
        try:
            usage = getattr(response_obj, "usage", None)
            group = (kwargs.get("litellm_params", {}).get("metadata") or {}).get("model_group")
            served = self._candidates.get(group, group) if group else d["model"]
            gateway = self.gateway
            if gateway is None:
                return
            gateway.record_usage(
                str(d["decision_id"]),
                served,
                input_tokens=getattr(usage, "prompt_tokens", None),
                output_tokens=getattr(usage, "completion_tokens", None),
                cost_usd=kwargs.get("response_cost"),
            )
            ttft, latency = call_timings(kwargs, start_time, end_time)
            if ttft is not None or latency is not None:  # live latency (policy format, 8.4)
                gateway.observe(
                    served, ttft_s=ttft, latency_s=latency, **_predicted(d, served, ttft, latency)
                )
        except Exception:  # logging usage must never fail a served call
            log.exception("could not log the call's usage")


def call_timings(kwargs: Mapping[str, Any], start: Any, end: Any) -> tuple[float | None, float | None]:
    """A served call's TTFT (streamed calls: LiteLLM's `completion_start_time`, the first chunk)
    and end-to-end seconds, from the times LiteLLM hands its success callback."""

    def seconds(a: Any, b: Any) -> float | None:
        try:
            s = (b - a).total_seconds()
        except (TypeError, AttributeError):
            return None
        return s if s >= 0 else None

    latency = seconds(start, end)
    first = kwargs.get("completion_start_time")
    ttft = seconds(start, first) if kwargs.get("stream") and first is not None else None
    return ttft, latency


def _predicted(
    d: Mapping[str, Any], served: str, ttft: float | None, latency: float | None
) -> dict[str, float]:
    """The p95 the decision predicted for the served model's call, of its budget's kind, where
    the call measured that kind (an observation's `predicted_<kind>_s`)."""
    budget = d.get("budget") or {}
    kind, predicted = budget.get("kind"), (budget.get("predicted_s") or {}).get(served)
    measured = {"ttft": ttft, "latency": latency}.get(kind)
    if measured is None or not isinstance(predicted, (int, float)) or not predicted > 0:
        return {}
    return {f"predicted_{kind}_s": float(predicted)}


def _decision(data: Mapping[str, Any]) -> dict | None:
    for key in ("metadata", "litellm_metadata"):
        metadata = data.get(key)
        if isinstance(metadata, Mapping) and isinstance(metadata.get(DECISION_KEY), dict):
            return metadata[DECISION_KEY]
    return None


def _headers(data: Mapping[str, Any]) -> dict[str, str]:
    """The client's request headers, lower-cased, as the proxy hands them to callbacks."""
    request = data.get("proxy_server_request")
    headers = request.get("headers") if isinstance(request, Mapping) else None
    if not isinstance(headers, Mapping):
        metadata = data.get("metadata")
        headers = metadata.get("headers") if isinstance(metadata, Mapping) else None
    return {str(k).lower(): str(v) for k, v in (headers or {}).items()}


def __getattr__(name: str) -> Any:
    """`handler`: built from the environment the first time LiteLLM asks for it."""
    if name != "handler":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    instance = RouteoptProxyHandler.from_env()
    globals()["handler"] = instance
    return instance
