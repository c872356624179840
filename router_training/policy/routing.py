"""The routing policy a gateway loads: features -> calibrated pass probabilities -> a choice.

Imports numpy and the standard library only, so a gateway can embed it. A router scores, one
shared policy decides (RouteLLM's split). The quality knob is a `Knob`: a staircase of operating
points, each a member rule or a per-request mix of two, with the largest quality target it is
certified for (`routeopt.router_training.knob` builds it). A member is a deterministic rule:

* ``lambda``: maximise ``p - lambda * cost`` per request;
* ``single``: always the same candidate;
* ``threshold`` (read from format 1 policies): the cheapest candidate whose ``p >= tau``.

A target x (a fraction of the best single candidate's pass rate) is served by the cheapest point
certified for x, and a target above every certified one by the point with the best calibration
pass rate. A mix picks its member with a hash of the request, so a decision is deterministic and
its `propensity` (the probability that this model was chosen) is known for off-policy evaluation.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Sequence

import numpy as np

from routeopt.router_training.features import FeatureSpec, cut, feature_layers, n_chars, request_features, text_bytes
from routeopt.router_training.numerics import ordered_row_sum, ordered_sum, sigmoid
from routeopt.router_training.trees import TreeScorer  # noqa: F401  (the LightGBM scorer, as portable trees)

FORMAT_VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
RULES = ("lambda", "threshold")
MEMBER_RULES = ("lambda", "threshold", "single")


@dataclass(frozen=True)
class Decision:
    """One routing decision: the model to call, what to try next, and why."""

    model: str
    fallbacks: tuple[str, ...]
    pass_probabilities: dict[str, float]
    expected_cost_usd: dict[str, float]
    propensity: float = 1.0  # probability that this request gets this model (mixed points < 1)


def _sigmoid(z: np.ndarray) -> np.ndarray:
    """Platt's logistic function as the spec computes it (routeopt.router_training.numerics.sigmoid)."""
    return sigmoid(z)


