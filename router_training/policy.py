"""The routing policy a gateway loads: features -> calibrated pass probabilities -> a choice.

Imports numpy and the standard library only, so a gateway can embed it. A router scores, one
shared policy decides (RouteLLM's split). The quality knob is a `Knob`: a staircase of operating
points, each a member rule or a per-request mix of two, with the largest quality target it is
certified for (`router_training.knob` builds it). A member is a deterministic rule:

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
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import numpy as np

from common.io import atomic_write
from router_training.features import FeatureSpec, request_features

FORMAT_VERSION = 2
READABLE_VERSIONS = (1, 2)
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
    return 0.5 * (1.0 + np.tanh(0.5 * z))


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
        self.weights = np.ascontiguousarray(self.weights, dtype=np.float64)
        k = len(self.bias)
        if self.centroids is not None and self.weights.shape[1] != k + 1 + self.centroids.shape[1]:
            raise ValueError(f"scorer weights have {self.weights.shape[1]} columns; expected "
                             f"{k + 1 + self.centroids.shape[1]} for {k} candidates and the topic projection")
        self._half_norms = None if self.centroids is None else 0.5 * (self.centroids ** 2).sum(1)

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        """Logits of every candidate and the request's topic (-1 without topics)."""
        r = vals @ np.take(self.weights, ids, axis=0)  # take: ~3x faster than fancy indexing
        k = len(self.bias)
        out = r[:k] + self.bias
        slope = self.slopes[suite_pos]
        g, d = -1, r[k] + self.difficulty_bias
        if self.centroids is not None:
            z = r[k + 1:]
            norm = math.sqrt(z @ z)
            g = int(np.argmax(self.centroids @ (z / norm if norm > 0 else z) - self._half_norms))
            out = out + self.topic_bias[g]
            slope = slope + self.topic_slopes[g]
            d = d + self.topic_difficulty[g]
        return out + d * slope, g

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


