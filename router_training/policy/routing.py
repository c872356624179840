"""The routing policy a gateway loads: features -> calibrated pass probabilities -> a choice.

Imports numpy and the standard library only, so a gateway can embed it. A router scores, one
shared policy decides (RouteLLM's split): the scorer and cost model
(routeopt.router_training.policy.scorer) give each candidate a pass probability and a cost, and
the quality knob (routeopt.router_training.policy.knob) turns them into a choice. Its files are
read and written by routeopt.router_training.policy.files, its conformance vectors by
routeopt.router_training.policy.conformance.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple, Sequence, cast

import numpy as np

from routeopt.common.io import atomic_write
from routeopt.router_training.policy.batch_features import batch_predict
from routeopt.router_training.policy.conformance import ConformanceReport, build_vectors, self_check
from routeopt.router_training.policy.features import FeatureSpec, feature_layers, n_chars, request_features
from routeopt.router_training.policy.files import (
    VECTORS_NAME,
    format_info,
    read_policy_files,
    write_policy_files,
)
from routeopt.router_training.policy.kernel import Kernel, ScoreTable
from routeopt.router_training.policy.knob import (  # noqa: F401  (Knob and its parts: the policy's vocabulary)
    Knob,
    Member,
    OperatingPoint,
    _finite_or_none,
    choose,
    fallback_order,
    member_choice,
    point_choice,
    row_decision,
    request_unit,
)
from routeopt.router_training.policy.latency import (
    BUDGET_QUANTILE,
    LatencyPolicy,
    budget_mask,
    budget_request,
    serves,
)
from routeopt.router_training.policy.numerics import sigmoid_list
from routeopt.router_training.policy.scorer import CostModel, LinearScorer, assign_clusters  # noqa: F401
from routeopt.router_training.policy.trees import TreeScorer  # noqa: F401  (the LightGBM scorer, as portable trees)


class _Scores(NamedTuple):
    """`Scored` with its numbers as Python floats, and the prompt's code points and suite column."""

    layers: Any
    ids: np.ndarray | None
    vals: np.ndarray | None
    z: list[float]
    topic: int
    p: list[float]
    c: list[float]
    n_chars: int
    suite_pos: int


@dataclass(frozen=True)
class PolicyDecision:
    """The policy's routing decision for one request: the model to call, what to try next, and why."""

    model: str
    fallbacks: tuple[str, ...]
    pass_probabilities: dict[str, float]
    expected_cost_usd: dict[str, float]
    propensity: float = 1.0  # probability that this request gets this model (mixed points < 1)
    budget: "BudgetOutcome | None" = None  # with a latency budget: what it allowed and whether it was met


@dataclass(frozen=True)
class BudgetOutcome:
    """A decision's latency budget: `tier_s` is the certified budget that served it (None when
    the budget is below every certified one) and `mask_s` its mask's seconds, `met` whether the
    chosen model's predicted p95 is within the budget asked for, `predicted_s` each candidate's
    predicted p95."""

    kind: str
    budget_s: float
    tier_s: float | None
    met: bool
    predicted_s: dict[str, float]
    mask_s: float | None = None

    @property
    def limit_s(self) -> float:
        """What live latency holds a candidate's slowed prediction to (8.4): the tier's mask,
        or the budget where no tier served the decision."""
        return self.budget_s if self.mask_s is None else self.mask_s


@dataclass(frozen=True)
class BudgetOutcomes:
    """The budget outcomes of a batch of decisions: `met` per row, a row's `BudgetOutcome` built
    when asked for (its dict of predictions is most of a decision's cost over thousands of rows)."""

    kind: str
    budget_s: float
    tier_s: float | None
    candidates: list[str]
    predicted_s: np.ndarray  # (n, K): each candidate's predicted p95
    met: np.ndarray  # (n,) bool: the chosen candidate's prediction is within the budget
    mask_s: float | None = None

    def __len__(self) -> int:
        return len(self.met)

    def __getitem__(self, i: int) -> BudgetOutcome:
        return BudgetOutcome(
            kind=self.kind,
            budget_s=self.budget_s,
            tier_s=self.tier_s,
            met=bool(self.met[i]),
            predicted_s=dict(zip(self.candidates, self.predicted_s[i].tolist())),
            mask_s=self.mask_s,
        )


