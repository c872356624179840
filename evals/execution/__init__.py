"""Call execution: one suite across one candidate, with every call accounted for.

Owns the runner (`runner`: concurrency, retries with backoff, timeouts, grading, batched writes),
per-endpoint rate limits, the circuit breaker and the GPU-time meter (`limits`), spend caps
(`budget`) and the response cache (`cache`). May import `evals.providers`, `evals.suite`,
`evals.storage` (the `Outcome` row it produces) and `evals.config`.
"""
