"""A routing policy on disk: format 3 (docs/policy-format.md) is written; 3, 2 and 1 are read.

Format 3 is the language-neutral one: `policy.json` holds the structure (candidates, suites,
feature settings, scorer kind, the knob) and small scalars as JSON numbers (shortest round-trip
decimals, read back exactly); `arrays.safetensors` holds every array as little-endian binary
(the scorer's weight matrix as float32, everything else as float64); `conformance.safetensors`
holds the vectors each runtime checks itself against, computed here by reloading the written
files, so they describe exactly what a gateway will read. Formats 2 and 1 (JSON arrays,
LightGBM text files) still load; their LightGBM models become portable trees on the way in.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from routeopt.common.io import atomic_write
from routeopt.router_training.policy.features import EMBEDDING_DIM, MAX_BYTES, STAT_NAMES, FeatureSpec
from routeopt.router_training.policy.knob import Knob
from routeopt.router_training.policy.latency import KINDS, QUANTILES, BudgetTier, LatencyModel, LatencyPolicy
from routeopt.router_training.policy.scorer import CostModel, LinearScorer
from routeopt.router_training.policy.tensors import ContainerError, dumps, loads, require
from routeopt.router_training.policy.trees import TreeFormatError, TreeScorer

if TYPE_CHECKING:
    from routeopt.router_training.policy.routing import RoutingPolicy

FORMAT_VERSION = 3
LATENCY_FORMAT_VERSION = 4  # format 3 and a latency section: written only where a policy has one
READABLE_VERSIONS = (1, 2, 3, 4)
ARRAYS_NAME = "arrays.safetensors"
VECTORS_NAME = "conformance.safetensors"
LINEAR_KIND = "difficulty-linear"
EMBEDDINGS_NOT_PORTABLE = (
    "the features include MiniLM sentence embeddings (routeopt train --embeddings): a neural "
    "network whose floating-point results depend on torch and the CPU, so no runtime can "
    "reproduce them bit for bit; only Python gateways with the 'embeddings' extra serve it"
)


class PolicyFormatError(ValueError):
    """A policy folder that cannot be read; the message names the file and the field."""


def not_portable_reason(policy: RoutingPolicy) -> str | None:
    return EMBEDDINGS_NOT_PORTABLE if policy.spec.embeddings else None


def written_version(policy: RoutingPolicy) -> int:
    """The oldest format that holds the policy: 4 where it carries a latency section, else 3,
    so a runtime that cannot serve latency budgets refuses such a policy instead of ignoring it."""
    return LATENCY_FORMAT_VERSION if policy.latency is not None else FORMAT_VERSION


def format_info(policy: RoutingPolicy) -> dict[str, Any]:
    """What the manifest records about the policy's format."""
    reason = not_portable_reason(policy)
    return {
        "version": written_version(policy),
        "portable": reason is None,
        "not_portable": reason,
        "conformance": VECTORS_NAME,
        "spec": "docs/policy-format.md",
    }


# -- writing ----------------------------------------------------------------------------------


def _header(policy: RoutingPolicy) -> dict[str, Any]:
    spec, scorer = policy.spec, policy.scorer
    features: dict[str, Any] = {
        "suites": list(spec.suites),
        "n_buckets": spec.n_buckets,
        "char_ngrams": list(spec.char_ngrams),
        "word_bigrams": spec.word_bigrams,
        "max_bytes": MAX_BYTES,
        "stats": list(STAT_NAMES),
        "embeddings": spec.embeddings,
        "idf": spec.idf is not None,
        "stat_scaling": spec.stat_mean is not None,
    }
    if isinstance(scorer, LinearScorer):
        topics = 0 if scorer.centroids is None else int(scorer.centroids.shape[0])
        rank = 0 if scorer.centroids is None else int(scorer.centroids.shape[1])
        scorer_head: dict[str, Any] = {
            "kind": LINEAR_KIND,
            "difficulty_bias": float(scorer.difficulty_bias),
            "topics": topics,
            "rank": rank,
        }
    else:
        scorer_head = {"kind": TreeScorer.kind, "n_features": scorer.n_features}
    reason = not_portable_reason(policy)
    head = {
        "format_version": written_version(policy),
        "portable": reason is None,
        "not_portable": reason,
        "candidates": list(policy.candidates),
        "features": features,
        "scorer": scorer_head,
        "cost": {"topics": policy.cost_model.topic_coef is not None},
        "knob": policy.knob.to_dict(),
        "reference_pass_rate": float(policy.reference_pass_rate),
        "reference_model": policy.reference_model,
        "quality_target": float(policy.quality_target),
        "metrics": policy.metrics,
        "files": {"arrays": ARRAYS_NAME, "conformance": VECTORS_NAME},
    }
    if policy.latency is not None:
        head["latency"] = policy.latency.header()
    return head


