"""The scorer and the cost model: a request's sparse feature row -> logits, topic and costs.

`LinearScorer` is the linear difficulty model (the default estimator's output); the LightGBM
estimator's scorer is `routeopt.router_training.policy.trees.TreeScorer`. Sums follow the spec's
order (routeopt.router_training.policy.numerics), so every runtime gets the same bits.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from routeopt.router_training.policy.numerics import ordered_row_sum


def assign_clusters(Z: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid (cosine: rows of Z are compared after scaling to unit length)."""
    Z = np.atleast_2d(Z)
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))[:, None]
    unit = Z / np.where(norm > 0, norm, 1.0)
    nearest = np.argmax(unit @ centroids.T - 0.5 * np.einsum("ij,ij->i", centroids, centroids), axis=1)
    return cast(np.ndarray, nearest)


def _ordered_dot(a: list[float], b: list[float]) -> float:
    """a[0] b[0] + a[1] b[1] + ... left to right (0.0 when empty)."""
    if not a:
        return 0.0
    s = a[0] * b[0]
    for x, y in zip(a[1:], b[1:]):
        s = s + x * y
    return s


def _nearest(z: list[float], centroids: list[list[float]], half_norms: list[float]) -> int:
    """The nearest centroid to z scaled to unit length: the first g maximising
    centroid_g . z_unit - |centroid_g|^2 / 2."""
    norm = math.sqrt(_ordered_dot(z, z))
    unit = [v / norm for v in z] if norm > 0 else z
    sims = [_ordered_dot(c, unit) - h for c, h in zip(centroids, half_norms)]
    return sims.index(max(sims))


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
            raise ValueError(
                f"scorer weights have {self.weights.shape[1]} columns; expected "
                f"{k + 1 + self.centroids.shape[1]} for {k} candidates and the topic projection"
            )
        if self.centroids is not None:
            self._half_norms = 0.5 * ordered_row_sum((self.centroids * self.centroids).T)

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        """Logits of every candidate and the request's topic (-1 without topics).

        r = sum over the row's features, in column order, of value x weight row (the spec's
        "Scorer": a fixed order, so every runtime gets the same bits)."""
        r = ordered_row_sum(
            vals[:, None] * np.take(self.weights, ids, axis=0)
        )  # take: ~3x faster than fancy indexing
        z, g = self.from_sums(r, suite_pos)
        return np.array(z), g

    def from_sums(self, r: np.ndarray, suite_pos: int) -> tuple[list[float], int]:
        """`score` from the row sums r (one per weight column; the kernel may compute them) with
        Python's floats: a request's dozen numbers, in the batch path's operations and order."""
        bias, slopes, difficulty_bias, topics = self._lists()
        rs = r.tolist()
        k = len(bias)
        out = [a + b for a, b in zip(rs, bias)]
        slope, d, g = slopes[suite_pos], rs[k] + difficulty_bias, -1
        if topics is not None:
            columns, half_norms, topic_bias, topic_slopes, topic_difficulty = topics
            g = _nearest(rs[k + 1 :], columns, half_norms)
            out = [a + b for a, b in zip(out, topic_bias[g])]
            slope = [a + b for a, b in zip(slope, topic_slopes[g])]
            d = d + topic_difficulty[g]
        return [a + d * b for a, b in zip(out, slope)], g

    def _lists(self) -> tuple[list[float], list[list[float]], float, Any]:
        """The scorer's small arrays as Python floats, made on first use."""
        cached = self.__dict__.get("_as_lists")
        if cached is None:
            topics = None
            if self.centroids is not None:
                topic_bias, topic_slopes, topic_difficulty = self.topic_arrays()
                topics = (
                    self.centroids.tolist(),
                    self._half_norms.tolist(),
                    topic_bias.tolist(),
                    topic_slopes.tolist(),
                    topic_difficulty.tolist(),
                )
            cached = (self.bias.tolist(), self.slopes.tolist(), float(self.difficulty_bias), topics)
            self.__dict__["_as_lists"] = cached
        return cast(tuple[list[float], list[list[float]], float, Any], cached)

    def topic_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(topic_bias, topic_slopes, topic_difficulty) of a scorer with topics: all three come
        with the centroids."""
        bias, slopes, difficulty = self.topic_bias, self.topic_slopes, self.topic_difficulty
        assert bias is not None and slopes is not None and difficulty is not None
        return bias, slopes, difficulty

    def logits(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> np.ndarray:
        return self.score(ids, vals, suite_pos)[0]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "kind": "difficulty-linear",
            "shape": list(self.weights.shape),
            "bias": self.bias.tolist(),
            "difficulty_bias": float(self.difficulty_bias),
            "slopes": self.slopes.tolist(),
            "weights": np.round(self.weights.ravel(), 7).tolist(),
        }
        if self.centroids is not None:
            topic_bias, topic_slopes, topic_difficulty = self.topic_arrays()
            d["topics"] = {
                "centroids": self.centroids.tolist(),
                "bias": topic_bias.tolist(),
                "slopes": topic_slopes.tolist(),
                "difficulty": topic_difficulty.tolist(),
            }
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "LinearScorer":
        if d.get("kind") != "difficulty-linear":
            raise ValueError(f"unknown scorer kind {d.get('kind')!r}; this build reads 'difficulty-linear'")
        topics = d.get("topics")

        def arr(v: Any) -> np.ndarray:
            return np.asarray(v, dtype=np.float64)

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

    def predict(
        self, n_chars: np.ndarray, suite_pos: np.ndarray, topic_pos: np.ndarray | None = None
    ) -> np.ndarray:
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

    def predict_one(self, n_chars: int, suite_pos: int, topic_pos: int = -1) -> list[float]:
        """`predict` of one request with Python's floats (the same operations, in order)."""
        coef, floor, topic_coef = self._lists()
        kchars = n_chars / 1000.0
        out = [a + kchars * b for a, b in zip(coef[0], coef[1])]
        if suite_pos >= 0:
            out = [a + b for a, b in zip(out, coef[2 + suite_pos])]
        if topic_coef is not None and topic_pos >= 0:
            out = [a + b for a, b in zip(out, topic_coef[topic_pos])]
        return [f if a < f else a for a, f in zip(out, floor)]

    def _lists(self) -> tuple[list[list[float]], list[float], list[list[float]] | None]:
        cached = self.__dict__.get("_as_lists")
        if cached is None:
            topic = None if self.topic_coef is None else self.topic_coef.tolist()
            cached = (self.coef.tolist(), self.floor.tolist(), topic)
            self.__dict__["_as_lists"] = cached
        return cast(tuple[list[list[float]], list[float], list[list[float]] | None], cached)

    def to_dict(self) -> dict[str, Any]:
        d = {"coef": self.coef.tolist(), "floor": self.floor.tolist()}
        if self.topic_coef is not None:
            d["topic_coef"] = self.topic_coef.tolist()
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "CostModel":
        topic = d.get("topic_coef")
        return cls(
            coef=np.asarray(d["coef"], dtype=np.float64),
            floor=np.asarray(d["floor"], dtype=np.float64),
            topic_coef=None if topic is None else np.asarray(topic, dtype=np.float64),
        )
