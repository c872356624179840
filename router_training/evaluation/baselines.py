"""The router and its baselines traced on the same held-out requests, side by side.

Baselines: best single candidate (best on training data), zero router (random mixes of single
candidates: the hull of their points), per-suite router and the oracle. Every score-based
router shares the policy's cost model and decision rule, so differences come from the
pass-probability estimates alone. Baselines that compare each held-out request with every
training one (nearest neighbours) grow with their product: they belong to a benchmark, not to
training (`routeopt bench router` has the reference router).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from routeopt.router_training.evaluation import metrics as M
from routeopt.router_training.fit.data import RoutingData
from routeopt.router_training.fit.estimators import PerSuitePassEstimator
from routeopt.router_training.policy.features import FeatureSpec
from routeopt.router_training.policy.routing import RoutingPolicy, choose


@dataclass
class Curve:
    """Operating points of one router on test data: mean cost per request and pass rate."""

    name: str
    costs: np.ndarray
    quality: np.ndarray


def param_grid(rule: str, C: np.ndarray) -> np.ndarray:
    """Rule parameters dense enough to trace a full curve, from 'max quality' to 'cheapest'."""
    if rule == "threshold":
        return np.concatenate((np.linspace(0.0, 1.0, 401), [1.01]))
    scale = float(np.nanmean(C)) or 1.0
    return np.concatenate(([0.0], np.geomspace(1e-4, 1e6, 500) / scale))


def outcomes_of(choice: np.ndarray, data: RoutingData) -> tuple[float, float]:
    """Test pass rate and mean cost per request of one choice per request."""
    rows = np.arange(len(data))
    return float(np.mean(data.Y[rows, choice])), float(np.mean(data.C[rows, choice]))


def sweep(name: str, P: np.ndarray, Cp: np.ndarray, data: RoutingData, rule: str) -> Curve:
    """Trace a score-based router over its rule parameter."""
    points = [outcomes_of(choose(P, Cp, rule, t)[:, 0], data) for t in param_grid(rule, Cp)]
    q, c = np.array(points).T
    return Curve(name, c, q)


def summarise(curve: Curve, ref_quality: float, ref_cost: float, cost_range: tuple[float, float]) -> dict:
    """Savings at the best single's quality and at 95% of it, and AIQ."""
    hc, hq = M.frontier(curve.costs, curve.quality)
    row = {
        "savings_at_best": M.savings(hc, hq, ref_quality, ref_cost),
        "savings_at_95": M.savings(hc, hq, 0.95 * ref_quality, ref_cost),
        "aiq": M.aiq(hc, hq, *cost_range),
        "max_quality": float(hq.max()) if len(hq) else math.nan,
    }
    return row


def _train_rates(train: RoutingData) -> tuple[np.ndarray, np.ndarray]:
    return np.nanmean(train.Y, axis=0), np.nanmean(train.C, axis=0)


