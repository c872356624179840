"""LightGBM scorers as portable arrays: every runtime evaluates the same trees to the same bits.

`routeopt train --estimator lightgbm` fits one booster per candidate with lightgbm; the policy
keeps only what prediction needs, read from LightGBM's text format (no lightgbm import here):
per node a feature, a threshold, where a missing value goes, the two children, and per tree its
leaf values. The spec's "Scorer: trees" section states the walk (LightGBM's numerical decision:
`value <= threshold` goes left, with LightGBM's zero-as-missing rule) and the sum of the trees in
their order, starting from 0.0, as LightGBM's own predictor adds them; tests check the result
bit for bit against lightgbm.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

from routeopt.router_training.policy.numerics import ordered_row_sum

ZERO_THRESHOLD = float(np.float32(1e-35))  # LightGBM's kZeroThreshold, a float widened to double
MISSING_NONE, MISSING_ZERO, MISSING_NAN = 0, 1, 2
_CATEGORICAL, _DEFAULT_LEFT = 1, 2


class TreeFormatError(ValueError):
    """A LightGBM model this format cannot carry (categorical or linear trees, several classes)."""


@dataclass
class Forest:
    """All trees of all candidates, flattened. Node children: >= 0 a node of the same tree,
    < 0 the leaf ~child of that tree. `tree_start[k]:tree_start[k+1]` are candidate k's trees."""

    feature: np.ndarray  # int32 per node
    threshold: np.ndarray  # float64 per node
    default_left: np.ndarray  # uint8 per node
    missing: np.ndarray  # uint8 per node: 0 none, 1 zero, 2 NaN
    left: np.ndarray  # int32 per node
    right: np.ndarray
    leaf_value: np.ndarray  # float64 per leaf
    node_start: np.ndarray  # int32 per tree + 1
    leaf_start: np.ndarray  # int32 per tree + 1
    tree_start: np.ndarray  # int32 per candidate + 1

    ARRAYS = (
        "feature",
        "threshold",
        "default_left",
        "missing",
        "left",
        "right",
        "leaf_value",
        "node_start",
        "leaf_start",
        "tree_start",
    )


def _values(block: dict[str, str], key: str, kind: type[int] | type[float], n: int) -> list[Any]:
    raw = block.get(key, "").split()
    if len(raw) != n:
        raise TreeFormatError(f"tree field {key}: {len(raw)} values, expected {n}")
    return [kind(v) for v in raw]


def parse_lightgbm(text: str) -> list[dict[str, Any]]:
    """The trees of one LightGBM text model: dicts of nodes and leaves, in order."""
    head, _, body = text.partition("\nTree=")
    if not text.startswith("tree\n") or not body or "end of trees" not in body:
        raise TreeFormatError("not a LightGBM text model (no 'tree' header, trees or 'end of trees')")
    header = dict(line.split("=", 1) for line in head.splitlines() if "=" in line)
    if header.get("num_class", "1") != "1" or header.get("num_tree_per_iteration", "1") != "1":
        raise TreeFormatError("multi-class LightGBM models are not portable")
    if "average_output" in head.splitlines():
        raise TreeFormatError("random-forest LightGBM models (average_output) are not portable")
    trees = []
    for chunk in ("Tree=" + body).split("\nTree="):
        chunk = chunk.split("end of trees", 1)[0]
        block = dict(line.split("=", 1) for line in chunk.splitlines() if "=" in line)
        trees.append(_tree(block))
    return trees


def _tree(block: dict[str, str]) -> dict[str, Any]:
    leaves = int(block["num_leaves"])
    if int(block.get("num_cat", "0")) or block.get("is_linear", "0") != "0":
        raise TreeFormatError("categorical or linear LightGBM trees are not portable")
    values = _values(block, "leaf_value", float, leaves)
    n = leaves - 1
    if n == 0:
        return {"nodes": [], "leaves": values}
    types = _values(block, "decision_type", int, n)
    if any(t & _CATEGORICAL for t in types):
        raise TreeFormatError("categorical LightGBM splits are not portable")
    nodes = list(
        zip(
            _values(block, "split_feature", int, n),
            _values(block, "threshold", float, n),
            [int(bool(t & _DEFAULT_LEFT)) for t in types],
            [(t >> 2) & 3 for t in types],
            _values(block, "left_child", int, n),
            _values(block, "right_child", int, n),
        )
    )
    return {"nodes": nodes, "leaves": values}


