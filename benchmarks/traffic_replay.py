"""Replay a known traffic through a gateway and score a second policy off-policy.

The traffic is a set of requests whose outcome is known for every model (RouterBench's test split
in ../shared, or a synthetic fleet made here). The champion routes it through
`routeopt.artifacts.serving.gateway.Gateway` with exploration; feedback (passed, cost) is drawn from the true
outcome of the model each request was served by and imported with the decision log into a store;
then `routeopt.router_training.live.promise` estimates the second policy's pass rate and cost, whose true values come
straight from the data. Used by `benchmarks/ope_coverage.py` and `tests/flows/test_live_replay.py`.

Three ways of knowing the second policy's choice on the logged requests:
  text:   the log keeps the text (redaction hook `verbatim`), the policy decides again offline;
  shadow: no text; the gateway computed the candidate's decision beside the champion's;
  canary: no text; the candidate served `canary_share` of the requests, shadowed on the rest.
"""

from __future__ import annotations

import json
import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))
# ../shared beside the checkout (or beside the folder of worktrees), or $ROUTEOPT_SHARED_DIR
_SHARED = [Path(p) for p in (os.environ.get("ROUTEOPT_SHARED_DIR"),) if p] + [
    REPO.parent / "shared",
    REPO.parent.parent / "shared",
]
ROUTERBENCH = next(
    (s / "data" / "routerbench" for s in _SHARED if (s / "data" / "routerbench").is_dir()),
    _SHARED[-1] / "data" / "routerbench",
)
MODES = ("text", "shadow", "canary")


def fleet_from_frame(frame: Any) -> Any:
    """The requests with the true outcome and cost of every candidate (`RoutingData`)."""
    from routeopt.router_training.fit.data import routing_data

    return routing_data(frame).complete()


