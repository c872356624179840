"""Route LiteLLM traffic with a routeopt policy: a custom routing strategy for `litellm.Router`.

Requests sent to the alias model (default `routeopt`) are routed per prompt: the policy's choice
is mapped to the deployment whose `model_name` equals the candidate name, falling back along the
policy's ordered fallbacks when a candidate has no deployment. Requests for any other model go to
a deployment of that model unchanged. The decision is written into the request's `metadata`
(`routeopt_decision`) so LiteLLM callbacks and logs can record which policy version chose what.
While the gateway has no valid policy and serves its default model (`load(..., default_model=)`),
requests go to that model's deployment and the metadata says why (`default_reason`).

With an `routeopt.artifacts.serving.gateway.Gateway` instead of a bare `Router`, decisions are logged (and may
explore, shadow or canary) under the request id in `metadata["routeopt_request_id"]`, else under
one the gateway makes; either is in `metadata["routeopt_decision"]["request_id"]`, for the
callback that reports the outcome.

    strategy = install(litellm_router, routeopt.artifacts.serving.loader.load(url, public_key=..., refresh_s=30))
    await litellm_router.acompletion(model="routeopt", messages=[...], metadata={"routeopt_suite": "sql"})

Importing this module sets `LITELLM_LOCAL_MODEL_COST_MAP=True` unless already set, so importing
LiteLLM does not fetch its price map from the internet.
"""

from __future__ import annotations

import os
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from litellm.types.router import CustomRoutingStrategyBase  # noqa: E402

from routeopt.artifacts.serving.gateway import Gateway  # noqa: E402
from routeopt.artifacts.serving.route_request import (
    ALIAS,
    REQUEST_ID_KEY,
    SUITE_KEY,
    TARGET_KEY,
    messages_text,
    BUDGETS,
    budget_of,
)  # noqa: E402
from routeopt.artifacts.serving.loader import Router  # noqa: E402

DECISION_KEY = "routeopt_decision"


class NoDeployment(LookupError):
    """Neither the policy's choice nor any fallback has a deployment in the LiteLLM router."""


def prompt_text(messages: list[dict] | None, input: Any = None) -> str:
    """All message text (string or content-part lists), the same text routeopt trained on and
    every other routeopt gateway routes on (`routeopt.artifacts.serving.route_request.messages_text`)."""
    if messages:
        return messages_text(messages)
    if isinstance(input, str):
        return input
    return "\n".join(str(x) for x in input) if isinstance(input, list) else ""


class RouteoptRoutingStrategy(CustomRoutingStrategyBase):
    """LiteLLM's custom routing hook backed by a (refreshing, verified) routeopt `Router`."""

    def __init__(self, litellm_router: Any, policy: Router | Gateway, *, alias: str = ALIAS) -> None:
        self.litellm_router, self.policy, self.alias = litellm_router, policy, alias

    def _deployments(self) -> list[Any]:
        registry = getattr(self.litellm_router, "registry", None)
        return list(registry().all()) if callable(registry) else list(self.litellm_router.model_list)

    def _first(self, names: list[str], default_reason: str | None = None) -> Any:
        by_name: dict[str, Any] = {}
        for d in self._deployments():
            by_name.setdefault(d["model_name"], d)
        for name in names:
            if name in by_name:
                return by_name[name]
        if default_reason is not None:
            raise NoDeployment(
                f"routeopt serves its default model {names[0]!r} ({default_reason}), "
                f"but no LiteLLM deployment is named {names[0]!r}; add one"
            )
        raise NoDeployment(
            f"no LiteLLM deployment named any of {names}; add a model_list entry "
            f"whose model_name is the candidate name"
        )

    def pick(
        self,
        model: str,
        messages: list[dict] | None = None,
        input: Any = None,
        request_kwargs: dict | None = None,
    ) -> Any:
        """The deployment for one request (shared by the sync and async hooks)."""
        if model != self.alias:
            return self._first([model])
        metadata = (request_kwargs or {}).get("metadata") or {}
        target = metadata.get(TARGET_KEY)
        extra = {}
        if isinstance(self.policy, Gateway):
            rid = metadata.get(REQUEST_ID_KEY)
            extra["request_id"] = None if rid is None else str(rid)
        for name in BUDGETS:
            if metadata.get("routeopt_" + name) is not None:
                extra[name] = budget_of(metadata["routeopt_" + name], f"metadata.routeopt_{name}")
        decision = self.policy.route(
            prompt_text(messages, input),
            suite=metadata.get(SUITE_KEY),
            quality_target=None if target is None else float(target),
            **extra,
        )
        if request_kwargs is not None and isinstance(request_kwargs.get("metadata"), dict):
            request_kwargs["metadata"][DECISION_KEY] = {
                "model": decision.model,
                "fallbacks": list(decision.fallbacks),
                "policy_version": decision.policy_version,
                "default_reason": decision.default_reason,
                "propensity": decision.propensity,
                "policy_probability": decision.policy_probability,
                "request_id": decision.request_id,
                "budget": decision.budget,
            }
        return self._first([decision.model, *decision.fallbacks], decision.default_reason)

    async def async_get_available_deployment(
        self,
        model: str,
        messages: list[dict] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict | None = None,
    ) -> Any:
        return self.pick(model, messages, input, request_kwargs)

    def get_available_deployment(
        self,
        model: str,
        messages: list[dict] | None = None,
        input: Any = None,
        specific_deployment: bool | None = False,
        request_kwargs: dict | None = None,
    ) -> Any:
        return self.pick(model, messages, input, request_kwargs)


def install(litellm_router: Any, policy: Router | Gateway, *, alias: str = ALIAS) -> RouteoptRoutingStrategy:
    """Make `litellm_router` route `alias` requests with `policy`; returns the strategy."""
    strategy = RouteoptRoutingStrategy(litellm_router, policy, alias=alias)
    register = getattr(litellm_router, "register_plugin", None) or litellm_router.set_custom_routing_strategy
    register(strategy)
    return strategy