def _arrays(policy: RoutingPolicy) -> dict[str, np.ndarray]:
    spec, scorer, cost = policy.spec, policy.scorer, policy.cost_model
    out: dict[str, np.ndarray] = {
        "calibration.platt": np.asarray(policy.platt, dtype=np.float64),
        "cost.coef": cost.coef,
        "cost.floor": cost.floor,
    }
    if cost.topic_coef is not None:
        out["cost.topic_coef"] = cost.topic_coef
    if policy.latency is not None:
        out.update(policy.latency.arrays())
    if spec.idf is not None:
        out["features.idf"] = spec.idf_array
    if spec.stat_mean is not None:
        out["features.stat_mean"], out["features.stat_std"] = spec.stat_mean_array, spec.stat_std_array
    if isinstance(scorer, LinearScorer):
        out["scorer.weights"] = scorer.weights.astype(np.float32)
        out["scorer.bias"], out["scorer.slopes"] = scorer.bias, scorer.slopes
        if scorer.centroids is not None:
            topic_bias, topic_slopes, topic_difficulty = scorer.topic_arrays()
            out.update(
                {
                    "scorer.centroids": scorer.centroids,
                    "scorer.topic_bias": topic_bias,
                    "scorer.topic_slopes": topic_slopes,
                    "scorer.topic_difficulty": topic_difficulty,
                }
            )
    else:
        out.update(scorer.arrays())
    return {k: np.ascontiguousarray(v) for k, v in out.items()}


def write_policy_files(policy: RoutingPolicy, folder: Path) -> list[str]:
    """Write format 3's arrays and policy.json (`RoutingPolicy.save` adds the conformance
    vectors of the policy as read back from them)."""
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write(
        folder / ARRAYS_NAME,
        dumps(_arrays(policy), {"format": f"routeopt.arrays/{written_version(policy)}"}),
    )
    atomic_write(
        folder / "policy.json", json.dumps(_header(policy), indent=1, sort_keys=True, allow_nan=False)
    )
    return ["policy.json", ARRAYS_NAME]


# -- reading ----------------------------------------------------------------------------------


def read_policy_files(folder: Path, vectors: bool = True) -> dict[str, Any]:
    """The fields of the `RoutingPolicy` in a folder of any readable format; format 3 keeps its
    vectors' bytes for `self_check`."""
    where = folder / "policy.json"
    try:
        head = json.loads(where.read_text(encoding="utf-8"))
        version = head.get("format_version") if isinstance(head, dict) else None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError(f"{folder}: not a readable routing policy ({e})") from None
    if version not in READABLE_VERSIONS:
        raise ValueError(
            f"{where}: format_version {version!r} is not supported by this build "
            f"(reads {', '.join(map(str, READABLE_VERSIONS))})"
        )
    try:
        policy = _load_v3(folder, head, vectors) if version >= 3 else _load_v2(folder, head, version)
    except PolicyFormatError as e:
        raise ValueError(str(e)) from None
    except (OSError, KeyError, ValueError, TypeError, IndexError) as e:
        raise ValueError(f"{folder}: not a readable routing policy ({e})") from e
    return {**policy, "format_version": version}


def _common(head: dict[str, Any], knob: Knob, **parts: Any) -> dict[str, Any]:
    return dict(
        candidates=[str(c) for c in head["candidates"]],
        knob=knob,
        reference_pass_rate=float(head["reference_pass_rate"]),
        reference_model=str(head["reference_model"]),
        quality_target=float(head["quality_target"]),
        metrics=head.get("metrics") or {},
        **parts,
    )


def _load_v2(folder: Path, head: dict[str, Any], version: int) -> dict[str, Any]:
    files = head["files"]
    spec = FeatureSpec.from_dict(json.loads((folder / files["features"]).read_text()))
    scorer = _v2_scorer(json.loads((folder / files["scorer"]).read_text()), folder)
    ref_rate = float(head["reference_pass_rate"])
    if version == 1:
        knob = Knob.from_table(head["rule"], [(float(a), float(b)) for a, b in head["table"]], ref_rate)
    else:
        knob = Knob.from_dict(head["knob"])
    return _common(
        head,
        knob,
        spec=spec,
        scorer=scorer,
        platt=np.asarray(head["platt"], dtype=np.float64),
        cost_model=CostModel.from_dict(head["cost_model"]),
    )


