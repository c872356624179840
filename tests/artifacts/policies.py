"""Real routing policies for the publishing tests, and prompts to route."""

from __future__ import annotations

import functools

import numpy as np

SUITES = ("reverse", "sort", "add")
CANDIDATES = ["small", "medium", "large"]


def synthetic_frame(seed: int, n_items: int = 60):
    """Outcomes where the small model passes short prompts and the large one passes almost all."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n_items):
        suite = SUITES[i % 3]
        difficulty = int(rng.integers(1, 6))
        prompt = f"{suite} task difficulty {difficulty}: " + " ".join(
            rng.choice(["alpha", "beta", "gamma", "delta", "eps"], size=difficulty * 3)
        )
        for k, model in enumerate(CANDIDATES):
            passed = difficulty <= 2 + 2 * k or rng.random() < 0.1
            rows.append(
                {
                    "run_id": "r1",
                    "suite": suite,
                    "suite_version": "v1",
                    "item_id": str(i),
                    "request_id": f"{suite}-{i}",
                    "prompt": prompt,
                    "model": model,
                    "score": float(passed),
                    "passed": bool(passed),
                    "cost_usd": 1e-4 * (1 + 4 * k) * (1 + len(prompt) / 100),
                    "input_tokens": len(prompt) // 4,
                    "output_tokens": 8,
                    "latency_s": 0.1,
                    "ttft_s": 0.05,
                }
            )
    return pd.DataFrame(rows)


@functools.lru_cache(maxsize=None)
def make_policy(seed: int = 0):
    """A RoutingPolicy trained by the real trainer on a small synthetic fleet (once per process:
    callers must not change it)."""
    from routeopt.router_training.train import train_router

    return train_router(synthetic_frame(seed), quality_target=0.9, seed=seed).policy


PROMPTS = [
    ("reverse task difficulty 1: alpha beta", "reverse"),
    ("sort task difficulty 5: " + "gamma delta " * 9, "sort"),
    ("add 2 and 3", None),
]