def evaluate(
    policy: RoutingPolicy,
    train: RoutingData,
    test: RoutingData,
    targets: tuple[float, ...] = (0.0, 0.2, 0.4, 0.6, 0.8, 0.9, 0.93, 0.95, 0.97, 0.98, 0.99, 1.0, 1.05, 1.1),
    predicted: tuple[np.ndarray, np.ndarray] | None = None,
) -> dict:
    """Every router's curve and summary on complete test requests; JSON-serialisable.

    The router's curve is what its knob realises at `targets`; the per-suite baseline is swept
    over lambda on the test requests (an upper bound of what a knob could reach). `predicted`
    is the policy's (P, Cp) on those complete test requests, where the caller has them.
    """
    test = test.align(policy.candidates).complete()
    train = train.align(policy.candidates)
    if len(test) == 0:
        raise ValueError("no test request has outcomes for every candidate: cannot evaluate")
    spec = policy.spec
    P, Cp = policy.predict(test.prompts, test.suites) if predicted is None else predicted
    scored = {
        "per_suite": PerSuitePassEstimator(n_suites=len(spec.suites))
        .fit(_suite_columns(train.suites, spec), train.Y)
        .predict_proba(_suite_columns(test.suites, spec)),
    }
    rate, mean_cost = _train_rates(train)
    best, cheapest = int(np.nanargmax(rate)), int(np.nanargmin(mean_cost))
    singles = [outcomes_of(np.full(len(test), j), test) for j in range(len(policy.candidates))]
    sq, sc = np.array(singles).T
    oracle_q, oracle_c = outcomes_of(M.oracle_choice(test.Y, test.C), test)
    knob = [outcomes_of(policy.select(P, Cp, test.prompts, test.suites, x)[0], test) for x in targets]
    kq, kc = np.array(knob).T
    curves = [Curve("router", kc, kq)]
    curves += [sweep(name, p, Cp, test, "lambda") for name, p in scored.items()]
    curves += [
        Curve("zero_router", sc, sq),
        Curve("best_single", sc[best : best + 1], sq[best : best + 1]),
        Curve("oracle", np.array([oracle_c]), np.array([oracle_q])),
    ]
    cost_range = (float(sc.min()), float(sc.max()))
    table = {c.name: summarise(c, sq[best], sc[best], cost_range) for c in curves}
    return {
        "n_test_requests": len(test),
        "best_single": {"model": policy.candidates[best], "pass_rate": sq[best], "cost": sc[best]},
        "cheapest_single": {
            "model": policy.candidates[cheapest],
            "pass_rate": sq[cheapest],
            "cost": sc[cheapest],
        },
        "oracle": {"pass_rate": oracle_q, "cost": oracle_c},
        "per_candidate": {
            m: {"pass_rate": float(q), "cost": float(c)} for m, q, c in zip(policy.candidates, sq, sc)
        },
        "table": table,
        "curves": {c.name: {"cost": c.costs.tolist(), "quality": c.quality.tolist()} for c in curves},
    }


def _suite_columns(suites: list[str | None], spec: FeatureSpec) -> sp.csr_matrix:
    """The suite one-hot columns the design starts with, the only ones the per-suite baseline
    reads, without building the rest of the requests' design."""
    pos = np.array([spec.suite_position(s) for s in suites], dtype=np.int64)
    has = np.flatnonzero(pos >= 0)
    return sp.csr_matrix((np.ones(len(has)), (has, pos[has])), shape=(len(suites), len(spec.suites)))


def knob_lambda_grid(costs: np.ndarray) -> np.ndarray:
    """Lambdas from 'best quality' (0) to 'always the cheapest', scaled to the mean cost."""
    scale = float(np.nanmean(costs)) or 1.0
    return np.concatenate(([0.0], np.geomspace(1e-3, 1e5, 400) / scale))


def realised(choice: np.ndarray, Y: np.ndarray, C: np.ndarray) -> tuple[float, float]:
    """Mean outcome and mean cost of one choice per request, skipping unobserved pairs."""
    rows = np.arange(len(choice))
    y, c = Y[rows, choice], C[rows, choice]
    ok = ~np.isnan(y)
    return (
        float(np.mean(y[ok])) if ok.any() else math.nan,
        float(np.nanmean(c)) if (~np.isnan(c)).any() else math.nan,
    )


