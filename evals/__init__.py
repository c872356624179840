"""Evaluation: from eval suites to graded, costed outcome rows in the store.

One sub-package per concern, each importing only those listed before it (and `common`):

* `config`      the validated `routeopt.yaml` (candidates, prices, limits, budgets);
* `providers`   one module per model API behind one Protocol, and `local/` for in-process
                Hugging Face models (continuous batcher, quantized variants);
* `grading`     graders, the judge, custom graders and the sandbox for untrusted code;
* `suite`       the suite format: YAML files with line numbers and includes, datasets, items;
* `storage`     the DuckDB outcome store, the importer of outcomes recorded elsewhere, the
                gateways' decisions and feedback, drift between runs, the Parquet export;
* `execution`   the runner (retries, timeouts, circuit breaker, rate limits), spend caps and
                the response cache;
* `selfhost`    the economics of serving open models: the serving benchmark, the GPU cost model,
                the cost plan of logged traffic and the demo fleet (`zoo`).

The YAML suites and their data live beside the code, in `suites/` and `data/`, where ML
engineers add them. Nothing here imports `router_training`, `artifacts`, `reports` or `flows`.
"""