def synthetic_frame(seed: int, n: int) -> Any:
    """A self-made fleet: four models whose pass chance falls with a request's difficulty at
    different rates, priced 1:3:8:20, with prompts that show the difficulty (so a router learns)."""
    import pandas as pd

    rng = np.random.default_rng(seed)
    words = np.array(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"])
    models = {"tiny": (0.55, 1.0), "small": (0.35, 3.0), "medium": (0.2, 8.0), "large": (0.08, 20.0)}
    rows = []
    for i in range(n):
        suite = ("reverse", "sort", "add")[i % 3]
        difficulty = int(rng.integers(0, 8))
        prompt = f"{suite} level {difficulty}: " + " ".join(rng.choice(words, 2 + 3 * difficulty))
        for name, (drop, price) in models.items():
            p = float(np.clip(0.98 - drop * difficulty, 0.02, 0.98))
            rows.append(
                {
                    "request_id": f"{suite}-{seed}-{i}",
                    "suite": suite,
                    "prompt": prompt,
                    "model": name,
                    "score": float(rng.random() < p),
                    "cost_usd": 1e-5 * price * (1 + len(prompt) / 200),
                }
            )
    return pd.DataFrame(rows)


def load_data(source: str, n_test: int | None = None) -> tuple[Any, Any, str]:
    """(training frame, test fleet, description): 'routerbench' (../shared) or 'synthetic'."""
    import pandas as pd

    if source == "routerbench":
        if not (ROUTERBENCH / "test.parquet").exists():
            raise FileNotFoundError(f"{ROUTERBENCH}: RouterBench is not there")
        train = pd.read_parquet(ROUTERBENCH / "train.parquet")
        fleet = fleet_from_frame(pd.read_parquet(ROUTERBENCH / "test.parquet"))
        what = "RouterBench test split"
    else:
        train, fleet = synthetic_frame(0, 900), fleet_from_frame(synthetic_frame(1, n_test or 600))
        what = "synthetic fleet"
    if n_test is not None and n_test < len(fleet):
        fleet = fleet.subset(np.arange(n_test))
    return train, fleet, f"{what}, {len(fleet.request_ids)} requests x {len(fleet.candidates)} models"


def train_pair(train: Any, seed: int = 0) -> tuple[Any, Any]:
    """The champion (quality target 0.95) and a second policy that trades quality for cost (0.9)."""
    from routeopt.router_training.train import train_router

    champion = train_router(train, quality_target=0.95, seed=seed).policy
    return champion, replace(champion, quality_target=0.9)


def publish_pair(folder: Path, champion: Any, second: Any) -> Path:
    """A registry where the champion is version 1 (`champion`) and the second version 2 (`candidate`)."""
    from routeopt.artifacts.publish.registry import move_channel, publish
    from routeopt.artifacts.publish.signing_keys import generate_keys

    registry = folder / "registry"
    private, _ = generate_keys(registry_keys(registry))
    for policy, channel in ((champion, "champion"), (second, "candidate")):
        v = publish(
            policy, registry, lineage={"benchmark": "traffic replay"}, metrics={}, signing_key=private
        )
        move_channel(registry, channel, v.version, signing_key=private)
    return registry


def registry_keys(registry: Path) -> Path:
    """Where `publish_pair` keeps the registry's signing key and its public key."""
    return registry.parent / "keys"


def truth(policy: Any, fleet: Any, reps: int = 1) -> tuple[float, float]:
    """The policy's true pass rate and mean cost per request on the traffic."""
    pos = {c: j for j, c in enumerate(fleet.candidates)}
    picks = np.array([pos[d.model] for d in policy.decide_batch(fleet.prompts, fleet.suites)])
    rows = np.arange(len(picks))
    return float(fleet.Y[rows, picks].mean()), float(fleet.C[rows, picks].mean())


def replay(
    registry: Path,
    fleet: Any,
    folder: Path,
    *,
    mode: str,
    seed: int,
    rate: float,
    canary_share: float = 0.2,
    reps: int = 1,
    feedback_share: float = 1.0,
) -> Path:
    """Route the traffic `reps` times through a gateway, feed back true outcomes; returns a store.

    Feedback comes back for a random `feedback_share` of requests (missing at random).
    """
    from routeopt.artifacts.serving.gateway import DecisionLog, Exploration, Gateway, verbatim
    from routeopt.artifacts.serving.loader import load
    from routeopt.evals.storage.store import Store
    from routeopt.evals.storage.traffic import import_decisions, import_feedback

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}")
    logs = folder / f"log-{mode}-{seed}"
    public = registry_keys(registry) / "public_key.pem"
    champion = load(registry, public, channel="champion", state_dir=False)
    candidate = load(registry, public, channel="candidate", state_dir=False) if mode != "text" else None
    gateway = Gateway(
        champion,
        log=DecisionLog(logs, redact=verbatim if mode == "text" else None, max_queue=1 << 20),
        exploration=Exploration(rate=rate, seed=seed),
        candidate=candidate,
        shadow=mode != "text",
        canary_share=canary_share if mode == "canary" else 0.0,
        canary_seed=seed,
    )
    pos = {c: j for j, c in enumerate(fleet.candidates)}
    rng = np.random.default_rng(seed + 10_000)
    feedback = []
    for rep in range(reps):
        for i, (rid, prompt, suite) in enumerate(zip(fleet.request_ids, fleet.prompts, fleet.suites)):
            d = gateway.route(prompt, suite, request_id=f"{rid}#{rep}")
            if rng.random() < feedback_share:
                j = pos[d.model]
                feedback.append(
                    {
                        "request_id": d.request_id,
                        "passed": bool(fleet.Y[i, j] >= 0.5),
                        "cost_usd": float(fleet.C[i, j]),
                    }
                )
    gateway.log.flush()
    gateway.log.close()
    path = folder / f"traffic-{mode}-{seed}.duckdb"
    fb = folder / f"feedback-{mode}-{seed}.jsonl"
    fb.write_text("".join(json.dumps(r) + "\n" for r in feedback))
    with Store(path) as store:
        import_decisions(logs, store)
        import_feedback(fb, store, source="truth")
    return path


def estimate(store_path: Path, policy: Any, version: int, mode: str) -> Any:
    """routeopt.router_training.live.promise's estimate of the policy (version 2) on the replayed traffic."""
    return estimate_pair(store_path, policy, version, mode)[0]


def estimate_pair(store_path: Path, policy: Any, version: int, mode: str) -> tuple[Any, Any, Any]:
    """The policy's estimate, the champion's (version 1, from its own records) and the paired
    difference policy - champion, as the promotion gate computes them."""
    from routeopt.evals.storage.store import Store
    from routeopt.evals.storage.traffic import load_traffic
    from routeopt.router_training.live.promise import compare, evaluate

    with Store(store_path, read_only=True) as store:
        frame = load_traffic(store)
    new = evaluate(frame, version, policy if mode == "text" else None)
    champion = evaluate(frame, 1)
    return new, champion, compare(frame, new, champion)