class TreeScorer:
    """logit_k = booster_k(x) (LightGBM raw score), or a constant for a candidate with one label.

    Boosters live in LightGBM's text format, one file per candidate; lightgbm is imported only
    when such a policy is built, so linear policies keep needing numpy alone.
    """

    kind = "lightgbm"

    def __init__(self, models: Sequence[str | float], n_features: int) -> None:
        import lightgbm as lgb

        self.n_features = int(n_features)
        self.texts = list(models)
        try:
            self.boosters = [None if isinstance(m, float) else lgb.Booster(model_str=m) for m in models]
        except lgb.basic.LightGBMError as e:
            raise ValueError(f"a LightGBM model file does not parse ({e})") from e
        for j, b in enumerate(self.boosters):
            if b is not None and b.num_feature() != self.n_features:
                raise ValueError(f"lgbm_{j}.txt has {b.num_feature()} features; the policy has {self.n_features}")
        self.constants = np.array([m if isinstance(m, float) else 0.0 for m in models])

    def logits_dense(self, X: np.ndarray) -> np.ndarray:
        out = np.tile(self.constants, (X.shape[0], 1))
        for j, b in enumerate(self.boosters):
            if b is not None:
                out[:, j] = b.predict(X, raw_score=True, num_threads=1)
        return out

    def logits(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> np.ndarray:
        row = np.zeros((1, self.n_features))  # per call: gateways decide from many threads
        row[0, ids] = vals
        return self.logits_dense(row)[0]

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        return self.logits(ids, vals, suite_pos), -1

    def logits_many(self, rows: list[tuple[np.ndarray, np.ndarray]], chunk: int = 256) -> np.ndarray:
        """Batch scoring in dense chunks (a policy may not import scipy for sparse input)."""
        out = np.empty((len(rows), len(self.boosters)))
        for start in range(0, len(rows), chunk):
            part = rows[start: start + chunk]
            X = np.zeros((len(part), self.n_features))
            for i, (ids, vals) in enumerate(part):
                X[i, ids] = vals
            out[start: start + len(part)] = self.logits_dense(X)
        return out

    def file_names(self) -> list[str]:
        return [f"lgbm_{j}.txt" for j, m in enumerate(self.texts) if not isinstance(m, float)]

    def to_dict(self) -> dict:
        return {
            "kind": self.kind, "n_features": self.n_features,
            "models": [m if isinstance(m, float) else f"lgbm_{j}.txt" for j, m in enumerate(self.texts)],
        }

    @classmethod
    def from_dict(cls, d: dict, folder: Path) -> "TreeScorer":
        models: list[str | float] = []
        for m in d["models"]:
            if isinstance(m, str):
                if Path(m).name != m or not m.startswith("lgbm_"):
                    raise ValueError(f"scorer.json: unsafe model file name {m!r}")
                models.append((folder / m).read_text(encoding="utf-8"))
            else:
                models.append(float(m))
        return cls(models, int(d["n_features"]))


def _scorer_from_dict(d: dict, folder: Path) -> "LinearScorer | TreeScorer":
    if d.get("kind") == TreeScorer.kind:
        return TreeScorer.from_dict(d, folder)
    return LinearScorer.from_dict(d)


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
        return np.maximum(out, self.floor)

    def predict_one(self, n_chars: int, suite_pos: int, topic_pos: int = -1) -> np.ndarray:
        out = self.coef[0] + (n_chars / 1000.0) * self.coef[1]
        if suite_pos >= 0:
            out = out + self.coef[2 + suite_pos]
        if self.topic_coef is not None and topic_pos >= 0:
            out = out + self.topic_coef[topic_pos]
        return np.maximum(out, self.floor)

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
    """A uniform number in [0, 1) fixed by the request: mixes pick their member with it."""
    digest = hashlib.blake2b(f"{suite or ''}\x00{prompt}".encode("utf-8", "replace"), digest_size=8).digest()
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
    def predict(
        self, prompts: Sequence[str], suites: Sequence[str | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Calibrated pass probabilities and predicted costs, each (n, K)."""
        suites = list(suites) if suites is not None else [None] * len(prompts)
        if len(suites) != len(prompts):
            raise ValueError(f"got {len(prompts)} prompts but {len(suites)} suites")
        n_suites = len(self.spec.suites)
        pos = np.array([self.spec.suite_positions.get(s, -1) if s else -1 for s in suites], dtype=int)
        z = np.empty((len(prompts), len(self.candidates)))
        topic = np.full(len(prompts), -1)
        embeddings = [None] * len(prompts)
        if self.spec.embeddings and len(prompts) > 1:
            from router_training.embeddings import embed  # optional extra; batched is faster

            embeddings = list(embed(list(prompts)))
        if isinstance(self.scorer, TreeScorer):
            z[:] = self.scorer.logits_many(
                [request_features(p, s, self.spec, e) for p, s, e in zip(prompts, suites, embeddings)])
        else:
            for i, (prompt, suite) in enumerate(zip(prompts, suites)):
                ids, vals = request_features(prompt, suite, self.spec, embeddings[i])
                z[i], topic[i] = self.scorer.score(ids, vals, pos[i] if pos[i] >= 0 else n_suites)
        p = _sigmoid(self.platt[0] * z + self.platt[1])
        c = self.cost_model.predict(np.array([len(x) for x in prompts]), pos, topic)
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
        u = np.array([request_unit(x, s) for x, s in zip(prompts, suites)])
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
        n_suites = len(self.spec.suites)
        pos = self.spec.suite_positions.get(suite, -1) if suite else -1
        ids, vals = request_features(prompt, suite, self.spec)
        z, topic = self.scorer.score(ids, vals, pos if pos >= 0 else n_suites)
        p = _sigmoid(self.platt[0] * z + self.platt[1])
        c = self.cost_model.predict_one(len(prompt), pos, topic)
        point = self.point_for(quality_target)
        pick, prop = self._select(point, p[None], c[None], [prompt], [suite])
        return self._decision(pick[0], prop[0], p, c, self._fallback_param(point))

    def _decision(self, pick: int, prop: float, p: np.ndarray, c: np.ndarray, lam: float) -> Decision:
        """The decision for one request; fallbacks in the order of `p - lam * cost`."""
        names = self.candidates
        order = [j for j in choose(p[None], c[None], "lambda", lam)[0].tolist() if j != pick]
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
    def _header(self) -> dict:
        return {
            "format_version": FORMAT_VERSION,
            "candidates": list(self.candidates),
            "knob": self.knob.to_dict(),
            "reference_pass_rate": float(self.reference_pass_rate),
            "reference_model": self.reference_model,
            "quality_target": float(self.quality_target),
            "platt": self.platt.tolist(),
            "cost_model": self.cost_model.to_dict(),
            "metrics": self.metrics,
            "files": {"features": "features.json", "scorer": "scorer.json"},
        }

    def save(self, folder: Path) -> list[str]:
        """Write policy.json, features.json, scorer.json and, for a LightGBM scorer, one
        lgbm_<j>.txt per candidate in LightGBM's text format (no pickle; atomically)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / "features.json", json.dumps(self.spec.to_dict()))
        extra: list[str] = []
        if isinstance(self.scorer, TreeScorer):
            extra = self.scorer.file_names()
            texts = [m for m in self.scorer.texts if not isinstance(m, float)]
            for name, text in zip(extra, texts):
                atomic_write(folder / name, text)
        atomic_write(folder / "scorer.json", json.dumps(self.scorer.to_dict()))
        atomic_write(folder / "policy.json", json.dumps(self._header(), indent=1, sort_keys=True))
        return ["policy.json", "features.json", "scorer.json", *extra]

    @classmethod
    def load(cls, folder: Path) -> "RoutingPolicy":
        """Read a policy folder; format 1 policies (a rule and its table) load as a knob too."""
        folder = Path(folder)
        try:
            head = json.loads((folder / "policy.json").read_text(encoding="utf-8"))
            version = head.get("format_version")
            if version not in READABLE_VERSIONS:
                raise _FormatError(
                    f"{folder / 'policy.json'}: format_version {version!r} is not supported by this "
                    f"build (reads {', '.join(map(str, READABLE_VERSIONS))})")
            files = head["files"]
            spec = FeatureSpec.from_dict(json.loads((folder / files["features"]).read_text()))
            scorer = _scorer_from_dict(json.loads((folder / files["scorer"]).read_text()), folder)
            ref_rate = float(head["reference_pass_rate"])
            if version == 1:
                knob = Knob.from_table(head["rule"], [(float(a), float(b)) for a, b in head["table"]], ref_rate)
            else:
                knob = Knob.from_dict(head["knob"])
            policy = cls(
                candidates=list(head["candidates"]), spec=spec, scorer=scorer,
                platt=np.asarray(head["platt"], dtype=np.float64),
                cost_model=CostModel.from_dict(head["cost_model"]), knob=knob,
                reference_pass_rate=ref_rate, reference_model=head["reference_model"],
                quality_target=float(head["quality_target"]), metrics=head.get("metrics", {}),
            )
        except _FormatError as e:
            raise ValueError(str(e)) from None
        except (OSError, KeyError, ValueError, TypeError, IndexError) as e:
            raise ValueError(f"{folder}: not a readable routing policy ({e})") from e
        policy._check_members()
        return policy

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
        if isinstance(self.scorer, TreeScorer):
            return {"kind": TreeScorer.kind, "n_features": self.scorer.n_features,
                    "files": self.scorer.file_names()}
        return {"kind": "difficulty-linear", "shape": list(self.scorer.weights.shape)}


class _FormatError(ValueError):
    """A policy written by a newer (or unknown) format."""