class ReferenceRouter:
    """The plain reference router the knob is benchmarked against: suite one-hot + TF-IDF logistic regression per candidate,
    `argmax p - lambda * cost` with each candidate's mean training cost, and for each quality
    target the cheapest lambda whose 5-fold out-of-fold pass rate on the training requests
    reaches target x best single's training pass rate (no test data, no confidence margin).
    """

    def __init__(self, C: float = 1.0, n_folds: int = 5, seed: int = 0) -> None:
        self.C = C
        self.n_folds = n_folds
        self.seed = seed

    def _features(self, prompts: list[str], suites: list[str | None]):
        import scipy.sparse as sp

        pos = {s: i for i, s in enumerate(self.suites_)}
        cols = [pos.get(s, -1) for s in suites]
        rows = [i for i, c in enumerate(cols) if c >= 0]
        onehot = sp.csr_matrix(
            (np.ones(len(rows)), (rows, [cols[i] for i in rows])), shape=(len(prompts), len(self.suites_))
        )
        return sp.hstack([onehot, self.vectorizer_.transform(prompts)]).tocsr()

    def _fit_models(self, X, Y: np.ndarray) -> list:
        """One logistic regression per candidate; fractional outcomes become weighted 0/1 rows."""
        import scipy.sparse as sp
        from sklearn.linear_model import LogisticRegression

        models: list = []
        for j in range(Y.shape[1]):
            ok = ~np.isnan(Y[:, j])
            y = Y[ok, j]
            if len(y) == 0 or np.ptp(y) < 1e-12 or not ((y > 0).any() and (y < 1).any()):
                models.append(float(y.mean()) if len(y) else 0.5)
                continue
            Xj = X[ok]
            lr = LogisticRegression(C=self.C, max_iter=1000)
            lr.fit(
                sp.vstack([Xj, Xj]), np.r_[np.ones(len(y)), np.zeros(len(y))], sample_weight=np.r_[y, 1.0 - y]
            )
            models.append(lr)
        return models

    @staticmethod
    def _proba(models: list, X) -> np.ndarray:
        return np.column_stack(
            [np.full(X.shape[0], m) if isinstance(m, float) else m.predict_proba(X)[:, 1] for m in models]
        )

    def fit(self, train: RoutingData) -> "ReferenceRouter":
        from sklearn.feature_extraction.text import TfidfVectorizer

        self.suites_ = sorted({s for s in train.suites if s})
        self.vectorizer_ = TfidfVectorizer(sublinear_tf=True, min_df=2).fit(train.prompts)
        X = self._features(train.prompts, train.suites)
        self.models_ = self._fit_models(X, train.Y)
        self.costs_ = np.nan_to_num(np.nanmean(train.C, axis=0), nan=0.0)
        folds = np.random.default_rng(self.seed).permutation(len(train)) % self.n_folds
        P = np.zeros(train.Y.shape)
        for f in range(self.n_folds):
            te = folds == f
            P[te] = self._proba(self._fit_models(X[~te], train.Y[~te]), X[te])
        self.lambdas_ = knob_lambda_grid(self.costs_)
        points = [realised(self._argmax(P, lam), train.Y, train.C) for lam in self.lambdas_]
        self.oof_quality_ = np.array([q for q, _ in points])
        self.reference_rate_ = float(np.nanmax(np.nanmean(train.Y, axis=0)))
        return self

    def _argmax(self, P: np.ndarray, lam: float) -> np.ndarray:
        return choose(P, np.broadcast_to(self.costs_, P.shape), "lambda", lam)[:, 0]

    def lambda_for(self, target: float) -> float:
        """The largest (cheapest) lambda whose out-of-fold pass rate reaches the target, else
        the lambda with the best out-of-fold pass rate."""
        ok = np.flatnonzero(self.oof_quality_ >= target * self.reference_rate_ - 1e-12)
        if len(ok):
            return float(self.lambdas_[ok.max()])
        return float(self.lambdas_[np.nanargmax(self.oof_quality_)])

    def predict_proba(self, prompts: list[str], suites: list[str | None]) -> np.ndarray:
        """Each candidate's predicted pass probability per request (n, K)."""
        return self._proba(self.models_, self._features(prompts, suites))

    def choose(self, prompts: list[str], suites: list[str | None], target: float) -> np.ndarray:
        """The chosen candidate index per request at a quality target."""
        return self._argmax(self.predict_proba(prompts, suites), self.lambda_for(target))
