"""The `local` provider: Hugging Face causal LMs served in-process.

Owns the provider and its engine thread (`provider`), continuous batching per decode step
(`batcher`), sampling and speculative verification (`speculative`), automatic prefix caching
(`prefix_cache`) and the quantized weight formats a candidate's `variant` selects (`quantize`).
torch and transformers are imported on first use. May import `routeopt.evals.providers.base` and
`routeopt.evals.config`.
"""