def _v2_scorer(d: dict[str, Any], folder: Path) -> LinearScorer | TreeScorer:
    if d.get("kind") != "lightgbm":
        return LinearScorer.from_dict(d)
    models: list[str | float] = []
    for m in d["models"]:
        if isinstance(m, str):
            if Path(m).name != m or not m.startswith("lgbm_"):
                raise PolicyFormatError(f"{folder / 'scorer.json'}: unsafe model file name {m!r}")
            models.append((folder / m).read_text(encoding="utf-8"))
        else:
            models.append(float(m))
    try:
        return TreeScorer.from_models(models, int(d["n_features"]))
    except (TreeFormatError, KeyError, ValueError) as e:
        raise PolicyFormatError(f"{folder}: a LightGBM model file does not parse ({e})") from None


def _load_v3(folder: Path, head: dict[str, Any], vectors: bool) -> dict[str, Any]:
    files = head["files"]
    where = str(folder / files["arrays"])
    if files["arrays"] != ARRAYS_NAME or files["conformance"] != VECTORS_NAME:
        raise PolicyFormatError(f"{folder / 'policy.json'}: files must be {ARRAYS_NAME} and {VECTORS_NAME}")
    try:
        arrays, _ = loads((folder / files["arrays"]).read_bytes(), where)
        policy = _from_arrays(head, arrays, where)
    except ContainerError as e:
        raise PolicyFormatError(str(e)) from None
    if vectors:
        try:
            policy["vectors"] = (folder / VECTORS_NAME).read_bytes()
        except FileNotFoundError:
            raise PolicyFormatError(
                f"{folder}: {VECTORS_NAME} is missing; a format 3 policy ships its conformance vectors"
            ) from None
    return policy


def _spec(head: dict[str, Any], arrays: dict[str, np.ndarray], where: str) -> FeatureSpec:
    f = head["features"]
    if int(f["max_bytes"]) != MAX_BYTES or list(f["stats"]) != list(STAT_NAMES):
        raise PolicyFormatError(
            f"{where}: features.max_bytes / stats differ from this build's "
            f"({MAX_BYTES}, {len(STAT_NAMES)} statistics)"
        )
    b, n_stats = int(f["n_buckets"]), len(STAT_NAMES)
    if not 1 <= b <= 1 << 24:
        raise PolicyFormatError(f"{where}: features.n_buckets {b} is outside 1 .. 2**24")
    idf = require(arrays, "features.idf", "F64", (b,), where) if f["idf"] else None
    mean = require(arrays, "features.stat_mean", "F64", (n_stats,), where) if f["stat_scaling"] else None
    std = require(arrays, "features.stat_std", "F64", (n_stats,), where) if f["stat_scaling"] else None
    if std is not None and not (np.isfinite(std).all() and (std != 0).all()):
        raise PolicyFormatError(f"{where}: features.stat_std must be finite and non-zero")

    def tup(a: np.ndarray | None) -> tuple[float, ...] | None:
        return None if a is None else tuple(float(v) for v in a)

    return FeatureSpec(
        suites=tuple(str(s) for s in f["suites"]),
        n_buckets=b,
        char_ngrams=tuple(int(n) for n in f["char_ngrams"]),
        word_bigrams=bool(f["word_bigrams"]),
        idf=tup(idf),
        stat_mean=tup(mean),
        stat_std=tup(std),
        embeddings=bool(f["embeddings"]),
    )


def _from_arrays(head: dict[str, Any], arrays: dict[str, np.ndarray], where: str) -> dict[str, Any]:
    spec = _spec(head, arrays, where)
    k, s = len(head["candidates"]), len(spec.suites)
    n_features = s + spec.n_buckets + len(STAT_NAMES) + (EMBEDDING_DIM if spec.embeddings else 0)
    sc = head["scorer"]
    scorer: LinearScorer | TreeScorer
    if sc.get("kind") == LINEAR_KIND:
        scorer, topics = _linear(sc, arrays, where, k, s, n_features), int(sc["topics"])
    elif sc.get("kind") == TreeScorer.kind:
        if int(sc["n_features"]) != n_features:
            raise PolicyFormatError(f"{where}: scorer.n_features {sc['n_features']} != {n_features}")
        scorer, topics = _trees(arrays, where, k, n_features), 0
    else:
        raise PolicyFormatError(
            f"{where}: unknown scorer kind {sc.get('kind')!r}; this build reads "
            f"{LINEAR_KIND!r} and {TreeScorer.kind!r}"
        )
    has_topic_cost = bool(head["cost"]["topics"])
    cost = CostModel(
        coef=np.array(require(arrays, "cost.coef", "F64", (2 + s, k), where)),
        floor=np.array(require(arrays, "cost.floor", "F64", (k,), where)),
        topic_coef=np.array(require(arrays, "cost.topic_coef", "F64", (topics, k), where))
        if has_topic_cost
        else None,
    )
    platt = np.array(require(arrays, "calibration.platt", "F64", (2, k), where))
    for name, a in (("calibration.platt", platt), ("cost.coef", cost.coef), ("cost.floor", cost.floor)):
        if not np.isfinite(a).all():
            raise PolicyFormatError(f"{where}: {name} holds a non-finite number")
    latency = (
        _latency(head, arrays, where, k, s) if head["format_version"] == LATENCY_FORMAT_VERSION else None
    )
    return _common(
        head,
        Knob.from_dict(head["knob"]),
        spec=spec,
        scorer=scorer,
        platt=platt,
        cost_model=cost,
        latency=latency,
    )


