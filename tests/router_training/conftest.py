"""A small synthetic fleet like the demo: 3 suites whose prompts state a difficulty, 4 candidates.

Each candidate passes an item when its skill exceeds the item's difficulty (with noise), so a
router that reads the prompt can send easy items to cheap candidates.
"""

from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")

CANDIDATES = {"tiny": (1.5, 0.0001), "small": (2.5, 0.0004), "medium": (3.5, 0.002), "large": (5.5, 0.01)}
SUITES = ("reverse", "sort", "add")
WORDS = "stone river apple cloud tiger lemon piano rocket violet maple".split()


def demo_frame(
    n_items: int = 150, seed: int = 0, suites: tuple[str, ...] = SUITES, candidates: dict | None = None
) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    candidates = candidates or CANDIDATES
    rows = []
    for suite in suites:
        for i in range(n_items):
            difficulty = int(rng.integers(1, 6))
            words = " ".join(rng.choice(WORDS, size=difficulty + 1))
            prompt = f"Task: {suite} the input. difficulty: {difficulty}. Input: {words}"
            for name, (skill, price) in candidates.items():
                p = 1 / (1 + np.exp(-3 * (skill - difficulty)))
                rows.append(
                    {
                        "request_id": f"{suite}-{i}",
                        "suite": suite,
                        "prompt": prompt,
                        "model": name,
                        "score": float(rng.random() < p),
                        "cost_usd": price * (1 + 0.1 * difficulty),
                    }
                )
    return pd.DataFrame(rows)


@pytest.fixture(scope="session")
def demo() -> pd.DataFrame:
    return demo_frame()


@pytest.fixture(scope="session")
def trained(demo):
    from routeopt.router_training.train import train_router

    return train_router(demo, quality_target=0.95, seed=0)
