"""The leaf every package may import: standard library only (`io`: atomic writes, JSON-safe values;
`fields`: "did you mean" for a misspelt key of a validated file).

It exists so that the pipeline (`evals`, `flows`) and the gateway side (`artifacts`,
`routeopt.router_training.policy.routing`) share one implementation of each job without the gateway importing
the pipeline.
"""
