"""Storage: the DuckDB outcome store (`store`), one row per (run, suite, item, candidate), and
the importer of outcomes recorded elsewhere (`importer`). One process writes a DuckDB file, so
workers return rows and the store persists them. May import `routeopt.evals.suite.datasets` (to read
JSONL) and nothing else of `evals`.
"""