def build_forest(per_candidate: Sequence[list[dict[str, Any]]]) -> Forest:
    """Flatten each candidate's parsed trees into one Forest."""
    cols: dict[str, list[Any]] = {
        k: [] for k in ("feature", "threshold", "default_left", "missing", "left", "right")
    }
    leaf_value: list[float] = []
    node_start, leaf_start, tree_start = [0], [0], [0]
    for trees in per_candidate:
        for t in trees:
            for node in t["nodes"]:
                for key, v in zip(cols, node):
                    cols[key].append(v)
            leaf_value.extend(t["leaves"])
            node_start.append(node_start[-1] + len(t["nodes"]))
            leaf_start.append(leaf_start[-1] + len(t["leaves"]))
        tree_start.append(tree_start[-1] + len(trees))

    def i32(v: list[int]) -> np.ndarray:
        return np.asarray(v, dtype=np.int32)

    return Forest(
        i32(cols["feature"]),
        np.asarray(cols["threshold"], dtype=np.float64),
        np.asarray(cols["default_left"], dtype=np.uint8),
        np.asarray(cols["missing"], dtype=np.uint8),
        i32(cols["left"]),
        i32(cols["right"]),
        np.asarray(leaf_value, dtype=np.float64),
        i32(node_start),
        i32(leaf_start),
        i32(tree_start),
    )


