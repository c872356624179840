"""Model providers: one module per model API behind one Protocol, created through one registry.

Owns the request/response types (`base`), what the SDK-based providers share (`sdk`: streaming,
timing, token fallback, error mapping with keys redacted), OpenAI-compatible and Anthropic
providers, and in-process models (`local/`). Vendor SDKs (and torch) are imported inside each
factory, so `evals` imports without them. May import `routeopt.evals.config` and nothing else of `evals`.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING

from routeopt.evals.providers.base import (
    Completion,
    GenerationSettings,
    Message,
    Provider,
    ProviderError,
    Request,
)

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate

# provider name -> "module:factory"; each factory takes a Candidate and returns a Provider.
PROVIDERS: dict[str, str] = {
    "openai": "routeopt.evals.providers.openai_provider:create",
    "anthropic": "routeopt.evals.providers.anthropic_provider:create",
    "local": "routeopt.evals.providers.local.provider:create",
}


def make_provider(candidate: "Candidate") -> Provider:
    """Build the provider for a candidate; a miss names the providers that exist."""
    try:
        target = PROVIDERS[candidate.provider]
    except KeyError:
        raise ValueError(
            f"candidate {candidate.name!r}: unknown provider {candidate.provider!r}; "
            f"known: {sorted(PROVIDERS)}"
        ) from None
    module_name, _, factory = target.partition(":")
    return getattr(import_module(module_name), factory)(candidate)


__all__ = [
    "Completion",
    "GenerationSettings",
    "Message",
    "Provider",
    "ProviderError",
    "Request",
    "make_provider",
    "PROVIDERS",
]
