"""Self-hosting economics: what serving an open model costs and how fast it is.

Owns the serving benchmark (`serving`: TTFT, TPOT, throughput and goodput at each concurrency,
against a `local` candidate or any OpenAI-compatible server), the GPU cost model (`costmodel`:
measured throughput -> $ per million tokens at a utilisation, beside API list prices) and the
demo fleet of tiny models this project trains itself (`zoo`). May import `routeopt.evals.providers`,
`routeopt.evals.suite`, `routeopt.evals.storage` and `routeopt.evals.config`.
"""
