"""Train a routing policy from outcomes: fit, calibrate, choose the rule, measure on held-out data.

Requests (not rows) are split, per suite, into train and held-out test. The estimator learns on
all of train; Platt scaling and the target -> parameter tables are fitted on out-of-fold
predictions of train (cross-fitting: no data is spent on a separate calibration set); the test
requests are touched only to report metrics. The estimator is the linear difficulty model by
default; `estimator="lightgbm"` fits one LightGBM booster per candidate on the same features and
calibrates it the same way (Platt on out-of-fold raw scores).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from common.io import jsonable
from router_training import metrics as M
from router_training.baselines import evaluate, outcomes_of, param_grid
from router_training.data import RoutingData, routing_data
from router_training.estimators import (
    LightGBMPassEstimator, LinearPassEstimator, design_matrix, fit_cost_model, fit_feature_spec, fit_platt,
)
from router_training.policy import RULES, LinearScorer, RoutingPolicy, TreeScorer, _sigmoid, choose


ESTIMATORS = ("linear", "lightgbm")


@dataclass
class TrainResult:
    policy: RoutingPolicy
    metrics: dict
    split: dict[str, list[str]]


def split_requests(data: RoutingData, holdout_fraction: float, seed: int) -> dict[str, np.ndarray]:
    """Per-suite random split of request indices into train and held-out test."""
    rng = np.random.default_rng(seed)
    parts: dict[str, list[int]] = {"train": [], "test": []}
    suites = np.array([s or "" for s in data.suites])
    for s in sorted(set(suites)):
        idx = rng.permutation(np.flatnonzero(suites == s))
        n_test = int(round(len(idx) * holdout_fraction))
        if holdout_fraction > 0 and len(idx) >= 3:
            n_test = min(max(n_test, 1), len(idx) - 2)
        parts["test"] += idx[:n_test].tolist()
        parts["train"] += idx[n_test:].tolist()
    return {k: np.array(sorted(v), dtype=int) for k, v in parts.items()}


def _suite_pos(suites: list[str | None], names: tuple[str, ...]) -> np.ndarray:
    pos = {s: i for i, s in enumerate(names)}
    return np.array([pos.get(s, -1) if s else -1 for s in suites], dtype=int)


def build_table(
    P: np.ndarray, C: np.ndarray, rule: str, Y: np.ndarray | None = None
) -> list[tuple[float, float]]:
    """(parameter, pass rate) from cheapest to best; entries that add no quality are dropped.

    The pass rate is the calibrated expectation of the chosen candidates, or, given out-of-fold
    outcomes Y, the lower of that and a lower confidence bound of the observed rate: picking the
    argmax of noisy probabilities overestimates them (winner's curse), and the floor should hold
    on requests the router has not seen, not just in expectation.
    """
    grid = param_grid(rule, C)
    if rule == "lambda":
        grid = grid[::-1]  # large lambda = cheapest first
    rows = np.arange(len(P))
    table: list[tuple[float, float]] = []
    for t in grid:
        pick = choose(P, C, rule, t)[:, 0]
        value = float(P[rows, pick].mean())
        if Y is not None:
            seen = Y[rows, pick]
            ok = ~np.isnan(seen)
            if ok.any():  # one-sided lower bound (z=1, ~84%): the floor should hold on new data
                value = min(value, M.wilson_lower(float(seen[ok].sum()), int(ok.sum()), z=1.0))
        if not table or value > table[-1][1] + 1e-9:
            table.append((float(t), value))
    return table


def _calib_curve(P, Cp, data: RoutingData, rule: str, table) -> tuple[np.ndarray, np.ndarray]:
    pts = [outcomes_of(choose(P, Cp, rule, t)[:, 0], data) for t, _ in table]
    q, c = np.array(pts).T
    return c, q


def pick_rule(P: np.ndarray, Cp: np.ndarray, calib: RoutingData) -> tuple[str, dict]:
    """Keep the rule whose calibration cost-quality hull has the larger AIQ."""
    full = calib.complete()
    keep = np.isin(calib.request_ids, full.request_ids)
    scores: dict[str, float] = {}
    for rule in RULES:
        table = build_table(P[keep], Cp[keep], rule)
        c, q = _calib_curve(P[keep], Cp[keep], full, rule, table) if len(full) else (np.empty(0),) * 2
        sc = np.nanmean(full.C, axis=0) if len(full) else np.zeros(1)
        scores[rule] = M.aiq(*M.frontier(c, q), float(sc.min()), float(sc.max())) if len(full) else 0.0
    best = max(RULES, key=lambda r: (scores[r], r == "lambda"))
    return best, {f"calib_aiq_{r}": v for r, v in scores.items()}


def floor_confidence(
    policy: RoutingPolicy, data: RoutingData, target: float,
    P: np.ndarray | None = None, Cp: np.ndarray | None = None,
) -> dict:
    """Observed pass rate at a target, its 95% lower bound and the confidence the floor holds.

    Pass P/Cp (out-of-fold predictions) to measure on training requests without optimism.
    """
    floor = target * policy.reference_pass_rate
    if P is None or Cp is None:
        data = data.align(policy.candidates)
        P, Cp = policy.predict(data.prompts, data.suites)
    ok = ~np.isnan(data.Y).any(axis=1)
    if not ok.any():
        return {"target": target, "floor_pass_rate": floor, "n": 0}
    choice = choose(P[ok], Cp[ok], policy.rule, policy.param_for(target))[:, 0]
    Y = data.Y[ok]
    passed = float(Y[np.arange(len(Y)), choice].sum())
    return {
        "target": target, "floor_pass_rate": floor, "n": int(ok.sum()),
        "observed_pass_rate": passed / len(Y),
        "lower95": M.wilson_lower(passed, len(Y)),
        "confidence_floor_holds": M.confidence_at_least(passed, len(Y), floor),
    }


def _scorer(est: LinearPassEstimator) -> LinearScorer:
    return LinearScorer(
        weights=np.hstack([est.coef_, est.difficulty_coef_[:, None]]), bias=est.intercept_,
        difficulty_bias=est.difficulty_intercept_, slopes=est.slopes_,
    )


def _fit_scorer(X, Y: np.ndarray, n_suites: int, seed: int, estimator: str):
    """The fitted scorer, out-of-fold logits of the training requests and estimator metrics."""
    if estimator == "lightgbm":
        est = LightGBMPassEstimator(seed=seed).fit(X, Y)
        scorer = TreeScorer(est.model_strings(), est.n_features_in_)
        return scorer, est.out_of_fold_logits(), {"estimator": "lightgbm"}
    lin = LinearPassEstimator(n_suites=n_suites, seed=seed).fit(X, Y)
    return _scorer(lin), lin.out_of_fold_logits(), {"difficulty_C": lin.C_}


def _fit(data: RoutingData, seed: int, quality_target: float, embeddings: bool = False,
         estimator: str = "linear") -> RoutingPolicy:
    """Fit on all requests; calibrate and build tables from out-of-fold predictions."""
    spec = fit_feature_spec(data.prompts, data.suites, embeddings=embeddings)
    X = design_matrix(data.prompts, data.suites, spec)
    scorer, z, est_metrics = _fit_scorer(X, data.Y, len(spec.suites), seed, estimator)
    platt = np.array([fit_platt(z[:, j], data.Y[:, j]) for j in range(len(data.candidates))]).T
    cost_model = fit_cost_model(
        np.array([len(p) for p in data.prompts]), _suite_pos(data.suites, spec.suites),
        data.C, len(spec.suites),
    )
    rates = np.nanmean(data.Y, axis=0)
    ref = int(np.nanargmax(np.nan_to_num(rates, nan=-1.0)))
    policy = RoutingPolicy(
        candidates=list(data.candidates), spec=spec, scorer=scorer, platt=platt,
        cost_model=cost_model, rule="lambda", table=[(0.0, 0.0)],
        reference_pass_rate=float(rates[ref]), reference_model=data.candidates[ref],
        quality_target=quality_target,
    )
    P = _sigmoid(platt[0] * z + platt[1])
    Cp = cost_model.predict(np.array([len(p) for p in data.prompts]), _suite_pos(data.suites, spec.suites))
    policy.rule, rule_scores = pick_rule(P, Cp, data)
    policy.table = build_table(P, Cp, policy.rule, data.Y)
    policy.metrics = {
        "rule_selection": rule_scores, **est_metrics,
        "floor_out_of_fold": floor_confidence(policy, data, quality_target, P, Cp),
    }
    return policy


def train_router(
    frame: pd.DataFrame,
    *,
    quality_target: float = 0.95,
    prices: dict[str, dict] | None = None,
    holdout_fraction: float = 0.3,
    seed: int = 0,
    embeddings: bool = False,
    estimator: str = "linear",
) -> TrainResult:
    """Fit a RoutingPolicy on an outcome frame; metrics come from the held-out requests.

    `embeddings=True` adds MiniLM sentence embeddings to the features (the 'embeddings' extra;
    a gateway serving such a policy then needs torch, and each decision costs milliseconds).
    `estimator="lightgbm"` scores with one LightGBM model per candidate instead of the linear
    difficulty model (a gateway serving it then needs lightgbm).
    """
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if not 0 <= holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    if not math.isfinite(quality_target) or quality_target < 0:
        raise ValueError(f"quality_target must be a non-negative number, got {quality_target}")
    data = routing_data(frame, prices)
    if len(data) < 4:
        raise ValueError(f"need outcomes for at least 4 requests to train a router, got {len(data)}")
    parts = split_requests(data, holdout_fraction, seed)
    train, test = data.subset(parts["train"]), data.subset(parts["test"])
    policy = _fit(train, seed, quality_target, embeddings, estimator)
    metrics: dict = {"n_requests": len(data), "n_train": len(train), "n_test": len(test),
                     "candidates": list(data.candidates), "rule": policy.rule, **policy.metrics}
    no_cost = [c for j, c in enumerate(data.candidates) if np.isnan(data.C[:, j]).all()]
    if no_cost:
        metrics["candidates_without_cost"] = no_cost
    if len(test) and len(test.complete()):
        metrics["floor_test"] = floor_confidence(policy, test, quality_target)
        metrics["holdout"] = _holdout_summary(policy, train, test, quality_target)
    policy.metrics = jsonable(metrics)
    split = {k: [data.request_ids[i] for i in v] for k, v in parts.items()}
    split["calib"] = list(split["train"])  # calibrated on out-of-fold predictions of train
    return TrainResult(policy=policy, metrics=policy.metrics, split=split)


def _holdout_summary(policy: RoutingPolicy, train: RoutingData, test: RoutingData, target: float) -> dict:
    report = evaluate(policy, train, test)
    full = test.align(policy.candidates).complete()
    P, Cp = policy.predict(full.prompts, full.suites)
    q, c = outcomes_of(choose(P, Cp, policy.rule, policy.param_for(target))[:, 0], full)
    report.pop("curves")
    report["router_at_target"] = {"target": target, "pass_rate": q, "cost": c}
    return report