def assign_clusters(Z: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid (cosine: rows of Z are compared after scaling to unit length)."""
    Z = np.atleast_2d(Z)
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))[:, None]
    unit = Z / np.where(norm > 0, norm, 1.0)
    return np.argmax(unit @ centroids.T - 0.5 * np.einsum("ij,ij->i", centroids, centroids), axis=1)


@dataclass
class LinearScorer:
    """logit_k = x.W[:, k] + bias_k + difficulty(x) * slope[suite, k], difficulty = x.w_d + b_d.

    Column K of `weights` is w_d, so one sparse gather scores everything; row n_suites of
    `slopes` serves requests whose suite is missing or unknown. With topics, the columns after
    it project the text to the topic space; the nearest centroid's prior and slope are added.
    """

    weights: np.ndarray  # (n_features, K + 1 + rank)
    bias: np.ndarray  # (K,)
    difficulty_bias: float
    slopes: np.ndarray  # (n_suites + 1, K)
    centroids: np.ndarray | None = None  # (n_topics, rank)
    topic_bias: np.ndarray | None = None  # (n_topics, K)
    topic_slopes: np.ndarray | None = None  # (n_topics, K)
    topic_difficulty: np.ndarray | None = None  # (n_topics,)

    def __post_init__(self) -> None:
        dtype = np.float32 if np.asarray(self.weights).dtype == np.float32 else np.float64
        self.weights = np.ascontiguousarray(self.weights, dtype=dtype)  # float32 as published (format 3)
        k = len(self.bias)
        if self.centroids is not None and self.weights.shape[1] != k + 1 + self.centroids.shape[1]:
            raise ValueError(f"scorer weights have {self.weights.shape[1]} columns; expected "
                             f"{k + 1 + self.centroids.shape[1]} for {k} candidates and the topic projection")
        if self.centroids is not None:
            self._half_norms = 0.5 * ordered_row_sum((self.centroids * self.centroids).T)
            self._centroids_t = np.ascontiguousarray(self.centroids.T)  # topic()'s rows, in C order

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        """Logits of every candidate and the request's topic (-1 without topics).

        r = sum over the row's features, in column order, of value x weight row (the spec's
        "Scorer": a fixed order, so every runtime gets the same bits)."""
        r = ordered_row_sum(vals[:, None] * np.take(self.weights, ids, axis=0))  # take: ~3x faster than fancy indexing
        k = len(self.bias)
        out = r[:k] + self.bias
        slope = self.slopes[suite_pos]
        g, d = -1, r[k] + self.difficulty_bias
        if self.centroids is not None:
            g = self.topic(r[k + 1:])
            out = out + self.topic_bias[g]
            slope = slope + self.topic_slopes[g]
            d = d + self.topic_difficulty[g]
        return out + d * slope, g

    def topic(self, z: np.ndarray) -> int:
        """The nearest centroid to z scaled to unit length: the first g maximising
        centroid_g . z_unit - |centroid_g|^2 / 2."""
        norm = math.sqrt(ordered_sum(z * z))
        unit = z / norm if norm > 0 else z
        return int(np.argmax(ordered_row_sum(self._centroids_t * unit[:, None]) - self._half_norms))

    def logits(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> np.ndarray:
        return self.score(ids, vals, suite_pos)[0]

    def to_dict(self) -> dict:
        d = {
            "kind": "difficulty-linear",
            "shape": list(self.weights.shape),
            "bias": self.bias.tolist(),
            "difficulty_bias": float(self.difficulty_bias),
            "slopes": self.slopes.tolist(),
            "weights": np.round(self.weights.ravel(), 7).tolist(),
        }
        if self.centroids is not None:
            d["topics"] = {"centroids": self.centroids.tolist(), "bias": self.topic_bias.tolist(),
                           "slopes": self.topic_slopes.tolist(), "difficulty": self.topic_difficulty.tolist()}
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "LinearScorer":
        if d.get("kind") != "difficulty-linear":
            raise ValueError(f"unknown scorer kind {d.get('kind')!r}; this build reads 'difficulty-linear'")
        topics = d.get("topics")
        arr = lambda v: np.asarray(v, dtype=np.float64)
        return cls(
            weights=arr(d["weights"]).reshape(d["shape"]),
            bias=arr(d["bias"]),
            difficulty_bias=float(d["difficulty_bias"]),
            slopes=arr(d["slopes"]),
            centroids=None if topics is None else arr(topics["centroids"]),
            topic_bias=None if topics is None else arr(topics["bias"]),
            topic_slopes=None if topics is None else arr(topics["slopes"]),
            topic_difficulty=None if topics is None else arr(topics["difficulty"]),
        )


@dataclass
class CostModel:
    """Predicted cost per candidate: intercept + per-1k-chars slope + per-suite offset (+ per
    topic offset when the scorer has topics: code answers cost more than yes/no ones), floored."""

    coef: np.ndarray  # (2 + n_suites, K): [intercept, per_kchar, suite offsets...]
    floor: np.ndarray  # (K,)
    topic_coef: np.ndarray | None = None  # (n_topics, K)

    def predict(self, n_chars: np.ndarray, suite_pos: np.ndarray,
                topic_pos: np.ndarray | None = None) -> np.ndarray:
        """(n, K) costs; suite_pos (topic_pos) is -1 for an unknown suite (topic): no offset."""
        n_chars = np.asarray(n_chars, dtype=np.float64)
        out = self.coef[0] + np.outer(n_chars / 1000.0, self.coef[1])
        known = suite_pos >= 0
        if known.any():
            out[known] += self.coef[2 + suite_pos[known]]
        if self.topic_coef is not None and topic_pos is not None:
            has = topic_pos >= 0
            out[has] += self.topic_coef[topic_pos[has]]
        return np.where(out < self.floor, self.floor, out)

    def predict_one(self, n_chars: int, suite_pos: int, topic_pos: int = -1) -> np.ndarray:
        out = self.coef[0] + (n_chars / 1000.0) * self.coef[1]
        if suite_pos >= 0:
            out = out + self.coef[2 + suite_pos]
        if self.topic_coef is not None and topic_pos >= 0:
            out = out + self.topic_coef[topic_pos]
        return np.where(out < self.floor, self.floor, out)

    def to_dict(self) -> dict:
        d = {"coef": self.coef.tolist(), "floor": self.floor.tolist()}
        if self.topic_coef is not None:
            d["topic_coef"] = self.topic_coef.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "CostModel":
        topic = d.get("topic_coef")
        return cls(coef=np.asarray(d["coef"], dtype=np.float64), floor=np.asarray(d["floor"], dtype=np.float64),
                   topic_coef=None if topic is None else np.asarray(topic, dtype=np.float64))


def choose(p: np.ndarray, c: np.ndarray, rule: str, param: float) -> np.ndarray:
    """Per-request preference order over candidates (n, K); column 0 is the choice.

    Ties go to the cheaper candidate, so the rule is deterministic.
    """
    p = np.atleast_2d(p)
    c = np.atleast_2d(c)
    if rule == "lambda":
        return np.lexsort((c, -(p - param * c)), axis=-1)
    if rule == "threshold":
        ok = p >= param
        key = np.where(ok, c, np.inf)
        second = np.where(ok, 0.0, -p)
        return np.lexsort((c, second, key), axis=-1)
    raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")


@dataclass(frozen=True)
class Member:
    """A deterministic rule: `lambda` (param = lambda), `threshold` (tau) or `single` (index)."""

    rule: str
    param: float

    def to_list(self) -> list:
        return [self.rule, float(self.param)]


def member_choice(member: Member, p: np.ndarray, c: np.ndarray) -> np.ndarray:
    """The candidate each request gets under one member (n,); ties go to the cheaper one."""
    p = np.atleast_2d(p)
    c = np.atleast_2d(c)
    if member.rule == "single":
        return np.full(p.shape[0], int(member.param), dtype=np.intp)
    if member.rule == "lambda":
        score = p - member.param * c
        tied = score >= score.max(axis=1, keepdims=True)
        return np.where(tied, c, np.inf).argmin(axis=1)
    return choose(p, c, member.rule, member.param)[:, 0]


def member_pick(member: Member, p: np.ndarray, c: np.ndarray) -> int:
    """`member_choice` for one request's 1-d p and c (the same operations, without a batch axis)."""
    if member.rule == "single":
        return int(member.param)
    if member.rule == "lambda":
        score = p - member.param * c
        return int(np.where(score >= score.max(), c, np.inf).argmin())
    return int(choose(p, c, member.rule, member.param)[0, 0])


