"""Real routing policies for the publishing tests, and prompts to route."""

from __future__ import annotations

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
            rng.choice(["alpha", "beta", "gamma", "delta", "eps"], size=difficulty * 3))
        for k, model in enumerate(CANDIDATES):
            passed = difficulty <= 2 + 2 * k or rng.random() < 0.1
            rows.append({"run_id": "r1", "suite": suite, "suite_version": "v1", "item_id": str(i),
                         "request_id": f"{suite}-{i}", "prompt": prompt, "model": model,
                         "score": float(passed), "passed": bool(passed),
                         "cost_usd": 1e-4 * (1 + 4 * k) * (1 + len(prompt) / 100),
                         "input_tokens": len(prompt) // 4, "output_tokens": 8,
                         "latency_s": 0.1, "ttft_s": 0.05})
    return pd.DataFrame(rows)


def _direct_policy(seed: int):
    """A RoutingPolicy assembled from its parts (used until `train_router` is available)."""
    from router_training.features import FeatureSpec
    from router_training.policy import CostModel, LinearScorer, RoutingPolicy

    rng = np.random.default_rng(seed)
    spec = FeatureSpec(suites=SUITES, n_buckets=2**10)
    k = len(CANDIDATES)
    return RoutingPolicy(
        candidates=list(CANDIDATES), spec=spec,
        scorer=LinearScorer(rng.normal(size=(spec.n_features, k)), np.array([-1.0, 0.0, 1.5])),
        platt=np.array([[1.0] * k, [0.0] * k]),
        cost_model=CostModel(np.array([[1e-4, 5e-4, 2e-3], [1e-5, 5e-5, 2e-4]] + [[0.0] * k] * 3),
                             np.array([1e-6] * k)),
        rule="lambda", table=[(1000.0, 0.5), (100.0, 0.7), (10.0, 0.8), (0.0, 0.9)],
        reference_pass_rate=0.9, reference_model="large", quality_target=0.9,
        metrics={"seed": seed})


def make_policy(seed: int = 0):
    try:
        from router_training.train import train_router
    except ImportError:
        return _direct_policy(seed)
    return train_router(synthetic_frame(seed), quality_target=0.9, seed=seed).policy


PROMPTS = [("reverse task difficulty 1: alpha beta", "reverse"),
           ("sort task difficulty 5: " + "gamma delta " * 9, "sort"),
           ("add 2 and 3", None)]
