"""The leaf every package may import: standard library only (`io`: atomic writes, JSON-safe values).

It exists so that the pipeline (`evals`, `flows`) and the gateway side (`artifacts`,
`router_training.policy`) share one implementation of each job without the gateway importing
the pipeline.
"""