@dataclass(frozen=True)
class OperatingPoint:
    """Member `a` with probability `weight`, else member `b`; `certified` is the largest quality
    target it keeps with the knob's confidence (-inf: none); pass rate and cost on calibration."""

    a: int
    b: int
    weight: float
    certified: float
    pass_rate: float
    cost: float

    def to_list(self) -> list:
        return [self.a, self.b, round(self.weight, 9), _finite_or_none(self.certified),
                _finite_or_none(self.pass_rate), _finite_or_none(self.cost)]

    @classmethod
    def from_list(cls, v: Sequence) -> "OperatingPoint":
        a, b, w, cert, q, c = v
        return cls(int(a), int(b), float(w), -math.inf if cert is None else float(cert),
                   math.nan if q is None else float(q), math.nan if c is None else float(c))


def _finite_or_none(v: float) -> float | None:
    return float(v) if math.isfinite(v) else None


@dataclass
class Knob:
    """The quality knob: members, and a staircase of points (cost and certified target rise
    together) plus the best-effort `top` for targets nothing certifies."""

    members: list[Member]
    points: list[OperatingPoint]
    top: OperatingPoint
    confidence: float

    def __post_init__(self) -> None:
        self._certified = [p.certified for p in self.points]
        for p in (*self.points, self.top):
            if not (0 <= p.a < len(self.members) and 0 <= p.b < len(self.members)):
                raise ValueError(f"an operating point names member {max(p.a, p.b)}; there are {len(self.members)}")
        if any(b <= a for a, b in zip(self._certified, self._certified[1:])):
            raise ValueError("knob points must have strictly rising certified targets")

    @classmethod
    def from_points(cls, members: list[Member], points: list[OperatingPoint], reference: OperatingPoint,
                    top: OperatingPoint, confidence: float) -> "Knob":
        """Keep the points some target would choose: each certifies more than every cheaper one."""
        stair: list[OperatingPoint] = []
        for p in sorted([*points, reference], key=lambda p: (p.cost, -p.certified)):
            if math.isfinite(p.certified) and (not stair or p.certified > stair[-1].certified + 1e-12):
                stair.append(p)
        return cls(members, stair, top, confidence)

    def point_for(self, target: float) -> OperatingPoint:
        """The cheapest point certified for the target, else the best-effort top."""
        i = bisect.bisect_left(self._certified, target - 1e-12)
        return self.points[i] if i < len(self.points) else self.top

    def certified_up_to(self) -> float:
        return self._certified[-1] if self._certified else -math.inf

    def to_dict(self) -> dict:
        return {"confidence": _finite_or_none(self.confidence), "members": [m.to_list() for m in self.members],
                "points": [p.to_list() for p in self.points], "top": self.top.to_list()}

    @classmethod
    def from_dict(cls, d: dict) -> "Knob":
        members = [Member(str(r), float(v)) for r, v in d["members"]]
        bad = [m.rule for m in members if m.rule not in MEMBER_RULES]
        if bad:
            raise ValueError(f"unknown knob member rule {bad[0]!r}; this build reads {MEMBER_RULES}")
        return cls(members, [OperatingPoint.from_list(p) for p in d["points"]],
                   OperatingPoint.from_list(d["top"]),
                   math.nan if d.get("confidence") is None else float(d["confidence"]))

    @classmethod
    def from_table(cls, rule: str, table: list[tuple[float, float]], reference_rate: float) -> "Knob":
        """A format 1 table (param, expected pass rate), cheapest first, served as it was."""
        members = [Member(rule, float(param)) for param, _ in table]
        scale = reference_rate if reference_rate > 0 else 1.0
        points = [OperatingPoint(i, i, 1.0, float(q) / scale, float(q), math.nan)
                  for i, (_, q) in enumerate(table)]
        stair = [p for i, p in enumerate(points) if i == 0 or p.certified > points[i - 1].certified]
        return cls(members, stair, points[-1], math.nan)


