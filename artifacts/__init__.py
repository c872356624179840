"""Publishing and serving routing policies: signed, versioned, verifiable.

- `routeopt.artifacts.publish.registry`: `publish(policy, registry, lineage=..., metrics=...)`, channels
  (`move_channel`, `rollback`), `list_versions`, `show`, `diff`.
- `routeopt.artifacts.serving.loader`: the gateway loader, `load(source, public_key) -> Router` with a refresher.
- `routeopt.artifacts.serving.manifest` / `routeopt.artifacts.serving.signatures` / `routeopt.artifacts.serving.verify`: the format and its checks;
  `routeopt.artifacts.publish.manifest_writer` and `routeopt.artifacts.publish.signing_keys` write and sign.
- `routeopt.artifacts.serving.backends`: local folder, S3-compatible storage, HTTP (`routeopt.artifacts.publish.registry_server`).
- `routeopt.artifacts.serving.litellm_adapter`: a LiteLLM custom routing strategy (the SDK's `Router`).
- `routeopt.artifacts.serving.litellm_proxy`: the callback that routes the LiteLLM proxy's `routeopt` alias.
- `routeopt.artifacts.serving.decision_service`: the decision service (`routeopt gateway serve`) for every other gateway;
  `routeopt.artifacts.serving.route_request` reads a request the same way for all of them, and
  `routeopt.artifacts.serving.settings` configures them from the same `ROUTEOPT_*` variables.
- `routeopt.artifacts.publish.promotion`: the gate that decides whether a new policy replaces the champion.

Nothing is imported here, so `import routeopt.artifacts.serving.loader` stays light for gateways.
"""
