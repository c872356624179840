"""Policies as earlier builds wrote them (format 2 and 1), so tests can check they still load.

This is format 2's writer as it was (JSON arrays, the weights rounded to 7 decimals, the idf
to 5, LightGBM boosters as their own text files), kept only to produce old policies.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from routeopt.router_training.policy.routing import LinearScorer, RoutingPolicy


def _scorer_dict(scorer) -> tuple[dict, dict[str, str]]:
    if isinstance(scorer, LinearScorer):
        return scorer.to_dict(), {}
    texts = scorer.texts
    files = {f"lgbm_{j}.txt": m for j, m in enumerate(texts) if not isinstance(m, float)}
    models = [m if isinstance(m, float) else f"lgbm_{j}.txt" for j, m in enumerate(texts)]
    return {"kind": "lightgbm", "n_features": scorer.n_features, "models": models}, files


def save_format_2(policy: RoutingPolicy, folder: Path) -> list[str]:
    """Write `policy` exactly as format 2 stored it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "features.json").write_text(json.dumps(policy.spec.to_dict()))
    scorer, extra = _scorer_dict(policy.scorer)
    for name, text in extra.items():
        (folder / name).write_text(text)
    (folder / "scorer.json").write_text(json.dumps(scorer))
    head = {
        "format_version": 2,
        "candidates": list(policy.candidates),
        "knob": policy.knob.to_dict(),
        "reference_pass_rate": float(policy.reference_pass_rate),
        "reference_model": policy.reference_model,
        "quality_target": float(policy.quality_target),
        "platt": np.asarray(policy.platt).tolist(),
        "cost_model": policy.cost_model.to_dict(),
        "metrics": policy.metrics,
        "files": {"features": "features.json", "scorer": "scorer.json"},
    }
    (folder / "policy.json").write_text(json.dumps(head, indent=1, sort_keys=True))
    return ["policy.json", "features.json", "scorer.json", *extra]


def save_format_1(policy: RoutingPolicy, folder: Path, table: list) -> None:
    """Format 1: format 2's files with a rule and its table instead of the knob."""
    save_format_2(policy, folder)
    head = json.loads((folder / "policy.json").read_text())
    head.pop("knob")
    head.update(format_version=1, rule="lambda", table=table)
    head["cost_model"].pop("topic_coef", None)
    (folder / "policy.json").write_text(json.dumps(head))
