"""Publishing and serving routing policies: signed, versioned, verifiable.

- `routeopt.artifacts.registry`: `publish(policy, registry, lineage=..., metrics=...)`, channels
  (`move_channel`, `rollback`), `list_versions`, `show`, `diff`.
- `routeopt.artifacts.runtime`: the gateway loader, `load(source, public_key) -> Router` with a refresher.
- `routeopt.artifacts.manifest` / `routeopt.artifacts.signing` / `routeopt.artifacts.verify`: the format and its checks.
- `routeopt.artifacts.backends`: local folder, S3-compatible storage, HTTP (`routeopt.artifacts.server`).
- `routeopt.artifacts.litellm_adapter`: a LiteLLM custom routing strategy (the SDK's `Router`).
- `routeopt.artifacts.litellm_proxy`: the callback that routes the LiteLLM proxy's `routeopt` alias.
- `routeopt.artifacts.service`: the decision service (`routeopt gateway serve`) for every other gateway;
  `routeopt.artifacts.route_request` reads a request the same way for all of them, and
  `routeopt.artifacts.gateway_settings` configures them from the same `ROUTEOPT_*` variables.
- `routeopt.artifacts.promotion`: the gate that decides whether a new policy replaces the champion.

Nothing is imported here, so `import routeopt.artifacts.runtime` stays light for gateways.
"""
