"""Train a routing policy from outcomes: fit, calibrate, build the knob, measure on held-out data.

Requests (not rows) are split, per suite, into train and held-out test. The estimator learns on
all of train; Platt scaling and the quality knob (routeopt.router_training.fit.knob_fitting) are fitted on
out-of-fold predictions of train (cross-fitting: no data is spent on a separate calibration
set); the test requests are touched only to report metrics, among them how often the knob's
promise held there. Then (`refit`, the default) the same procedure runs again on every request
and that policy is the one published: the held-out figures describe the procedure on requests
it has not seen, and the published policy learns from, and certifies its knob on, 1 / (1 -
holdout) times as many requests (chosen by CV on the training splits of the shared sets).
The estimator is the linear difficulty model by default; `estimator="lightgbm"` fits one
LightGBM booster per candidate on the same features and calibrates it the same way (Platt on
out-of-fold raw scores).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Any, Callable

import numpy as np
import pandas as pd

from routeopt.common.io import jsonable
from routeopt.router_training.evaluation.baselines import evaluate, outcomes_of
from routeopt.router_training.evaluation.bench import budget_outcomes
from routeopt.router_training.fit.data import RoutingData, release_free_memory, routing_data
from routeopt.router_training.policy.batch_features import concurrently, reuse_text_layers
from routeopt.router_training.policy.embeddings import reuse_embeddings
from routeopt.router_training.fit.estimators import (
    LightGBMPassEstimator,
    LinearPassEstimator,
    design_matrix,
    fit_cost_model,
    fit_feature_spec,
    fit_platt,
)
from routeopt.router_training.fit.certificate import Certificate
from routeopt.router_training.fit.bounds import Assumption
from routeopt.router_training.policy.features import FeatureSpec, n_chars as text_length
from routeopt.router_training.fit.latency_fitting import DEFAULT_ALPHA, DEFAULT_MARGIN, latency_policy
from routeopt.router_training.fit.knob_fitting import (
    DEFAULT_CONFIDENCE,
    STANDARD_TARGETS,
    Calibration,
    build_knob,
)
from routeopt.router_training.live.shift_monitor import reference_sketch
from routeopt.router_training.policy.numerics import sigmoid
from routeopt.router_training.policy.routing import CostModel, LinearScorer, RoutingPolicy
from routeopt.router_training.policy.trees import TreeScorer


ESTIMATORS = ("linear", "lightgbm")


def single_threaded(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Run `fn` with every BLAS/OpenMP pool at one thread. Router training is many small
    solves (Newton steps over a few thousand rows); on a machine that is busy with anything else,
    BLAS threads spin against each other: a nightly's training on 1,350 demo requests took
    324 s instead of 13 s on 2 shared cores. One thread loses nothing on an idle machine."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        from threadpoolctl import threadpool_limits

        with threadpool_limits(limits=1):
            return fn(*args, **kwargs)

    return wrapper


@dataclass(frozen=True)
class Design:
    """Modelling choices, chosen by cross-validation on the visible sets' training splits
    (`benchmarks/router_design_cv.py`); the defaults are the chosen ones."""

    topics: int = 4  # k-means topics of the text, each with its own per-candidate prior and slope
    topic_rank: int = (
        8  # dimensions of the text projection topics are found in (weight columns a gateway sums)
    )
    candidate_text: float = 1.0  # scale of each candidate's own text weights over its head (0: none)
    char_ngrams: int = 0  # hashed character n-grams of this length besides words and bigrams (0: none)
    n_folds: int = 3  # cross-fitting folds for calibration
    deploy: str = "average"  # the served model: the mean of the fold models, or "refit" on all rows
    split: float = (
        0.5  # every target certified on requests the hull was not chosen on (this share chooses it)
    )
    above_one: str = (
        "split"  # with split 0: beating the reference certified on a half the hull was not chosen on
    )
    budget_margin: float = (
        DEFAULT_MARGIN  # how much surer a budget mask's widening must look (inf: masks at the budget)
    )
    budget_open_mask: bool = False  # a budget's mask may also open to every candidate (else up to 2x)


@dataclass
class TrainResult:
    """`policy` is the one to publish; `evaluated` the one fitted without the held-out requests
    (`split["test"]`), which the held-out metrics describe. They are the same policy when
    training does not refit."""

    policy: RoutingPolicy
    metrics: dict
    split: dict[str, list[str]]
    evaluated: RoutingPolicy | None = None

    def __post_init__(self) -> None:
        if self.evaluated is None:
            self.evaluated = self.policy


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


def _scorer(est: LinearPassEstimator) -> LinearScorer:
    """The gateway's scorer. Its weight matrix is rounded to float32 here, as format 3 publishes
    it (half the bytes of float64), so the policy measured in-process is the one gateways run."""
    topics = len(est.centroids_) > 0
    text = np.zeros((est.coef_.shape[0], est.cluster_basis_.shape[1]))
    text[est.n_suites : est.n_suites + est.n_buckets] = est.cluster_basis_
    return LinearScorer(
        weights=np.hstack([est.coef_, est.difficulty_coef_[:, None], text]).astype(np.float32),
        bias=est.intercept_,
        difficulty_bias=est.difficulty_intercept_,
        slopes=est.slopes_,
        centroids=est.centroids_ if topics else None,
        topic_bias=est.cluster_bias_ if topics else None,
        topic_slopes=est.cluster_slopes_ if topics else None,
        topic_difficulty=est.topic_difficulty_ if topics else None,
    )


def _fit_scorer(
    X, Y: np.ndarray, spec: FeatureSpec, seed: int, estimator: str, design: Design, client: Any = None
):
    """The fitted scorer, out-of-fold logits, folds and topics of the training requests, and metrics."""
    if estimator == "lightgbm":
        est = LightGBMPassEstimator(seed=seed, client=client).fit(X, Y)
        scorer = TreeScorer.from_models(est.model_strings(), est.n_features_in_)
        return scorer, est.out_of_fold_logits(), est.folds_, np.full(len(Y), -1), {"estimator": "lightgbm"}
    lin = LinearPassEstimator(
        n_suites=len(spec.suites),
        seed=seed,
        n_folds=design.n_folds,
        n_clusters=design.topics,
        cluster_rank=design.topic_rank,
        n_buckets=spec.n_buckets,
        candidate_text=design.candidate_text,
        deploy=design.deploy,
    ).fit(X, Y)
    return _scorer(lin), lin.out_of_fold_logits(), lin.folds_, lin.topics(X), {"difficulty_C": lin.C_}


@dataclass
class Calibrated:
    """A fitted scorer and cost model with the cross-fitted calibration data of its requests."""

    spec: FeatureSpec
    scorer: LinearScorer | TreeScorer
    platt: np.ndarray
    cost_model: CostModel
    cal: Calibration
    folds: np.ndarray  # each request's cross-fitting fold: its calibration row comes from the others
    rates: np.ndarray  # each candidate's pass rate on these requests
    metrics: dict

    @property
    def ref(self) -> int:
        """The best single candidate on these requests."""
        return int(np.nanargmax(np.nan_to_num(self.rates, nan=-1.0)))


@single_threaded
def fit_calibrated(
    data: RoutingData,
    seed: int = 0,
    embeddings: bool = False,
    estimator: str = "linear",
    design: Design = Design(),
    client: Any = None,
) -> Calibrated:
    """Fit on all requests; out-of-fold predictions, Platt-scaled, are the calibration data."""
    spec = fit_feature_spec(
        data.prompts,
        data.suites,
        embeddings=embeddings,
        char_ngrams=(design.char_ngrams,) if design.char_ngrams else (),
    )
    X = design_matrix(data.prompts, data.suites, spec)
    release_free_memory()  # what the feature threads freed: not kept under the fits' peak
    scorer, z, folds, topic, est_metrics = _fit_scorer(X, data.Y, spec, seed, estimator, design, client)
    platt = np.array([fit_platt(z[:, j], data.Y[:, j]) for j in range(len(data.candidates))]).T
    suite_pos = _suite_pos(data.suites, spec.suites)
    n_chars = np.array([text_length(p) for p in data.prompts])
    n_topics = len(scorer.centroids) if getattr(scorer, "centroids", None) is not None else 0
    cost_model = fit_cost_model(
        n_chars, suite_pos, data.C, len(spec.suites), topic_pos=topic, n_topics=n_topics
    )
    rates = np.nanmean(data.Y, axis=0)
    P = sigmoid(platt[0] * z + platt[1])
    cal = Calibration(P, cost_model.predict(n_chars, suite_pos, topic), data.Y, data.C)
    return Calibrated(spec, scorer, platt, cost_model, cal, folds, rates, est_metrics)


def _fit(
    data: RoutingData,
    seed: int,
    quality_target: float,
    embeddings: bool = False,
    estimator: str = "linear",
    confidence: float = DEFAULT_CONFIDENCE,
    design: Design = Design(),
    certificate: Certificate = Certificate(),
    client: Any = None,
    latency_alpha: float = DEFAULT_ALPHA,
) -> RoutingPolicy:
    """Fit on all requests; calibrate and build the knob from out-of-fold predictions, certified
    under what `certificate` assumes of the traffic; where the outcomes measured latency, the
    latency model and the budgets certified to keep `latency_alpha`."""
    f = fit_calibrated(data, seed, embeddings, estimator, design, client)
    return _policy(f, data, quality_target, confidence, design, certificate, latency_alpha)


def _policy(
    f: Calibrated,
    data: RoutingData,
    quality_target: float,
    confidence: float,
    design: Design,
    certificate: Certificate,
    latency_alpha: float,
) -> RoutingPolicy:
    """The policy of a fitted scorer: its knob, latency budgets and shift reference."""
    policy = RoutingPolicy(
        candidates=list(data.candidates),
        spec=f.spec,
        scorer=f.scorer,
        platt=f.platt,
        cost_model=f.cost_model,
        knob=None,
        reference_pass_rate=math.nan,  # type: ignore[arg-type]
        reference_model="",
        quality_target=quality_target,
    )
    basis = certificate.basis(f, data, policy)
    ref = basis.reference(f.cal.Y, confidence)
    policy.knob = build_knob(
        f.cal,
        ref,
        confidence,
        design.above_one,
        split=design.split,
        assumption=basis.assumption,
        weights=basis.weights,
        cells=basis.cells,
    )
    policy.reference_model = data.candidates[ref]
    policy.reference_pass_rate = (
        float(f.rates[ref]) if basis.weights is None else basis.reference_rate(f.cal.Y, ref)
    )
    latency_metrics = None
    if data.latency:
        policy.latency, latency_metrics = latency_policy(
            f.cal,
            ref,
            np.array([text_length(p) for p in data.prompts]),
            _suite_pos(data.suites, f.spec.suites),
            data.latency,
            len(f.spec.suites),
            f.folds,
            confidence,
            quality_target,
            latency_alpha,
            basis.assumption,
            basis.weights,
            basis.cells,
            design.budget_margin,
            design.budget_open_mask,
        )
    policy.metrics = {
        **f.metrics,
        "knob": knob_summary(policy, basis.assumption, design.split),
        "shift_reference": shift_reference(policy, f.cal, data),
    }
    if latency_metrics is not None:
        policy.metrics["latency"] = latency_metrics
    return policy


def shift_reference(policy: RoutingPolicy, cal: Calibration, data: RoutingData) -> dict:
    """The shift monitor's sketch of the calibration requests (`routeopt.router_training.live.shift_monitor`): their
    suites, lengths and the models the knob chose for them, out of fold, at each standard target."""
    names = np.array(policy.candidates, dtype=object)
    routes = {
        x: names[policy.select(cal.P, cal.Cp, data.prompts, data.suites, x)[0]].tolist()
        for x in STANDARD_TARGETS
    }
    return reference_sketch(data.suites, np.array([text_length(p) for p in data.prompts]), routes)


def knob_summary(policy: RoutingPolicy, assumption: Assumption = Assumption(), split: float = 0.0) -> dict:
    """What the manifest says about the knob: method, what the certificate assumes of the
    traffic, confidence and the certified range."""
    knob = policy.knob
    chosen = (
        f"the hull chosen on a fixed random {split:.0%} of them and certified on the others"
        if split > 0
        else "the hull chosen on all of them (targets of 1 and more: on a random half, "
        "certified on the other half)"
    )
    return {
        "method": "fixed-sequence Learn-then-Test on cross-fitted calibration data, "
        + chosen
        + ": a point is certified for target x when the one-sided normal lower bound of "
        "mean(y_chosen - x * y_reference) is >= 0",
        "certificate": assumption.to_dict(),
        "confidence": knob.confidence,
        "certified_up_to": knob.certified_up_to(),
        "reference": {"model": policy.reference_model, "pass_rate": policy.reference_pass_rate},
        "points": [
            {"certified": p.certified, "pass_rate": p.pass_rate, "cost": p.cost, "mix": p.weight < 1}
            for p in knob.points
        ],
        "top": {"pass_rate": knob.top.pass_rate, "cost": knob.top.cost},
    }


@single_threaded
def train_router(
    frame: pd.DataFrame,
    *,
    quality_target: float = 0.95,
    prices: dict[str, dict] | None = None,
    holdout_fraction: float = 0.3,
    seed: int = 0,
    embeddings: bool = False,
    estimator: str = "linear",
    confidence: float = DEFAULT_CONFIDENCE,
    design: Design = Design(),
    refit: bool = True,
    certificate: Certificate = Certificate(),
    client: Any = None,
    latency_alpha: float = DEFAULT_ALPHA,
    default_budgets: dict[str, tuple[str, float]] | None = None,
) -> TrainResult:
    """Fit a RoutingPolicy on an outcome frame; metrics come from the held-out requests.

    With `refit` (and a held-out split) the returned policy is fitted again on every request
    once the held-out metrics are taken; `TrainResult.evaluated` is the policy they describe.
    `confidence` is how sure the knob must be that a point keeps its target on new requests.
    `embeddings=True` adds MiniLM sentence embeddings to the features (the 'embeddings' extra;
    a gateway serving such a policy then needs torch, and each decision costs milliseconds).
    `estimator="lightgbm"` scores with one LightGBM model per candidate instead of the linear
    model (a gateway serving it then needs lightgbm). `certificate` says what the knob's
    certificate assumes of the traffic (`routeopt.router_training.fit.certificate`): like the calibration
    requests (the default), toward an unlabelled traffic sample, or robust to a stated shift.
    `client` (a `dask.distributed.Client`, with `estimator="lightgbm"`) trains the boosters on
    that cluster's workers through LightGBM's Dask interface. Where the outcomes measured TTFT
    or latency (`ttft_s`, `latency_s`), the policy also serves latency budgets, each certified
    to keep the share of requests over budget at or below `latency_alpha`
    (`routeopt.router_training.fit.latency_fitting`). `default_budgets` ({suite or "*": (kind,
    seconds)}) is the budget a request naming none gets, where the policy has that kind's model.
    """
    if not 0 < latency_alpha < 1:
        raise ValueError(f"latency_alpha must be in (0, 1), got {latency_alpha}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {ESTIMATORS}, got {estimator!r}")
    if client is not None and estimator != "lightgbm":
        raise ValueError("a Dask client trains the lightgbm estimator only; pass estimator='lightgbm'")
    if not 0 <= holdout_fraction < 1:
        raise ValueError(f"holdout_fraction must be in [0, 1), got {holdout_fraction}")
    if not math.isfinite(quality_target) or quality_target < 0:
        raise ValueError(f"quality_target must be a non-negative number, got {quality_target}")
    if not 0.5 <= confidence < 1:
        raise ValueError(f"confidence must be in [0.5, 1), got {confidence}")
    data = routing_data(frame, prices)
    if len(data) < 4:
        raise ValueError(f"need outcomes for at least 4 requests to train a router, got {len(data)}")
    parts = split_requests(data, holdout_fraction, seed)
    train, test = data.subset(parts["train"]), data.subset(parts["test"])
    # each prompt is encoded (with embeddings) and its text steps computed once for all three steps
    refit = refit and len(test) > 0
    with reuse_embeddings(), reuse_text_layers(data.prompts):
        fitted = fit_calibrated(train, seed, embeddings, estimator, design, client)
        release_free_memory()

        def evaluate() -> tuple[RoutingPolicy, dict | None]:
            evaluated = _policy(fitted, train, quality_target, confidence, design, certificate, latency_alpha)
            if not len(test) or not len(test.complete()):
                return evaluated, None
            return evaluated, _holdout_summary(evaluated, train, test, quality_target)

        def fit_all() -> RoutingPolicy:
            return _fit(
                data,
                seed,
                quality_target,
                embeddings,
                estimator,
                confidence,
                design,
                certificate,
                client,
                latency_alpha,
            )

        if refit:  # the held-out measurement runs while the refit does, on the cores it leaves
            text = sum(len(p) for p in data.prompts)  # what both jobs' text steps stream over
            measured, policy = concurrently(lambda job: job(), [evaluate, fit_all], text)
            evaluated, holdout = measured
        else:
            evaluated, holdout = evaluate()
            policy = evaluated
    metrics: dict = {
        "n_requests": len(data),
        "n_train": len(train),
        "n_test": len(test),
        "refit": refit,
        "n_fit": len(data) if refit else len(train),
        "candidates": list(data.candidates),
        **policy.metrics,
    }
    no_cost = [c for j, c in enumerate(data.candidates) if np.isnan(data.C[:, j]).all()]
    if no_cost:
        metrics["candidates_without_cost"] = no_cost
    reuse = reuse_counts(frame, {data.request_ids[i] for i in parts["test"]})
    if reuse is not None:
        metrics["reuse"] = reuse
    if holdout is not None:
        metrics["holdout"] = holdout
        if reuse is not None:
            holdout["reused_rows"] = {"rows": reuse["held_out_rows"], "of": reuse["held_out_of"]}
        if refit:
            metrics["holdout"]["policy"] = (
                f"fitted on the {len(train)} training requests only; the "
                f"published policy is the same procedure refit on all {len(data)}"
            )
    if default_budgets:
        metrics["default_budgets"] = _set_defaults(policy, default_budgets)
    policy.metrics = jsonable(metrics)
    split = {k: [data.request_ids[i] for i in v] for k, v in parts.items()}
    # the published policy is calibrated on out-of-fold predictions of every request it learned from
    split["calib"] = list(data.request_ids) if refit else list(split["train"])
    return TrainResult(policy=policy, metrics=policy.metrics, split=split, evaluated=evaluated)


def reuse_counts(frame: pd.DataFrame, held_out: set[str]) -> dict | None:
    """How many outcome rows were carried forward from earlier nights (`call_mode` 'carried'),
    in all and among the held-out requests, and how old they are: what the certificate and the
    held-out figures rest on. None when no row was carried."""
    if "call_mode" not in frame.columns:
        return None
    carried = (frame["call_mode"] == "carried").to_numpy()
    if not carried.any():
        return None
    held = frame["request_id"].astype(str).isin(held_out).to_numpy()
    out: dict = {
        "rows": int(carried.sum()),
        "of": len(frame),
        "held_out_rows": int((carried & held).sum()),
        "held_out_of": int(held.sum()),
    }
    if "measured_at" in frame.columns:
        measured = pd.to_datetime(frame["measured_at"], utc=True)
        age = (measured.max() - measured[carried]).dt.total_seconds() / 86400.0
        out["age_days"] = {"median": float(age.median()), "max": float(age.max())}
    return out


def promise_report(
    policy: RoutingPolicy,
    test: RoutingData,
    targets: tuple[float, ...],
    predicted: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """At each target, the pass rate and cost on held-out requests, and whether the promise
    (pass rate >= target x the reference's pass rate on the same requests) held there.

    A few hundred held-out requests move a pass rate by several points, so a point that keeps
    its promise can still land below it here. `contradicted` says when the held-out requests
    are evidence that it did not: the upper confidence bound (the knob's confidence) of the
    paired margin mean(y_chosen - x * y_reference) is below 0. `predicted` is the policy's
    (P, Cp) on the complete test requests, where the caller has them.
    """
    full = test.align(policy.candidates).complete()
    if not len(full):
        return {"n": 0, "targets": []}
    P, Cp = policy.predict(full.prompts, full.suites) if predicted is None else predicted
    y_ref = full.Y[:, policy.candidates.index(policy.reference_model)]
    ref_rate = float(np.mean(y_ref))
    confidence = policy.knob.confidence if math.isfinite(policy.knob.confidence) else DEFAULT_CONFIDENCE
    z = NormalDist().inv_cdf(confidence)
    rows = []
    for x in targets:
        pick = policy.select(P, Cp, full.prompts, full.suites, x)[0]
        q, c = outcomes_of(pick, full)
        margin = full.Y[np.arange(len(full)), pick] - x * y_ref
        se = float(margin.std(ddof=1) / math.sqrt(len(full))) if len(full) > 1 else math.inf
        certified = bool(x <= policy.knob.certified_up_to() + 1e-12)
        rows.append(
            {
                "target": x,
                "floor": x * ref_rate,
                "pass_rate": q,
                "cost": c,
                "certified": certified,
                "held": bool(q >= x * ref_rate - 1e-12),
                "margin": float(margin.mean()),
                "margin_se": se,
                "contradicted": bool(certified and margin.mean() + z * se < 0),
            }
        )
    promised = [r for r in rows if r["certified"]]
    return {
        "n": len(full),
        "reference_pass_rate": ref_rate,
        "confidence": confidence,
        "targets": rows,
        "held": sum(r["held"] for r in promised),
        "promised": len(promised),
        "contradicted": sum(r["contradicted"] for r in promised),
    }


def _holdout_summary(policy: RoutingPolicy, train: RoutingData, test: RoutingData, target: float) -> dict:
    full = test.align(policy.candidates).complete()
    predicted = policy.predict(full.prompts, full.suites)  # both reports route the same requests
    report = evaluate(policy, train, test, predicted=predicted)
    report.pop("curves")
    promise = promise_report(policy, test, tuple(sorted({*STANDARD_TARGETS, target})), predicted)
    at = next(r for r in promise["targets"] if r["target"] == target)
    report["router_at_target"] = {"target": target, "pass_rate": at["pass_rate"], "cost": at["cost"]}
    report["promise"] = promise
    if policy.latency is not None and test.latency:
        report["latency"] = budget_report(policy, test, tuple(sorted({target, 0.9})))
    return report


def budget_report(policy: RoutingPolicy, test: RoutingData, targets: tuple[float, ...]) -> dict:
    """Per kind, budget and target, on held-out requests: the pass rate, the cost, the share of
    requests whose measured seconds exceeded the budget (over those measured) beside the
    certified `alpha`, and whether the quality promise held."""
    assert policy.latency is not None
    full = test.align(policy.candidates).complete()
    if not len(full):
        return {"n": 0, "rows": []}
    ref_rate = float(np.mean(full.Y[:, policy.candidates.index(policy.reference_model)]))
    out = []
    for kind, budget, x, certified, q, c, measured in budget_outcomes(policy, full, targets):
        over = float(np.mean(measured > budget)) if len(measured) else math.nan
        out.append(
            {
                "kind": kind,
                "budget_s": budget,
                "target": x,
                "certified": certified,
                "pass_rate": q,
                "cost": c,
                "over_budget": over,
                "measured": len(measured),
                "held": bool(certified and q >= x * ref_rate - 1e-12 and over <= policy.latency.alpha),
            }
        )
    promised = [r for r in out if r["certified"]]
    return {
        "n": len(full),
        "alpha": policy.latency.alpha,
        "rows": out,
        "promised": len(promised),
        "held": sum(r["held"] for r in promised),
    }


def _set_defaults(policy: RoutingPolicy, wanted: dict[str, tuple[str, float]]) -> dict:
    """Give the policy the default budgets its latency models can serve; say which were left out."""
    lat = policy.latency
    kept = {s: (k, float(b)) for s, (k, b) in wanted.items() if lat is not None and k in lat.model.kinds}
    if lat is not None:
        lat.defaults = kept
        lat.__post_init__()
    left = sorted(set(wanted) - set(kept))
    return {
        "set": {s: [k, b] for s, (k, b) in kept.items()},
        "left_out": {s: f"no {wanted[s][0]} model (too few latency measurements)" for s in left},
    }
