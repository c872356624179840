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

from routeopt.router_training.policy.numerics import ordered_row_sum, ordered_sum


def assign_clusters(Z: np.ndarray, centroids: np.ndarray) -> np.ndarray:
    """Nearest centroid (cosine: rows of Z are compared after scaling to unit length)."""
    Z = np.atleast_2d(Z)
    norm = np.sqrt(np.einsum("ij,ij->i", Z, Z))[:, None]
    unit = Z / np.where(norm > 0, norm, 1.0)
    nearest = np.argmax(unit @ centroids.T - 0.5 * np.einsum("ij,ij->i", centroids, centroids), axis=1)
    return cast(np.ndarray, nearest)


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
            self._centroids_t = np.ascontiguousarray(self.centroids.T)  # topic()'s rows, in C order

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        """Logits of every candidate and the request's topic (-1 without topics).

        r = sum over the row's features, in column order, of value x weight row (the spec's
        "Scorer": a fixed order, so every runtime gets the same bits)."""
        r = ordered_row_sum(
            vals[:, None] * np.take(self.weights, ids, axis=0)
        )  # take: ~3x faster than fancy indexing
        k = len(self.bias)
        out = r[:k] + self.bias
        slope = self.slopes[suite_pos]
        g, d = -1, r[k] + self.difficulty_bias
        if self.centroids is not None:
            g = self.topic(r[k + 1 :])
            topic_bias, topic_slopes, topic_difficulty = self.topic_arrays()
            out = out + topic_bias[g]
            slope = slope + topic_slopes[g]
            d = d + topic_difficulty[g]
        return out + d * slope, g

    def topic_arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(topic_bias, topic_slopes, topic_difficulty) of a scorer with topics: all three come
        with the centroids."""
        bias, slopes, difficulty = self.topic_bias, self.topic_slopes, self.topic_difficulty
        assert bias is not None and slopes is not None and difficulty is not None
        return bias, slopes, difficulty

    def topic(self, z: np.ndarray) -> int:
        """The nearest centroid to z scaled to unit length: the first g maximising
        centroid_g . z_unit - |centroid_g|^2 / 2."""
        norm = math.sqrt(ordered_sum(z * z))
        unit = z / norm if norm > 0 else z
        return int(np.argmax(ordered_row_sum(self._centroids_t * unit[:, None]) - self._half_norms))

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

    def predict_one(self, n_chars: int, suite_pos: int, topic_pos: int = -1) -> np.ndarray:
        out = self.coef[0] + (n_chars / 1000.0) * self.coef[1]
        if suite_pos >= 0:
            out = out + self.coef[2 + suite_pos]
        if self.topic_coef is not None and topic_pos >= 0:
            out = out + self.topic_coef[topic_pos]
        return np.where(out < self.floor, self.floor, out)

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
