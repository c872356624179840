#!/usr/bin/env bash
# GPU check: random-weight ~1B Llama served through the local provider (bf16, fp8,
# fp8-dyn at concurrency 1/16/64), decode speed vs the memory-bandwidth limit, prefix-cache TTFT
# with and without, speculative decoding with three drafts (self, first 2 layers, small random),
# and one suite through `routeopt run`. Finishes in < 8 minutes on one H100/H200-class GPU (steps
# that do not fit are skipped and listed); figures land in OUT/gpu_check.{json,md}.
#
#   benchmarks/gpu_check.sh                          # --device cuda --out gpu_check_out
#   benchmarks/gpu_check.sh --device cpu --tiny --out /tmp/gc   # CPU code path, seconds
#   benchmarks/gpu_check.sh --bandwidth-tbs 3.35     # override the bandwidth table
#
# The project's device machine lacks prefect, duckdb, pydantic and cryptography and cannot fetch
# them: run `python benchmarks/gpu_wheels.py` here first; it prints the one device command.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v nvidia-smi >/dev/null 2>&1; then
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi
export TOKENIZERS_PARALLELISM=false
exec timeout "${GPU_CHECK_TIMEOUT_S:-480}" python benchmarks/gpu_check.py "$@"