def _latency(
    head: dict[str, Any], arrays: dict[str, np.ndarray], where: str, k: int, s: int
) -> LatencyPolicy:
    """Format 4's latency section: the models' arrays and the certified tiers."""
    d = head.get("latency")
    if not isinstance(d, dict):
        raise PolicyFormatError(f"{where}: a format 4 policy needs its latency section in policy.json")
    models = {}
    for kind, quantile in d["models"]:
        if kind not in KINDS or quantile not in QUANTILES:
            raise PolicyFormatError(f"{where}: unknown latency model {kind!r} {quantile!r}")
        name = f"latency.{kind}.{quantile}"
        m = CostModel(
            coef=np.array(require(arrays, name + ".coef", "F64", (2 + s, k), where)),
            floor=np.array(require(arrays, name + ".floor", "F64", (k,), where)),
        )
        if not (np.isfinite(m.coef).all() and np.isfinite(m.floor).all()):
            raise PolicyFormatError(f"{where}: {name} holds a non-finite number")
        models[kind, quantile] = m
    model = LatencyModel(models)
    tiers = [BudgetTier.from_dict(t) for t in d["tiers"]]
    missing = sorted({t.kind for t in tiers} - set(model.kinds))
    if missing:
        raise PolicyFormatError(f"{where}: latency tiers of kind {missing[0]!r} but no p95 model for it")
    defaults = {}
    raw = d.get("defaults") or {}
    if not isinstance(raw, dict):
        raise PolicyFormatError(f"{where}: latency.defaults must be an object of suite: [kind, seconds]")
    for suite, value in raw.items():
        if not (
            isinstance(value, list)
            and len(value) == 2
            and value[0] in KINDS
            and isinstance(value[1], (int, float))
            and not isinstance(value[1], bool)
        ):
            raise PolicyFormatError(f"{where}: latency.defaults[{suite!r}] must be [kind, seconds]")
        defaults[str(suite)] = (str(value[0]), float(value[1]))
    try:
        return LatencyPolicy(model, float(d["alpha"]), tiers, d.get("metrics") or {}, defaults)
    except ValueError as e:
        raise PolicyFormatError(f"{where}: {e}") from None


def _linear(
    sc: dict[str, Any], arrays: dict[str, np.ndarray], where: str, k: int, s: int, n_features: int
) -> LinearScorer:
    g, rank = int(sc["topics"]), int(sc["rank"])
    w = require(arrays, "scorer.weights", "F64|F32", (n_features, k + 1 + rank), where)

    def get(name: str, shape: tuple[int, ...]) -> np.ndarray:
        return np.array(require(arrays, name, "F64", shape, where))

    topic = g > 0
    bias = float(sc["difficulty_bias"])
    if not math.isfinite(bias) or not np.isfinite(w).all():
        raise PolicyFormatError(f"{where}: the scorer holds a non-finite number")
    return LinearScorer(
        weights=np.array(w),
        bias=get("scorer.bias", (k,)),
        difficulty_bias=bias,
        slopes=get("scorer.slopes", (s + 1, k)),
        centroids=get("scorer.centroids", (g, rank)) if topic else None,
        topic_bias=get("scorer.topic_bias", (g, k)) if topic else None,
        topic_slopes=get("scorer.topic_slopes", (g, k)) if topic else None,
        topic_difficulty=get("scorer.topic_difficulty", (g,)) if topic else None,
    )


def _trees(arrays: dict[str, np.ndarray], where: str, k: int, n_features: int) -> TreeScorer:
    types = {"threshold": "F64", "leaf_value": "F64", "default_left": "U8", "missing": "U8"}
    got: dict[str, np.ndarray] = {}
    for name in (
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
    ):
        got[f"scorer.trees.{name}"] = np.array(
            require(arrays, f"scorer.trees.{name}", types.get(name, "I32"), (None,), where)
        )
    got["scorer.constant"] = np.array(require(arrays, "scorer.constant", "F64", (k,), where))
    got["scorer.has_trees"] = np.array(require(arrays, "scorer.has_trees", "U8", (k,), where))
    try:
        return TreeScorer.from_arrays(got, n_features)
    except ValueError as e:
        raise PolicyFormatError(f"{where}: {e}") from None