@dataclass
class RoutingPolicy:
    """Candidates, their scorer, Platt calibration, cost model and the quality knob."""

    candidates: list[str]
    spec: FeatureSpec
    scorer: "LinearScorer | TreeScorer"
    platt: np.ndarray  # (2, K): p = sigmoid(a * logit + b)
    cost_model: CostModel
    knob: Knob
    reference_pass_rate: float  # best single candidate's pass rate on calibration data
    reference_model: str
    quality_target: float = 0.95
    metrics: dict[str, Any] = field(default_factory=dict)
    format_version: int | None = None  # the format its files were read from; None when built in memory
    vectors: bytes | None = field(
        default=None, repr=False
    )  # conformance vectors read with it, not yet checked
    conformance: ConformanceReport | None = field(default=None, repr=False)  # what self_check found
    latency: LatencyPolicy | None = None  # latency model and certified budgets, where measured

    engine: str | None = field(default=None, repr=False)  # webassembly or numpy; None: default_engine()

    # -- scoring -------------------------------------------------------------------------
    def score_request(self, prompt: str, suite: str | None, embedding: np.ndarray | None = None) -> "Scored":
        """One request through features, scorer, calibration and cost (the spec's steps)."""
        s = self._score(prompt, suite, embedding, keep=True)
        return Scored(s.layers, s.ids, s.vals, np.array(s.z), s.topic, np.array(s.p), np.array(s.c))

    def _score(self, prompt: str, suite: str | None, embedding: np.ndarray | None, keep: bool) -> _Scores:
        """`score_request` with its numbers as Python floats; the row (ids, vals) is None when
        the kernel computed it and `keep` is False."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        if suite is not None and not isinstance(suite, str):
            raise TypeError(f"suite must be a string or None, got {type(suite).__name__}")
        kernel = self.kernel
        if kernel is not None and embedding is None and kernel.lock.acquire(blocking=False):
            try:
                return self._score_kernel(kernel, prompt, suite, keep)
            except Exception as exc:  # noqa: BLE001  (a trap or a wasmtime error: numpy from now on)
                self.__dict__["_kernel"] = None
                kernel.failed(exc)
            finally:
                kernel.lock.release()
        layers = None
        if self.spec.embeddings:
            ids, vals = request_features(prompt, suite, self.spec, embedding)
            chars, pos = n_chars(prompt), self.spec.suite_position(suite)
        else:
            layers = feature_layers(prompt, suite, self.spec)
            ids, vals, pos, chars = layers.ids, layers.vals, layers.suite_pos, layers.text.n_chars
        z, topic = self.scorer.score(ids, vals, self._slope_row(pos))
        return self._calibrated(layers, ids, vals, z.tolist(), topic, chars, pos)

    def _score_kernel(self, kernel: Kernel, prompt: str, suite: str | None, keep: bool) -> _Scores:
        """`_score` with the features (and a linear scorer's scoring, or else the sigmoid) in the kernel."""
        n, pos, chars = kernel.fill_row(prompt, suite, self.spec)
        ids, vals = None, None
        if keep or not isinstance(self.scorer, LinearScorer):
            ids, vals = kernel.ids[:n].astype(np.intp), kernel.vals[:n].copy()
        if kernel.table is not None:
            z, p, c, topic = kernel.scores(n, self._slope_row(pos), pos, chars)
            return _Scores(None, ids, vals, z, topic, p, c, chars, pos)
        assert ids is not None and vals is not None
        z_array, topic = self.scorer.score(ids, vals, self._slope_row(pos))
        return self._calibrated(None, ids, vals, z_array.tolist(), topic, chars, pos, kernel.sigmoids)

    def _calibrated(
        self,
        layers: Any,
        ids: np.ndarray | None,
        vals: np.ndarray | None,
        z: list[float],
        topic: int,
        chars: int,
        pos: int,
        sigmoid: Callable[[list[float]], list[float]] = sigmoid_list,
    ) -> _Scores:
        platt_a, platt_b = self._platt_lists()
        p = sigmoid([a * t + b for a, t, b in zip(platt_a, z, platt_b)])
        c = self.cost_model.predict_one(chars, pos, topic)
        return _Scores(layers, ids, vals, z, topic, p, c, chars, pos)

    def _slope_row(self, pos: int) -> int:
        return pos if pos >= 0 else len(self.spec.suites)

    def _platt_lists(self) -> tuple[list[float], list[float]]:
        cached = self.__dict__.get("_platt")
        if cached is None:
            cached = self.__dict__["_platt"] = (self.platt[0].tolist(), self.platt[1].tolist())
        return cast(tuple[list[float], list[float]], cached)

    @property
    def kernel(self) -> Kernel | None:
        """The WebAssembly kernel of this policy's features and linear scorer (made on first
        use), or None where the numpy steps run (routeopt.router_training.policy.kernel)."""
        if "_kernel" not in self.__dict__:
            weights, table = None, None
            if isinstance(self.scorer, LinearScorer):
                weights, table = self.scorer.weights, ScoreTable.of(self.scorer, self.platt, self.cost_model)
            self.__dict__["_kernel"] = Kernel.create(self.spec, weights, self.engine, table)
        return cast("Kernel | None", self.__dict__["_kernel"])

    @property
    def engine_in_use(self) -> str:
        return "webassembly" if self.kernel is not None else "numpy"

    def predict(
        self, prompts: Sequence[str], suites: Sequence[str | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Calibrated pass probabilities and predicted costs, each (n, K): the batch path of the
        spec's steps (routeopt.router_training.policy.batch_features), which computes the same
        bits as `score_request`; with embeddings, request by request."""
        suites = list(suites) if suites is not None else [None] * len(prompts)
        if len(suites) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(suites)} suites")
        k = len(self.candidates)
        if not self.spec.embeddings:
            if not len(prompts):
                return np.empty((0, k)), np.empty((0, k))
            _, _, _, p, c = batch_predict(self, list(prompts), suites)
            return p, c
        embeddings = [None] * len(prompts)
        if len(prompts) > 1:
            from routeopt.router_training.policy.embeddings import embed  # optional extra; batched is faster

            embeddings = list(embed(list(prompts)))
        p, c = np.empty((len(prompts), k)), np.empty((len(prompts), k))
        for i, (prompt, suite) in enumerate(zip(prompts, suites)):
            s = self.score_request(prompt, suite, embeddings[i])
            p[i], c[i] = s.p, s.c
        return p, c

    def point_for(self, quality_target: float | None = None) -> OperatingPoint:
        """The operating point that serves a target (the policy's own target by default)."""
        target = self.quality_target if quality_target is None else float(quality_target)
        if not math.isfinite(target):
            raise ValueError(f"quality_target must be a finite number, got {quality_target!r}")
        return self.knob.point_for(target)

    def select(
        self,
        p: np.ndarray,
        c: np.ndarray,
        prompts: Sequence[str],
        suites: Sequence[str | None],
        quality_target: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Chosen candidate per request and the probability it had of being chosen."""
        return point_choice(
            self.knob, self.point_for(quality_target), p, c, lambda i: request_unit(prompts[i], suites[i])
        )

    # -- deciding ------------------------------------------------------------------------
    def decide(
        self,
        prompt: str,
        suite: str | None = None,
        quality_target: float | None = None,
        *,
        ttft_budget_s: float | None = None,
        latency_budget_s: float | None = None,
        use_defaults: bool = False,
    ) -> PolicyDecision:
        """One request on the gateway's hot path: the same steps as decide_batch for one row,
        its scores and the knob's choice in Python's floats (a row's dozen numbers cost less so
        than as arrays; `row_decision`, which the knob's tests hold to the arrays' bits).

        A budget (at most one of TTFT and end-to-end latency, in seconds, on the p95) restricts
        the choice to the candidates the budget's certified tier allows; with `use_defaults`, a
        request without one gets the policy's default for its suite, as gateways' routers do."""
        kind, budget = self._budget(ttft_budget_s, latency_budget_s, suite, use_defaults)
        s = self._score(prompt, suite, None, keep=False)

        def unit(_: int) -> float:
            return request_unit(prompt, suite)

        if kind is None:
            point = self.point_for(quality_target)
            row = row_decision(self.knob, point, s.p, s.c, lambda: unit(0))
            if row is not None:
                return self._decision(row[0], row[1], s.p, s.c, row[2])
            p, c = np.array([s.p]), np.array([s.c])
            pick, prop = point_choice(self.knob, point, p, c, unit)
            order, outcome = fallback_order(self.knob, point, p, c), None
        else:
            assert self.latency is not None and budget is not None
            pred = self.latency.model.predict_one(kind, BUDGET_QUANTILE, s.n_chars, s.suite_pos)
            one = self._budget_row(kind, budget, s.p, s.c, pred, lambda: unit(0), quality_target)
            if one is not None:
                return self._decision(one[0], one[1], s.p, s.c, one[2], one[3])
            p, c = np.array([s.p]), np.array([s.c])
            pick, prop, order, outcomes = self._budget_choice(
                kind, budget, p, c, np.array([pred]), unit, quality_target
            )
            outcome = outcomes[0]
        return self._decision(int(pick[0]), prop[0], s.p, s.c, order[0], outcome)

    def _budget(
        self, ttft_budget_s: Any, latency_budget_s: Any, suite: str | None = None, use_defaults: bool = False
    ) -> tuple[str | None, float | None]:
        """The budget asked for, else (`use_defaults`) the policy's default for the suite:
        (kind, seconds), or (None, None) without either."""
        asked = budget_request(ttft_budget_s, latency_budget_s)
        if asked is None and use_defaults and self.latency is not None:
            asked = self.latency.default_for(suite)
        if asked is None:
            return None, None
        kind, seconds = asked
        if not serves(self.latency, kind):
            raise ValueError(
                f"this policy has no {kind} model: it was trained on outcomes without {kind} "
                "measurements, so it cannot serve a latency budget"
            )
        return kind, seconds

    def _budget_choice(
        self,
        kind: str,
        budget: float,
        p: np.ndarray,
        c: np.ndarray,
        pred: np.ndarray,
        unit: Any,
        quality_target: float | None,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, BudgetOutcomes]:
        """Choices, propensities, fallback orders and budget outcomes under a budget (rows of p)."""
        assert self.latency is not None
        tier = self.latency.tier_for(kind, budget)
        allowed = budget_mask(pred, tier.mask_s if tier is not None else -math.inf)
        if tier is None:  # below every certified budget: the candidate predicted fastest
            picks = allowed.argmax(axis=1)
            props = np.ones(len(picks))
            order = np.lexsort((c, pred), axis=-1)
        else:
            point = tier.knob.point_for(self._budget_target(quality_target))
            picks, props = point_choice(tier.knob, point, p, c, unit, allowed)
            order = fallback_order(tier.knob, point, p, c, allowed)
        met = pred[np.arange(len(picks)), picks] <= budget
        tier_s, mask_s = (None, None) if tier is None else (tier.budget_s, tier.mask_s)
        return picks, props, order, BudgetOutcomes(kind, budget, tier_s, self.candidates, pred, met, mask_s)

    def _budget_row(
        self,
        kind: str,
        budget: float,
        p: list[float],
        c: list[float],
        pred: list[float],
        unit: Callable[[], float],
        quality_target: float | None,
    ) -> tuple[int, float, list[int], BudgetOutcome] | None:
        """`_budget_choice` of one request in Python's floats (`row_decision` among the
        candidates the tier's mask allows); None where the arrays decide (no tier, a value that
        is not finite, a threshold member)."""
        assert self.latency is not None
        tier = self.latency.tier_for(kind, budget)
        if tier is None or not math.isfinite(math.fsum(pred)):
            return None
        point = tier.knob.point_for(self._budget_target(quality_target))
        allowed = [v <= tier.mask_s for v in pred]
        if not any(allowed):  # budget_mask: the candidate predicted fastest (the first such)
            allowed[pred.index(min(pred))] = True
        row = row_decision(tier.knob, point, p, c, unit, allowed)
        if row is None:
            return None
        pick, prop, order = row
        met = pred[pick] <= budget
        return (
            pick,
            prop,
            order,
            BudgetOutcome(kind, budget, tier.budget_s, met, dict(zip(self.candidates, pred)), tier.mask_s),
        )

    def _budget_target(self, quality_target: float | None) -> float:
        target = self.quality_target if quality_target is None else float(quality_target)
        if not math.isfinite(target):
            raise ValueError(f"quality_target must be a finite number, got {quality_target!r}")
        return target

    def _decision(
        self,
        pick: int,
        prop: float,
        p: list[float],
        c: list[float],
        order: np.ndarray | list[int],
        budget: "BudgetOutcome | None" = None,
    ) -> PolicyDecision:
        """The decision for one request; fallbacks in `order` without the chosen candidate."""
        names = self.candidates
        ranked = order.tolist() if isinstance(order, np.ndarray) else order
        return PolicyDecision(
            model=names[pick],
            fallbacks=tuple([names[j] for j in ranked if j != pick]),
            pass_probabilities=dict(zip(names, p)),
            expected_cost_usd=dict(zip(names, c)),
            propensity=float(prop),
            budget=budget,
        )

    def decide_batch(
        self,
        prompts: Sequence[str],
        suites: Sequence[str | None] | None = None,
        quality_target: float | None = None,
        *,
        ttft_budget_s: float | None = None,
        latency_budget_s: float | None = None,
        use_defaults: bool = False,
    ) -> list[PolicyDecision]:
        suites = list(suites) if suites is not None else [None] * len(prompts)
        asked = [
            self._budget(ttft_budget_s, latency_budget_s, suite, use_defaults)
            for suite in dict.fromkeys(suites)
        ]
        by_suite = dict(zip(dict.fromkeys(suites), asked))
        p, c = self.predict(prompts, suites)
        if any(kind is not None for kind, _ in asked):  # each group of requests under one budget at once
            out: list[PolicyDecision | None] = [None] * len(prompts)
            groups: dict[tuple[str | None, float | None], list[int]] = {}
            for i, suite in enumerate(suites):
                groups.setdefault(by_suite[suite], []).append(i)
            for (kind, budget), rows in groups.items():
                idx = np.array(rows)
                sub = self._decide_rows(
                    [prompts[i] for i in rows],
                    [suites[i] for i in rows],
                    p[idx],
                    c[idx],
                    quality_target,
                    kind,
                    budget,
                )
                for i, d in zip(rows, sub):
                    out[i] = d
            return cast(list[PolicyDecision], out)
        return self._decide_rows(list(prompts), suites, p, c, quality_target, None, None)

    def _decide_rows(
        self,
        prompts: list[str],
        suites: list[str | None],
        p: np.ndarray,
        c: np.ndarray,
        quality_target: float | None,
        kind: str | None,
        budget: float | None,
    ) -> list[PolicyDecision]:
        """Decisions for scored requests, under one budget or none."""
        if kind is not None:
            assert budget is not None
            pred = self.predict_latency(kind, prompts, suites)
            picks, props, orders, outcomes = self._budget_choice(
                kind, budget, p, c, pred, lambda i: request_unit(prompts[i], suites[i]), quality_target
            )
            return [
                self._decision(int(picks[i]), props[i], p[i].tolist(), c[i].tolist(), orders[i], outcomes[i])
                for i in range(len(prompts))
            ]
        point = self.point_for(quality_target)
        pick, prop = point_choice(self.knob, point, p, c, lambda i: request_unit(prompts[i], suites[i]))
        order = fallback_order(self.knob, point, p, c)
        return [
            self._decision(int(pick[i]), prop[i], p[i].tolist(), c[i].tolist(), order[i])
            for i in range(len(prompts))
        ]

    def predict_latency(
        self, kind: str, prompts: Sequence[str], suites: Sequence[str | None], quantile: str = BUDGET_QUANTILE
    ) -> np.ndarray:
        """(n, K) predicted seconds of `kind` (ttft or latency) at `quantile` (p50 or p95)."""
        if self.latency is None:
            raise ValueError("this policy has no latency model")
        return self.latency.model.predict(kind, quantile, *self.latency_inputs(prompts, suites))

    def latency_inputs(
        self, prompts: Sequence[str], suites: Sequence[str | None]
    ) -> tuple[np.ndarray, np.ndarray]:
        """What the latency models read of each request: its length in characters (the spec's
        n_chars) and its suite's position (-1 where unknown)."""
        chars = np.array([n_chars(x) for x in prompts])
        pos = np.array([self.spec.suite_position(s) for s in suites], dtype=int)
        return chars, pos

    # -- persistence ---------------------------------------------------------------------
    def save(self, folder: Path) -> list[str]:
        """Write the policy in format 3 (docs/policy-format.md): policy.json, arrays.safetensors
        and conformance.safetensors, the vectors every runtime checks itself against, computed
        from the policy as read back from the first two (no pickle; atomically). Returns the
        file names."""
        folder = Path(folder)
        names = write_policy_files(self, folder)
        written = type(self).load(folder, vectors=False)
        atomic_write(folder / VECTORS_NAME, build_vectors(written))
        return [*names, VECTORS_NAME]

    @classmethod
    def load(cls, folder: Path, vectors: bool = True) -> "RoutingPolicy":
        """Read a policy folder of format 3, 2 or 1 (a format 1 rule and its table load as a knob);
        format 3 keeps its vectors' bytes for `self_check`."""
        policy = cls(**read_policy_files(Path(folder), vectors))
        policy._check_members()
        return policy

    def self_check(self) -> ConformanceReport:
        """Run the conformance vectors loaded with the policy (routeopt.router_training.policy.conformance)."""
        return self_check(self)

    @property
    def format_info(self) -> dict[str, Any]:
        """What the manifest says about the format: version, portability, the vectors' file."""
        return format_info(self)

    def _check_members(self) -> None:
        k = len(self.candidates)
        for m in self.knob.members:
            if m.rule == "single" and not 0 <= int(m.param) < k:
                raise ValueError(f"knob member names candidate {int(m.param)}; the policy has {k}")

    def describe(self) -> dict[str, Any]:
        """A compact summary for manifests and diffs (no weights)."""
        spec = self.spec.to_dict()
        spec.pop("idf", None)
        point = self.point_for()
        return {
            "candidates": list(self.candidates),
            "quality_target": self.quality_target,
            "point_at_default_target": point.to_list(),
            "reference": {"model": self.reference_model, "pass_rate": self.reference_pass_rate},
            "knob": {
                "confidence": _finite_or_none(self.knob.confidence),
                "certified_up_to": _finite_or_none(self.knob.certified_up_to()),
                "points": [p.to_list() for p in self.knob.points],
                "top": self.knob.top.to_list(),
                "members": [m.to_list() for m in self.knob.members],
            },
            "cost_model": self.cost_model.to_dict(),
            "feature_spec": spec,
            "scorer": self._scorer_summary(),
            "metrics": self.metrics,
        }

    def _scorer_summary(self) -> dict[str, Any]:
        if isinstance(self.scorer, LinearScorer):
            return {"kind": "difficulty-linear", "shape": list(self.scorer.weights.shape)}
        return self.scorer.summary()


class Scored(NamedTuple):
    """One request's feature layers (None with embeddings or the kernel), its row (column ids and
    values), logits, topic, probabilities, costs."""

    layers: Any
    ids: np.ndarray | None
    vals: np.ndarray | None
    z: np.ndarray
    topic: int
    p: np.ndarray
    c: np.ndarray