class TreeScorer:
    """logit_k = the sum of candidate k's trees (LightGBM's raw score), or a constant for a
    candidate with one label. Evaluated here with numpy, all trees of a request stepping at once."""

    kind = "trees"

    def __init__(self, forest: Forest, constants: np.ndarray, has_trees: np.ndarray, n_features: int) -> None:
        self.forest, self.n_features = forest, int(n_features)
        self.texts: list[str | float] | None = None
        self.constants = np.asarray(constants, dtype=np.float64)
        self.has_trees = np.asarray(has_trees, dtype=np.uint8)
        self._check()
        f = forest
        n_trees = len(f.node_start) - 1
        self._root = np.where(np.diff(f.node_start) > 0, 0, -1).astype(
            np.int64
        )  # single-leaf trees start at leaf 0
        self._node_base = f.node_start[:-1].astype(np.int64)
        self._leaf_base = f.leaf_start[:-1].astype(np.int64)
        self._depth = max(1, len(f.feature))
        owner = np.repeat(np.arange(len(self.constants)), np.diff(f.tree_start))
        rank = np.arange(n_trees) - f.tree_start[:-1][owner] if n_trees else np.zeros(0, dtype=int)
        self._slot = (owner, rank)  # where each tree's leaf value goes in the (K, max trees) sum
        self._width = int(np.diff(f.tree_start).max()) if n_trees else 0

    def _check(self) -> None:
        """The arrays must form K lists of binary trees the walk leaves in at most `nodes` steps:
        a node's child nodes have larger indices, every node but the root and every leaf is
        reached exactly once (so a hostile policy cannot loop or read outside the arrays)."""
        f, k = self.forest, len(self.constants)
        if len(f.tree_start) != k + 1 or len(self.has_trees) != k:
            raise ValueError(f"trees: tree_start has {len(f.tree_start)} entries for {k} candidates")
        n_trees, n_nodes, n_leaves = len(f.node_start) - 1, len(f.feature), len(f.leaf_value)
        sizes = [len(getattr(f, a)) for a in ("threshold", "default_left", "missing", "left", "right")]
        if (
            set(sizes) - {n_nodes}
            or f.node_start[-1] != n_nodes
            or f.leaf_start[-1] != n_leaves
            or f.tree_start[0] != 0
            or f.tree_start[-1] != n_trees
            or f.node_start[0] != 0
            or f.leaf_start[0] != 0
        ):
            raise ValueError("trees: node, leaf or tree offsets do not cover the arrays")
        nodes, leaves = np.diff(f.node_start), np.diff(f.leaf_start)
        if (nodes < 0).any() or (leaves != nodes + 1).any() or (np.diff(f.tree_start) < 0).any():
            raise ValueError("trees: every tree must have one leaf more than it has nodes")
        if n_nodes and (f.feature.min() < 0 or f.feature.max() >= self.n_features):
            raise ValueError(f"trees: a split names a feature outside 0..{self.n_features - 1}")
        tree = np.repeat(np.arange(n_trees), nodes)
        local = np.arange(n_nodes) - f.node_start[tree]
        kids, owner, parent = np.concatenate((f.left, f.right)), np.tile(tree, 2), np.tile(local, 2)
        is_node = kids >= 0
        if (
            (kids[is_node] <= parent[is_node]).any()
            or (kids[is_node] >= nodes[owner[is_node]]).any()
            or ((~kids[~is_node]) >= leaves[owner[~is_node]]).any()
        ):
            raise ValueError("trees: a child points outside its tree or back up it")
        node_hits = np.bincount(f.node_start[owner[is_node]] + kids[is_node], minlength=n_nodes)
        leaf_hits = np.bincount(f.leaf_start[owner[~is_node]] + ~kids[~is_node], minlength=n_leaves)
        roots = f.node_start[:-1][nodes > 0]
        want_nodes = np.ones(n_nodes, dtype=int)
        want_nodes[roots] = 0
        want_leaves = np.ones(n_leaves, dtype=int)
        want_leaves[f.leaf_start[:-1][nodes == 0]] = 0
        if not (np.array_equal(node_hits, want_nodes) and np.array_equal(leaf_hits, want_leaves)):
            raise ValueError("trees: a node or leaf is reached twice or never")

    @classmethod
    def from_models(cls, models: Sequence[str | float], n_features: int) -> "TreeScorer":
        """From LightGBM text models (one per candidate) or constant logits (floats)."""
        parsed = [[] if isinstance(m, float) else parse_lightgbm(m) for m in models]
        constants = np.array([m if isinstance(m, float) else 0.0 for m in models])
        has = np.array([not isinstance(m, float) for m in models], dtype=np.uint8)
        scorer = cls(build_forest(parsed), constants, has, n_features)
        scorer.texts = list(models)  # the LightGBM models it came from (not published)
        return scorer

    def logits_dense(self, X: np.ndarray) -> np.ndarray:
        """(n, K) raw scores of dense rows."""
        return np.array([self._raw(row) for row in np.atleast_2d(X)])

    def _raw(self, x: np.ndarray) -> np.ndarray:
        f = self.forest
        node = self._root.copy()
        for _ in range(self._depth):
            active = node >= 0
            if not active.any():
                break
            at = self._node_base[active] + node[active]
            value = x[f.feature[at]]
            missing = f.missing[at]
            nan = np.isnan(value)
            value = np.where(nan & (missing != MISSING_NAN), 0.0, value)
            is_missing = (
                (missing == MISSING_ZERO) & (value >= -ZERO_THRESHOLD) & (value <= ZERO_THRESHOLD)
            ) | ((missing == MISSING_NAN) & nan)
            go_left = np.where(is_missing, f.default_left[at] == 1, value <= f.threshold[at])
            node[active] = np.where(go_left, f.left[at], f.right[at])
        leaf = f.leaf_value[self._leaf_base + ~node] if len(node) else np.zeros(0)
        table = np.zeros((self._width + 1, len(self.constants)))  # row 0: the 0.0 each sum starts from
        table[self._slot[1] + 1, self._slot[0]] = leaf
        return np.where(self.has_trees == 1, ordered_row_sum(table), self.constants)

    def score(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> tuple[np.ndarray, int]:
        x = np.zeros(self.n_features)
        x[ids] = vals
        return self._raw(x), -1

    def logits(self, ids: np.ndarray, vals: np.ndarray, suite_pos: int) -> np.ndarray:
        return self.score(ids, vals, suite_pos)[0]

    def arrays(self) -> dict[str, np.ndarray]:
        out = {f"scorer.trees.{k}": getattr(self.forest, k) for k in Forest.ARRAYS}
        out["scorer.constant"] = self.constants
        out["scorer.has_trees"] = self.has_trees
        return out

    @classmethod
    def from_arrays(cls, arrays: dict[str, np.ndarray], n_features: int) -> "TreeScorer":
        forest = Forest(*(np.asarray(arrays[f"scorer.trees.{k}"]) for k in Forest.ARRAYS))
        return cls(forest, arrays["scorer.constant"], arrays["scorer.has_trees"], n_features)

    def summary(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "n_features": self.n_features,
            "trees": int(len(self.forest.node_start) - 1),
            "nodes": int(len(self.forest.feature)),
        }
