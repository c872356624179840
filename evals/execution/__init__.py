"""Call execution: one suite across one candidate, with every call accounted for.

Owns the runner (`runner`: concurrency, grading, batched writes), one candidate's call path
shared by items and the judge (`calls`: breaker wait, per-attempt spend, timeouts, retries with
backoff), rate limits, the circuit breaker, the GPU-time meter and device slots (`limits`),
spend caps (`budget`), the response cache (`cache`) and the probe each candidate answers before
the first suite (`preflight`). May import `routeopt.evals.providers`, `routeopt.evals.suite`,
`routeopt.evals.storage` (the `Outcome` row it produces) and `routeopt.evals.config`.
"""
