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


# seconds to first token and per word of answer: the cheapest candidate is the slowest to start
SPEED = {"tiny": (1.6, 0.02), "small": (0.35, 0.03), "medium": (0.5, 0.04), "large": (0.8, 0.06)}


def timed_frame(n_items: int = 150, seed: int = 0, unmeasured: float = 0.0) -> pd.DataFrame:
    frame = demo_frame(n_items, seed)
    rng = np.random.default_rng(seed + 1)
    start = np.array([SPEED[m][0] for m in frame["model"]])
    per_word = np.array([SPEED[m][1] for m in frame["model"]])
    words = frame["prompt"].str.count(" ").to_numpy()
    frame["ttft_s"] = start * rng.lognormal(0.0, 0.25, len(frame))
    frame["latency_s"] = frame["ttft_s"] + per_word * words * 10 * rng.lognormal(0.0, 0.2, len(frame))
    if unmeasured:
        gone = rng.random(len(frame)) < unmeasured
        frame.loc[gone, ["ttft_s", "latency_s"]] = np.nan
    return frame
