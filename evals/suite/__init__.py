"""The suite format: what ML engineers write in `evals/suites/*.yaml`.

Owns line-aware YAML parsing and `include:` resolution (`files`), datasets and their rows
(`datasets`), and the validated suite with its items, prompts and version hash (`spec`).
May import `routeopt.evals.grading` (a suite names its grader), `routeopt.evals.providers.base` (a suite item
becomes a `Request`) and `routeopt.evals.config`; never the runner or the store.
"""