def request_unit(prompt: str, suite: str | None) -> float:
    """A uniform number in [0, 1] fixed by the request: mixes pick their member with it.

    BLAKE2b-64 of the suite's bytes, a NUL and the prompt's cut bytes (the spec's section 7: the
    cut bounds the work a huge prompt costs), read big-endian and divided by 2**64 (which may
    round up to 1.0)."""
    digest = hashlib.blake2b(text_bytes(suite or "") + b"\x00" + cut(text_bytes(prompt)), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64


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
    metrics: dict = field(default_factory=dict)

    # -- scoring -------------------------------------------------------------------------
    def score_request(self, prompt: str, suite: str | None,
                      embedding: np.ndarray | None = None) -> "Scored":
        """One request through features, scorer, calibration and cost (the spec's steps)."""
        if not isinstance(prompt, str):
            raise TypeError(f"prompt must be a string, got {type(prompt).__name__}")
        if suite is not None and not isinstance(suite, str):
            raise TypeError(f"suite must be a string or None, got {type(suite).__name__}")
        if self.spec.embeddings:
            ids, vals = request_features(prompt, suite, self.spec, embedding)
            layers, chars = None, n_chars(prompt)
            pos = self.spec.suite_position(suite)
        else:
            layers = feature_layers(prompt, suite, self.spec)
            ids, vals, pos, chars = layers.ids, layers.vals, layers.suite_pos, layers.text.n_chars
        z, topic = self.scorer.score(ids, vals, pos if pos >= 0 else len(self.spec.suites))
        p = sigmoid(self.platt[0] * z + self.platt[1])
        c = self.cost_model.predict_one(chars, pos, topic)
        return Scored(layers, z, topic, p, c)

    def predict(
        self, prompts: Sequence[str], suites: Sequence[str | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Calibrated pass probabilities and predicted costs, each (n, K)."""
        suites = list(suites) if suites is not None else [None] * len(prompts)
        if len(suites) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(suites)} suites")
        embeddings = [None] * len(prompts)
        if self.spec.embeddings and len(prompts) > 1:
            from routeopt.router_training.embeddings import embed  # optional extra; batched is faster

            embeddings = list(embed(list(prompts)))
        k = len(self.candidates)
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
        self, p: np.ndarray, c: np.ndarray, prompts: Sequence[str], suites: Sequence[str | None],
        quality_target: float | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """Chosen candidate per request and the probability it had of being chosen."""
        return self._select(self.point_for(quality_target), p, c, prompts, suites)

    def _select(self, point: OperatingPoint, p: np.ndarray, c: np.ndarray, prompts: Sequence[str],
                suites: Sequence[str | None]) -> tuple[np.ndarray, np.ndarray]:
        ma, mb = self.knob.members[point.a], self.knob.members[point.b]
        pick_a = member_choice(ma, p, c)
        if point.weight >= 1.0:
            return pick_a, np.ones(len(pick_a))
        pick_b = member_choice(mb, p, c)
        u = np.zeros(len(pick_a))  # the draw matters (and is hashed) only where the members differ
        for i in np.flatnonzero(pick_a != pick_b):
            u[i] = request_unit(prompts[i], suites[i])
        pick = np.where(u < point.weight, pick_a, pick_b)
        prop = point.weight * (pick_a == pick) + (1 - point.weight) * (pick_b == pick)
        return pick, prop

    def _fallback_param(self, point: OperatingPoint) -> float:
        for m in (self.knob.members[point.a], self.knob.members[point.b]):
            if m.rule == "lambda":
                return m.param
        return 0.0

    # -- deciding ------------------------------------------------------------------------
    def decide(
        self, prompt: str, suite: str | None = None, quality_target: float | None = None
    ) -> Decision:
        """One request on the gateway's hot path (same result as decide_batch, fewer steps)."""
        s = self.score_request(prompt, suite)
        point = self.point_for(quality_target)
        pick, prop = self._select_one(point, s.p, s.c, prompt, suite)
        return self._decision(pick, prop, s.p, s.c, self._fallback_param(point))

    def _select_one(self, point: OperatingPoint, p: np.ndarray, c: np.ndarray, prompt: str,
                    suite: str | None) -> tuple[int, float]:
        """`_select` for one request, in Python scalars where numpy would handle length-1 arrays."""
        pick_a = member_pick(self.knob.members[point.a], p, c)
        if point.weight >= 1.0:
            return pick_a, 1.0
        pick_b = member_pick(self.knob.members[point.b], p, c)
        u = request_unit(prompt, suite) if pick_a != pick_b else 0.0
        pick = pick_a if u < point.weight else pick_b
        return pick, point.weight * (pick_a == pick) + (1 - point.weight) * (pick_b == pick)

    def _decision(self, pick: int, prop: float, p: np.ndarray, c: np.ndarray, lam: float) -> Decision:
        """The decision for one request; fallbacks in the order of `p - lam * cost`."""
        names = self.candidates
        order = [j for j in np.lexsort((c, -(p - lam * c))).tolist() if j != pick]  # choose()'s "lambda" order
        return Decision(
            model=names[pick],
            fallbacks=tuple(names[j] for j in order),
            pass_probabilities=dict(zip(names, p.tolist())),
            expected_cost_usd=dict(zip(names, c.tolist())),
            propensity=float(prop),
        )

    def decide_batch(
        self,
        prompts: Sequence[str],
        suites: Sequence[str | None] | None = None,
        quality_target: float | None = None,
    ) -> list[Decision]:
        suites = list(suites) if suites is not None else [None] * len(prompts)
        p, c = self.predict(prompts, suites)
        point = self.point_for(quality_target)
        pick, prop = self._select(point, p, c, prompts, suites)
        lam = self._fallback_param(point)
        return [self._decision(int(pick[i]), prop[i], p[i], c[i], lam) for i in range(len(prompts))]

    # -- persistence ---------------------------------------------------------------------
    def save(self, folder: Path) -> list[str]:
        """Write the policy in format 3 (docs/policy-format.md): policy.json, arrays.safetensors
        and conformance.safetensors, the vectors every runtime checks itself against (no pickle;
        atomically). Returns the file names."""
        from routeopt.router_training.policy_files import save_policy

        return save_policy(self, Path(folder))

    @classmethod
    def load(cls, folder: Path) -> "RoutingPolicy":
        """Read a policy folder of format 3, 2 or 1 (a format 1 rule and its table load as a knob)."""
        from routeopt.router_training.policy_files import load_policy

        return load_policy(Path(folder))

    def self_check(self) -> "object":
        """Run the conformance vectors loaded with the policy (routeopt.router_training.conformance)."""
        from routeopt.router_training.conformance import self_check

        return self_check(self)

    @property
    def format_info(self) -> dict:
        """What the manifest says about the format: version, portability, the vectors' file."""
        from routeopt.router_training.policy_files import format_info

        return format_info(self)

    def _check_members(self) -> None:
        k = len(self.candidates)
        for m in self.knob.members:
            if m.rule == "single" and not 0 <= int(m.param) < k:
                raise ValueError(f"knob member names candidate {int(m.param)}; the policy has {k}")

    def describe(self) -> dict:
        """A compact summary for manifests and diffs (no weights)."""
        spec = self.spec.to_dict()
        spec.pop("idf", None)
        point = self.point_for()
        return {
            "candidates": list(self.candidates),
            "quality_target": self.quality_target,
            "point_at_default_target": point.to_list(),
            "reference": {"model": self.reference_model, "pass_rate": self.reference_pass_rate},
            "knob": {"confidence": _finite_or_none(self.knob.confidence), "certified_up_to": _finite_or_none(self.knob.certified_up_to()),
                     "points": [p.to_list() for p in self.knob.points], "top": self.knob.top.to_list(),
                     "members": [m.to_list() for m in self.knob.members]},
            "cost_model": self.cost_model.to_dict(),
            "feature_spec": spec,
            "scorer": self._scorer_summary(),
            "metrics": self.metrics,
        }

    def _scorer_summary(self) -> dict:
        if isinstance(self.scorer, LinearScorer):
            return {"kind": "difficulty-linear", "shape": list(self.scorer.weights.shape)}
        return self.scorer.summary()


class Scored(NamedTuple):
    """One request's feature layers (None with embeddings), logits, topic, probabilities, costs."""

    layers: Any
    z: np.ndarray
    topic: int
    p: np.ndarray
    c: np.ndarray
