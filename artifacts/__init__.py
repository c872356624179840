"""Publishing and serving routing policies: signed, versioned, verifiable.

- `artifacts.registry`: `publish(policy, registry, lineage=..., metrics=...)`, channels
  (`move_channel`, `rollback`), `list_versions`, `show`, `diff`.
- `artifacts.runtime`: the gateway loader, `load(source, public_key) -> Router` with a refresher.
- `artifacts.manifest` / `artifacts.signing` / `artifacts.verify`: the format and its checks.
- `artifacts.backends`: local folder, S3-compatible storage, HTTP (`artifacts.server`).
- `artifacts.litellm_adapter`: a LiteLLM custom routing strategy (the SDK's `Router`).
- `artifacts.litellm_proxy`: the callback that routes the LiteLLM proxy's `routeopt` alias.
- `artifacts.service`: the decision service (`routeopt gateway serve`) for every other gateway;
  `artifacts.route_request` reads a request the same way for all of them, and
  `artifacts.gateway_settings` configures them from the same `ROUTEOPT_*` variables.
- `artifacts.promotion`: the gate that decides whether a new policy replaces the champion.

Nothing is imported here, so `import artifacts.runtime` stays light for gateways.
"""
