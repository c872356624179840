"""Conformance vectors: each step's expected output for ~2,000 requests, shipped in every policy.

Publishing a policy computes, with this (the reference) implementation, every layer of the spec
for the requests of `routeopt.router_training.policy.conformance_inputs`: bytes after the cut, word hashes,
buckets, the feature vector, scores, probabilities, costs, the knob's draw, the decision at
several targets, and the gateway's exploration and canary draws. A runtime that loads the policy
recomputes them and refuses the policy unless it agrees: integer layers exactly, floats within
`TOLERANCE` relative, decisions exactly. Layers are compared in the spec's order, so a mismatch
names the first step that differs (ONNX's backend tests work this way). The file is a
safetensors container (docs/policy-format.md, "Conformance vectors").
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple, cast

import numpy as np

from routeopt.router_training.policy.conformance_inputs import VectorInput, from_wtf8, vector_inputs, wtf8
from routeopt.router_training.policy.draws import Exploration, choose, derive_key, unit_draw
from routeopt.router_training.policy.batch_features import BatchFeatures, batch_features, batch_predict
from routeopt.router_training.policy.features import mix
from routeopt.router_training.policy.files import FORMAT_VERSION, written_version
from routeopt.router_training.policy.knob import cut_unit, fallback_order, point_choice
from routeopt.router_training.policy.live import LiveLatency, LiveSettings, live_move
from routeopt.router_training.policy.tensors import ContainerError, dumps, loads

if TYPE_CHECKING:
    from routeopt.router_training.policy.routing import RoutingPolicy

FORMAT = "routeopt.conformance/1"
TARGETS = (0.0, 0.5, 0.8, 0.9, 0.95, 0.98, 1.0, 1.1)
SERVING_SAMPLE = 48  # requests the self-check also sends through the one-request path
DETAIL = 128  # requests whose buckets and feature values are stored in full (the rest: digests)
TOLERANCE = 1e-9
GATEWAY_SEED = "conformance"
EXACT, CLOSE = "exact", "close"
# layer -> its tensors and how they compare, in the spec's order
LAYERS: tuple[tuple[str, tuple[tuple[str, str], ...]], ...] = (
    (
        "bytes",
        (
            ("bytes.utf8_len", EXACT),
            ("bytes.n_chars", EXACT),
            ("bytes.newlines", EXACT),
            ("bytes.questions", EXACT),
            ("bytes.cut_digest", EXACT),
        ),
    ),
    ("words", (("words.count", EXACT), ("words.chars", EXACT), ("words.digest", EXACT))),
    ("buckets", (("buckets.distinct", EXACT), ("buckets.total", EXACT), ("buckets.digest", EXACT))),
    ("features", (("features.suite", EXACT), ("features.stats", CLOSE))),
    ("scores", (("scores.logits", CLOSE), ("scores.topic", EXACT))),
    ("calibration", (("calibration.p", CLOSE),)),
    ("cost", (("cost.c", CLOSE),)),
    ("knob", (("knob.point", EXACT), ("knob.unit", EXACT))),
    ("decision", (("decision.model", EXACT), ("decision.fallbacks", EXACT), ("decision.propensity", CLOSE))),
    ("latency", (("latency.pred", CLOSE),)),
    (
        "budget",
        (
            ("budget.model", EXACT),
            ("budget.fallbacks", EXACT),
            ("budget.met", EXACT),
            ("budget.propensity", CLOSE),
        ),
    ),
    ("live", (("live.model", EXACT), ("live.moved", EXACT))),
    (
        "gateway",
        (
            ("gateway.draws", EXACT),
            ("gateway.arm", EXACT),
            ("gateway.model", EXACT),
            ("gateway.explored", EXACT),
            ("gateway.eligible", EXACT),
            ("gateway.propensity", CLOSE),
        ),
    ),
)
TEXT_LAYERS = ("bytes", "words", "buckets", "features")
LATENCY_LAYERS = ("latency", "budget", "live")  # only in the vectors of a policy with a latency section
LIVE_REQUESTS = 64  # requests decided at each checkpoint of the live sequence


@dataclass(frozen=True)
class ConformanceReport:
    """What a runtime's self-check found: `ok`, and if not, the first step that differs."""

    ok: bool
    requests: int = 0
    layers: tuple[str, ...] = ()
    mismatches: dict[str, int] = field(default_factory=dict)
    first: str | None = None
    max_relative_error: float = 0.0
    seconds: float = 0.0
    note: str | None = None

    def summary(self) -> str:
        if self.note and not self.requests:
            return self.note
        if self.ok:
            return (
                f"{self.requests} conformance requests agree at every layer ({', '.join(self.layers)}); "
                f"largest relative float difference {self.max_relative_error:.1e}"
            )
        bad = ", ".join(f"{k} {v}" for k, v in self.mismatches.items() if v)
        return f"conformance vectors disagree ({bad} of {self.requests} requests): {self.first}"


def _digest(data: bytes) -> np.ndarray:
    return np.frombuffer(hashlib.blake2b(data, digest_size=8).digest(), dtype=np.uint8)


DIGEST_SALT = 11


def sequence_digests(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment of u64 values x_0, x_1, ...: the sum mod 2**64 of mix_11(x_i + (i + 1) G),
    G = 0x9E3779B97F4A7C15, as 8 little-endian bytes (section 9: a sum of mixed, position-tagged
    values is order-sensitive and, unlike a hash chain, computed for all segments at once)."""
    values = np.asarray(values, dtype=np.uint64)
    counts = np.diff(offsets)
    pos = (np.arange(len(values)) - np.repeat(offsets[:-1], counts) + 1).astype(np.uint64)
    with np.errstate(over="ignore"):
        mixed = mix(values + pos * np.uint64(0x9E3779B97F4A7C15), DIGEST_SALT)
    padded = np.concatenate((mixed, np.zeros(1, dtype=np.uint64)))
    sums = np.add.reduceat(padded, np.minimum(offsets[:-1], len(values)))  # wrap-around sums: any order
    sums = np.where(counts > 0, sums, np.uint64(0)).astype("<u8")
    return sums.view(np.uint8).reshape(len(counts), 8)


def _gateway_config(policy: RoutingPolicy) -> dict[str, Any]:
    exclude = [policy.candidates[-1]] if len(policy.candidates) > 2 else []
    return {
        "exploration": {
            "rate": 0.2,
            "exclude": exclude,
            "max_cost_usd": None,
            "max_cost_ratio": 4.0,
            "seed": GATEWAY_SEED,
        },
        "canary": {"share": 0.25, "seed": GATEWAY_SEED},
        "quality_target": None,
    }


# -- computing the layers ---------------------------------------------------------------------


def _text_layers(f: BatchFeatures, n_detail: int) -> dict[str, np.ndarray]:
    """The integer layers (with digests of the variable-length parts) and the statistics."""
    t, of = f.text, f.text_of
    if len(t.raw) != len(t.n_chars):
        raise RuntimeError("conformance layers need the texts' bytes and words: not within reuse_text_layers")
    n, t_of = len(of), of
    cut_d = np.zeros((len(t.raw), 8), np.uint8)
    for i in range(len(t.raw)):
        cut_d[i] = _digest(t.cut[t.offsets[i] : t.offsets[i + 1]].tobytes())
    word_d = sequence_digests(f.words, f.word_offsets)
    pairs = (f.buckets.astype(np.uint64) << np.uint64(32)) | f.counts.astype(np.uint64)
    bucket_d = sequence_digests(pairs, f.bucket_offsets)
    n_words, n_buckets = np.diff(f.word_offsets), np.diff(f.bucket_offsets)
    word_chars = np.bincount(
        np.repeat(np.arange(len(t.raw)), n_words), weights=f.lengths, minlength=len(t.raw)
    )
    total = np.bincount(np.repeat(np.arange(len(t.raw)), n_buckets), weights=f.counts, minlength=len(t.raw))

    def u32(a: np.ndarray) -> np.ndarray:
        return cast(np.ndarray, np.asarray(a)[of].astype(np.uint32))

    out = {
        "bytes.utf8_len": u32(t.utf8_len),
        "bytes.n_chars": u32(t.n_chars),
        "bytes.newlines": u32(t.newlines),
        "bytes.questions": u32(t.questions),
        "bytes.cut_digest": cut_d[of],
        "words.count": u32(n_words),
        "words.chars": u32(word_chars),
        "words.digest": word_d[of],
        "buckets.distinct": u32(n_buckets),
        "buckets.total": u32(total),
        "buckets.digest": bucket_d[of],
        "features.suite": f.suite_pos.astype(np.int32),
        "features.stats": f.stats[of],
    }
    d = min(n_detail, n)
    parts = [np.arange(f.bucket_offsets[j], f.bucket_offsets[j + 1]) for j in t_of[:d]]
    src = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    out.update(
        {
            "detail.offsets": np.concatenate(([0], np.cumsum([len(p) for p in parts]))).astype(np.uint32),
            "detail.buckets": f.buckets[src].astype(np.uint32),
            "detail.counts": f.counts[src].astype(np.uint32),
            "detail.values": f.text_values[src],
        }
    )
    return out


def compute(
    policy: RoutingPolicy,
    inputs: list[VectorInput],
    config: dict[str, Any],
    targets: tuple[float, ...] = TARGETS,
    n_detail: int = DETAIL,
    budgets: list[list[Any]] | None = None,
    live: dict[str, Any] | None = None,
) -> dict[str, np.ndarray]:
    """Every layer's values for the inputs, as this implementation computes them (all requests
    at once: routeopt.router_training.policy.batch_features, which tests hold to the one-request path's bits)."""
    texts, suites = [i.text for i in inputs], [i.suite for i in inputs]
    if policy.spec.embeddings:
        return _text_layers(batch_features(texts, suites, policy.spec), n_detail)
    feats, z, topic, p, c = batch_predict(policy, texts, suites)
    out = _text_layers(feats, n_detail)
    t = feats.text
    unit = [
        cut_unit(suite, t.cut[t.offsets[j] : t.offsets[j + 1]].tobytes())
        for suite, j in zip(suites, feats.text_of)
    ]
    out.update(
        {
            "scores.logits": z,
            "scores.topic": topic.astype(np.int32),
            "calibration.p": p,
            "cost.c": c,
            "knob.unit": np.array(unit, dtype=np.float64),
        }
    )
    out.update(_decisions(policy, out, targets))
    out.update(_gateway(policy, inputs, out, config))
    if policy.latency is not None:
        out.update(
            _budgets(policy, texts, suites, out, budgets if budgets is not None else budget_cases(policy))
        )
        out.update(_live(policy, out, live if live is not None else live_case(policy)))
    return out


def live_case(policy: RoutingPolicy) -> dict[str, Any]:
    """The live sequence the vectors replay (section 8.4) at the budget of the tier whose mask
    reaches furthest past it (the loosest of those; so the limit is the mask, not the budget,
    where any tier widened it): every candidate observed twice a second for 75 s, at 0.5 to 0.7
    of the budget against a predicted 0.6, but one (`live.obs` says which) at three times that
    from 20 s to 40 s; decisions at 10, 25, 45, 59.5 and 75 s."""
    assert policy.latency is not None
    kind = policy.latency.model.kinds[0]
    tiers = [t for t in policy.latency.tiers if t.kind == kind]
    budget = max(tiers, key=lambda t: (t.mask_s / t.budget_s, t.budget_s)).budget_s if tiers else 1.0
    return {
        "settings": LiveSettings().to_dict(),
        "kind": kind,
        "budget_s": float(budget),
        "target": float(policy.quality_target),
        "times": [10.0, 25.0, 45.0, 59.5, 75.0],
        "slow": [20.0, 40.0],
    }


LIVE_SLOWDOWN = 3.0  # how much slower the slowed candidate's calls are in the live case


def live_observations(case: dict[str, Any], slow: int, k: int) -> np.ndarray:
    """(t, candidate, ttft, latency, predicted ttft, predicted latency) rows of the live case in
    the order they are observed; a quarter of the TTFTs and half the latencies come without a
    prediction (NaN)."""
    budget, (start, end) = case["budget_s"], case["slow"]
    rows = []
    for step in range(151):  # t = 0, 0.5, ..., 75
        t = step * 0.5
        for j in range(k):
            v = budget * 0.5 * (1.0 + (step % 5) / 10.0)
            if j == slow and start <= t < end:
                v *= LIVE_SLOWDOWN
            pred = budget * 0.6
            rows.append(
                (
                    t,
                    float(j),
                    v,
                    v * 2.0,
                    math.nan if step % 4 == 3 else pred,
                    pred * 2.0 if step % 2 else math.nan,
                )
            )
    return np.array(rows, dtype=np.float64)


def _optional(v: float) -> float | None:
    return None if math.isnan(v) else float(v)


def _live(policy: RoutingPolicy, out: dict[str, np.ndarray], case: dict[str, Any]) -> dict[str, np.ndarray]:
    """The first LIVE_REQUESTS requests decided under the case's budget at each checkpoint of
    its observation sequence (a router's live latency, section 8.4)."""
    assert policy.latency is not None
    P, C, u = out["calibration.p"][:LIVE_REQUESTS], out["cost.c"][:LIVE_REQUESTS], out["knob.unit"]
    n, k = P.shape
    names = policy.candidates
    kind, budget, target = case["kind"], float(case["budget_s"]), float(case["target"])
    pred = out["latency.pred"][:LIVE_REQUESTS, _model_index(policy, kind, "p95")]
    picks, _, orders, outcomes = policy._budget_choice(kind, budget, P, C, pred, lambda i: u[i], target)
    fallbacks = [[names[j] for j in orders[i].tolist() if j != picks[i]] for i in range(n)]
    probabilities = [dict(zip(names, P[i].tolist())) for i in range(n)]

    def move(i: int, slow: dict[str, float]) -> tuple[str, tuple[str, ...], list[str]] | None:
        b = outcomes[i]
        return live_move(
            names[picks[i]], fallbacks[i], names, probabilities[i], b.predicted_s, b.limit_s, slow
        )

    # the slow one: the candidate chosen for most requests that its slowdown could move
    movable = np.zeros(k, dtype=int)
    for i in range(n):
        movable[picks[i]] += move(i, {names[picks[i]]: LIVE_SLOWDOWN}) is not None
    slow = int(movable.argmax()) if movable.any() else int(np.bincount(picks, minlength=k).argmax())
    obs = live_observations(case, slow, k)
    live = LiveLatency(LiveSettings(**case["settings"]))
    models, moved = np.zeros((len(case["times"]), n), np.uint16), np.zeros((len(case["times"]), n), np.uint8)
    at = 0
    for c, now in enumerate(case["times"]):
        while at < len(obs) and obs[at, 0] <= now:
            t, j, ttft, latency, pred_ttft, pred_latency = obs[at].tolist()
            live.observe(
                names[int(j)],
                t,
                ttft_s=ttft,
                latency_s=latency,
                predicted_ttft_s=_optional(pred_ttft),
                predicted_latency_s=_optional(pred_latency),
            )
            at += 1
        slowed = live.slow(names, kind, now)
        for i in range(n):
            shift = move(i, slowed)
            models[c, i] = names.index(shift[0]) if shift else picks[i]
            moved[c, i] = shift is not None
    return {"live.obs": obs, "live.model": models, "live.moved": moved}


def _model_index(policy: RoutingPolicy, kind: str, quantile: str) -> int:
    """Where a model's predictions sit in `latency.pred` (ttft before latency, p50 before p95)."""
    assert policy.latency is not None
    models = sorted(policy.latency.model.models, key=lambda m: (m[0] != "ttft", m[1]))
    return models.index((kind, quantile))


def budget_cases(policy: RoutingPolicy) -> list[list[Any]]:
    """The (kind, budget in seconds, quality target) cases the vectors decide at: per kind, a
    budget below every tier, each tier's own budget (at most four, spread), one between two
    tiers and one above all, at the policy's target and at 0.9."""
    assert policy.latency is not None
    cases: list[list[Any]] = []
    for kind in policy.latency.model.kinds:
        budgets = policy.latency.budgets(kind)
        if not budgets:
            continue
        spread = (
            [budgets[round(i * (len(budgets) - 1) / 3)] for i in range(4)] if len(budgets) > 4 else budgets
        )
        chosen = [budgets[0] / 2, *dict.fromkeys(spread), budgets[-1] * 2]
        if len(budgets) > 1:
            chosen.append((budgets[0] + budgets[1]) / 2)
        cases += [[kind, float(b), float(t)] for b in chosen for t in (policy.quality_target, 0.9)]
    if "*" in policy.latency.defaults:  # no budget asked: each request gets its suite's default
        cases += [["default", None, float(t)] for t in (policy.quality_target, 0.9)]
    return cases


def _budgets(
    policy: RoutingPolicy,
    texts: list[str],
    suites: list[str | None],
    out: dict[str, np.ndarray],
    cases: list[list[Any]],
) -> dict[str, np.ndarray]:
    """The latency models' predictions and the decisions at each budget case (the spec's
    'Latency' and 'Budget' steps, by the policy's own `_budget_choice`)."""
    assert policy.latency is not None
    P, C, u = out["calibration.p"], out["cost.c"], out["knob.unit"]
    n, k = P.shape
    models = sorted(policy.latency.model.models, key=lambda m: (m[0] != "ttft", m[1]))
    chars, pos = policy.latency_inputs(texts, suites)
    pred = {m: policy.latency.model.predict(m[0], m[1], chars, pos) for m in models}
    chosen, met = np.zeros((n, len(cases)), np.uint16), np.zeros((n, len(cases)), np.uint8)
    fallbacks, props = np.zeros((n, len(cases), k - 1), np.uint16), np.zeros((n, len(cases)))
    for j, (kind, budget, target) in enumerate(cases):
        if kind == "default":  # each request under its suite's default budget (policy.latency.defaults)
            resolved = [policy.latency.default_for(suite) or ("ttft", math.inf) for suite in suites]
            groups = {pair: np.flatnonzero([r == pair for r in resolved]) for pair in set(resolved)}
        else:
            groups = {(kind, float(budget)): np.arange(n)}
        for (kind_g, budget_g), rows in groups.items():
            picks, prop, order, outcomes = policy._budget_choice(
                kind_g,
                budget_g,
                P[rows],
                C[rows],
                pred[kind_g, "p95"][rows],
                lambda i, rows=rows: u[rows[i]],
                float(target),
            )
            chosen[rows, j], props[rows, j], met[rows, j] = picks, prop, outcomes.met
            fallbacks[rows, j] = order[order != picks[:, None]].reshape(len(rows), -1)
    return {
        "latency.pred": np.stack([pred[m] for m in models], axis=1),
        "budget.model": chosen,
        "budget.fallbacks": fallbacks,
        "budget.met": met,
        "budget.propensity": props,
    }


def _pick(
    policy: RoutingPolicy, target: float, P: np.ndarray, C: np.ndarray, u: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Per request: the chosen candidate, its propensity, and the fallback order (the spec's
    'Knob' and 'Decision' steps over all requests at once, by the policy's own `point_choice`)."""
    point = policy.point_for(target)
    pick, prop = point_choice(policy.knob, point, P, C, lambda i: u[i])
    ranked = fallback_order(policy.knob, point, P, C)
    rest = ranked[ranked != pick[:, None]].reshape(len(P), -1)
    return pick, prop, rest


def _point_index(policy: RoutingPolicy, target: float) -> int:
    """The index of the point serving the target, -1 for the top (section 7's rule)."""
    policy.point_for(target)  # the same checks
    return next((j for j, p in enumerate(policy.knob.points) if p.certified >= target - 1e-12), -1)


def _decisions(
    policy: RoutingPolicy, out: dict[str, np.ndarray], targets: tuple[float, ...]
) -> dict[str, np.ndarray]:
    P, C, u = out["calibration.p"], out["cost.c"], out["knob.unit"]
    n, k = P.shape
    models, props = np.zeros((n, len(targets)), np.uint16), np.zeros((n, len(targets)))
    fallbacks = np.zeros((n, len(targets), k - 1), np.uint16)
    for t, target in enumerate(targets):
        pick, prop, rest = _pick(policy, target, P, C, u)
        models[:, t], props[:, t], fallbacks[:, t] = pick, prop, rest
    return {
        "decision.model": models,
        "decision.fallbacks": fallbacks,
        "decision.propensity": props,
        "knob.point": np.array([_point_index(policy, t) for t in targets], dtype=np.int32),
    }


class _Chosen(NamedTuple):
    """What `draws.choose` reads of a decision: the model, and each candidate's p and cost."""

    model: str
    pass_probabilities: dict[str, float]
    expected_cost_usd: dict[str, float]


@functools.lru_cache(maxsize=4)
def _draws(explore_key: bytes, canary_key: bytes, request_ids: tuple[str, ...]) -> np.ndarray:
    """(n, 3): each request's two exploration draws and its canary draw (read-only: the same
    requests and seeds come back at every save and self-check in a process)."""
    draws = np.array([(*unit_draw(explore_key, r), unit_draw(canary_key, r)[0]) for r in request_ids])
    draws = draws.reshape(len(request_ids), 3)
    draws.flags.writeable = False
    return draws


def _gateway(
    policy: RoutingPolicy, inputs: list[VectorInput], out: dict[str, np.ndarray], config: dict[str, Any]
) -> dict[str, np.ndarray]:
    """Exploration and canary with the config's seeds, at the policy's own target (the canary's
    candidate is this same policy, so each arm's served decision is known): each request through
    the gateway's own `draws.choose`."""
    x = config["exploration"]
    exploration = Exploration(
        rate=x["rate"],
        exclude=frozenset(x["exclude"]),
        max_cost_usd=x["max_cost_usd"],
        max_cost_ratio=x["max_cost_ratio"],
        seed=x["seed"],
    )
    explore_key, canary_key = derive_key("explore", x["seed"]), derive_key("canary", config["canary"]["seed"])
    draws = _draws(explore_key, canary_key, tuple(i.request_id for i in inputs))
    P, C = out["calibration.p"], out["cost.c"]
    pick = _pick(policy, policy.quality_target, P, C, out["knob.unit"])[0]
    names, index = policy.candidates, {c: j for j, c in enumerate(policy.candidates)}
    n = len(inputs)
    model, explored, eligible, prop = (
        np.zeros(n, np.uint16),
        np.zeros(n, np.uint8),
        np.zeros(n, np.uint16),
        np.zeros(n),
    )
    for i in range(n):
        chosen = _Chosen(names[pick[i]], dict(zip(names, P[i].tolist())), dict(zip(names, C[i].tolist())))
        served = choose(chosen, exploration, float(draws[i, 0]), float(draws[i, 1]))
        model[i], explored[i], eligible[i], prop[i] = (
            index[served.model],
            served.explored,
            len(served.eligible),
            served.propensity,
        )
    return {
        "gateway.draws": draws,
        "gateway.arm": (draws[:, 2] < config["canary"]["share"]).astype(np.uint8),
        "gateway.model": model,
        "gateway.explored": explored,
        "gateway.eligible": eligible,
        "gateway.propensity": prop,
    }


# -- the file ---------------------------------------------------------------------------------


def _encode_inputs(inputs: list[VectorInput], suites: list[str | None]) -> dict[str, np.ndarray]:
    """Inputs as bytes: each distinct text once (prefix, pattern, suffix as generalised UTF-8)
    and per request (offset, prefix, pattern, repeat, suffix) into them."""
    parts, spans, rids, rid_offsets, seen, at = [], [], [], [0], {}, 0
    for inp in inputs:
        pre, pat, suf = wtf8(inp.prefix), wtf8(inp.pattern), wtf8(inp.suffix)
        key = (pre, pat, suf)
        if key not in seen:
            seen[key] = at
            parts += [pre, pat, suf]
            at += len(pre) + len(pat) + len(suf)
        spans.append((seen[key], len(pre), len(pat), inp.repeat, len(suf)))
        rids.append(wtf8(inp.request_id))
        rid_offsets.append(rid_offsets[-1] + len(rids[-1]))
    return {
        "input.text": np.frombuffer(b"".join(parts), dtype=np.uint8),
        "input.spans": np.array(spans, dtype=np.uint32).reshape(-1, 5),
        "input.suite": np.array([suites.index(i.suite) for i in inputs], dtype=np.int32),
        "input.request_id": np.frombuffer(b"".join(rids), dtype=np.uint8),
        "input.request_id_offsets": np.array(rid_offsets, dtype=np.uint32),
    }


def build_vectors(policy: RoutingPolicy) -> bytes:
    """The conformance file of a policy (as read back from its own published files)."""
    inputs = vector_inputs(tuple(policy.spec.suites))
    suites = sorted({i.suite for i in inputs}, key=lambda s: (s is not None, s or ""))
    config = _gateway_config(policy)
    portable = not policy.spec.embeddings
    layers = [
        name
        for name, _ in LAYERS
        if (portable or name in TEXT_LAYERS) and (policy.latency is not None or name not in LATENCY_LAYERS)
    ]
    meta = {
        "format": FORMAT,
        "policy_format": written_version(policy),
        "requests": len(inputs),
        "candidates": list(policy.candidates),
        "targets": list(TARGETS),
        "detail": min(DETAIL, len(inputs)),
        "tolerance": TOLERANCE,
        "layers": layers,
        "suites": suites,
        "gateway": config,
    }
    if "budget" in layers:
        meta["budgets"] = budget_cases(policy)
        meta["live"] = live_case(policy)
    tensors = {**_encode_inputs(inputs, suites), **compute(policy, inputs, config)}
    return dumps(tensors, {"routeopt": json.dumps(meta, ensure_ascii=True)})


def read_vectors(
    blob: bytes,
    where: str = "conformance.safetensors",
) -> tuple[list[VectorInput], dict[str, Any], dict[str, np.ndarray]]:
    """(inputs, metadata, expected tensors) of a conformance file."""
    tensors, raw_meta = loads(blob, where)
    try:
        meta = json.loads(raw_meta["routeopt"])
        if meta.get("format") != FORMAT:
            raise ContainerError(f"{where}: format {meta.get('format')!r} is not {FORMAT!r}")
        text, spans = bytes(tensors["input.text"]), tensors["input.spans"]
        rid, rid_off = bytes(tensors["input.request_id"]), tensors["input.request_id_offsets"]
        inputs = []
        for i, (at, a, b, rep, c) in enumerate(spans.tolist()):
            if at + a + b + c > len(text):
                raise ValueError(f"request {i}: its text runs past input.text")
            pre, pat, suf = (
                from_wtf8(text[s:e])
                for s, e in ((at, at + a), (at + a, at + a + b), (at + a + b, at + a + b + c))
            )
            inputs.append(
                VectorInput(
                    pre,
                    pat,
                    int(rep),
                    suf,
                    meta["suites"][int(tensors["input.suite"][i])],
                    from_wtf8(rid[rid_off[i] : rid_off[i + 1]]),
                )
            )
    except (KeyError, IndexError, TypeError, ValueError, UnicodeDecodeError) as exc:
        raise ContainerError(f"{where}: malformed conformance vectors ({exc!r})") from None
    return inputs, meta, tensors


# -- checking ---------------------------------------------------------------------------------


def _differs(want: np.ndarray, got: np.ndarray, how: str, tol: float) -> tuple[np.ndarray, float]:
    """Per leading index, whether the values differ, and the largest relative float difference."""
    if want.shape != got.shape:
        return np.ones(max(len(want), len(got), 1), dtype=bool), np.inf
    if how == EXACT:
        bad = want != got if want.dtype.kind != "f" else want.view(np.uint64) != got.view(np.uint64)
        return bad.reshape(len(want), -1).any(1) if want.ndim else bad.reshape(1), 0.0
    scale = np.maximum(np.abs(want), np.abs(got))
    diff = np.abs(want - got)
    rel = np.where(scale > 0, diff / np.where(scale > 0, scale, 1.0), 0.0)
    bad = ~(diff <= tol * scale)  # NaN anywhere differs
    worst = float(np.nanmax(rel)) if rel.size else 0.0
    return bad.reshape(len(want), -1).any(1) if want.ndim else bad.reshape(1), worst


def _detail_differs(
    want: dict[str, np.ndarray], got: dict[str, np.ndarray], tol: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Per detailed request: do its buckets or counts differ, do its feature values differ."""
    off_w, off_g = want["detail.offsets"], got["detail.offsets"]
    n = len(off_w) - 1
    ids_bad, vals_bad, worst = np.zeros(n, bool), np.zeros(n, bool), 0.0
    for i in range(n):
        a, b = (
            slice(int(off_w[i]), int(off_w[i + 1])),
            slice(int(off_g[i]), int(off_g[i + 1])) if i + 1 < len(off_g) else slice(0, 0),
        )
        if not (
            np.array_equal(want["detail.buckets"][a], got["detail.buckets"][b])
            and np.array_equal(want["detail.counts"][a], got["detail.counts"][b])
        ):
            ids_bad[i] = True
            continue
        bad, rel = _differs(want["detail.values"][a][None], got["detail.values"][b][None], CLOSE, tol)
        vals_bad[i], worst = bool(bad[0]), max(worst, rel)
    return ids_bad, vals_bad, worst


def _describe(inp: VectorInput) -> str:
    text = inp.text
    shown = repr(text[:40]) + ("..." if len(text) > 40 else "")
    return f"text {shown} ({len(text)} characters), suite {inp.suite!r}, request id {inp.request_id[:40]!r}"


def _show(a: np.ndarray, i: int) -> str:
    v = a[i] if a.ndim else a
    return np.array2string(np.asarray(v), precision=17, threshold=12) if np.ndim(v) else repr(v.item())


def _compare(
    meta: dict[str, Any], want: dict[str, np.ndarray], got: dict[str, np.ndarray], inputs: list[VectorInput]
) -> tuple[dict[str, int], str | None, float]:
    tol, n = float(meta["tolerance"]), len(inputs)
    unknown = [layer for layer in meta["layers"] if layer not in dict(LAYERS)]
    if unknown:
        raise ContainerError(
            f"conformance vectors: layer {unknown[0]!r} is not one this runtime implements: "
            "the policy needs a newer runtime"
        )
    ids_bad, vals_bad, worst = _detail_differs(want, got, tol)
    counts, first = {}, None
    for layer, tensors in LAYERS:
        if layer not in meta["layers"]:
            continue
        bad_any = np.zeros(n, bool)
        for name, how in tensors:
            if name not in want:
                raise ContainerError(f"conformance vectors: layer {layer} lacks tensor {name!r}")
            bad, rel = _differs(want[name], got[name], how, tol)
            worst = max(worst, rel)
            if name == "knob.point":
                if bad.any() and first is None:
                    first = f"step knob: the points serving targets {meta['targets']} are {got[name].tolist()}, expected {want[name].tolist()}"
                continue
            bad_any[: len(bad)] |= bad
            if bad.any() and first is None:
                i = int(np.argmax(bad))
                first = (
                    f"step {layer} ({name}) differs first at request {i} ({_describe(inputs[i])}): "
                    f"expected {_show(want[name], i)}, got {_show(got[name], i) if i < len(got[name]) else 'nothing'}"
                )
        extra = ids_bad if layer == "buckets" else vals_bad if layer == "features" else None
        if extra is not None and extra.any():
            bad_any[: len(extra)] |= extra
            if first is None:
                i = int(np.argmax(extra))
                first = f"step {layer} (detail.{'buckets' if layer == 'buckets' else 'values'}) differs first at request {i} ({_describe(inputs[i])})"
        counts[layer] = int(bad_any.sum())
    return counts, first, worst


def _serving_path(
    policy: RoutingPolicy,
    inputs: list[VectorInput],
    want: dict[str, np.ndarray],
    targets: tuple[float, ...],
    budgets: list[list[Any]] | None = None,
) -> str | None:
    """The first requests again through `RoutingPolicy.decide`, the path that serves gateways
    (the batch above computes the same bits; this checks that it still does)."""
    names = {c: j for j, c in enumerate(policy.candidates)}
    tol = TOLERANCE
    for i, inp in enumerate(inputs):
        for t in (i % len(targets),):  # one target per request, all of them in turn
            target = targets[t]
            d = policy.decide(inp.text, inp.suite, target)
            fallbacks = [names[m] for m in d.fallbacks]
            p = np.array([d.pass_probabilities[c] for c in policy.candidates])
            if (
                names[d.model] != want["decision.model"][i, t]
                or fallbacks != want["decision.fallbacks"][i, t].tolist()
                or _differs(want["calibration.p"][i][None], p[None], CLOSE, tol)[0][0]
                or _differs(
                    want["decision.propensity"][i, t : t + 1][None], np.array([[d.propensity]]), CLOSE, tol
                )[0][0]
            ):
                return (
                    f"step serving: RoutingPolicy.decide disagrees with the vectors at request {i} "
                    f"({_describe(inp)}), target {target}: chose {d.model}, fallbacks {list(d.fallbacks)}"
                )
        if budgets:
            kind, budget, target = budgets[i % len(budgets)]
            j = i % len(budgets)
            asked = {"use_defaults": True} if kind == "default" else {f"{kind}_budget_s": budget}
            d = policy.decide(inp.text, inp.suite, target, **asked)
            assert d.budget is not None
            if (
                names[d.model] != want["budget.model"][i, j]
                or [names[m] for m in d.fallbacks] != want["budget.fallbacks"][i, j].tolist()
                or int(d.budget.met) != want["budget.met"][i, j]
            ):
                return (
                    f"step serving: RoutingPolicy.decide disagrees with the vectors at request {i} "
                    f"({_describe(inp)}), {kind} budget {budget} s, target {target}: chose {d.model}"
                )
    return None


def check_vectors(
    policy: RoutingPolicy, blob: bytes, where: str = "conformance.safetensors"
) -> ConformanceReport:
    """Recompute every layer of the vectors with this runtime and compare, in the spec's order."""
    start = time.perf_counter()
    try:
        inputs, meta, want = read_vectors(blob, where)
        if meta["candidates"] != list(policy.candidates):
            return ConformanceReport(
                False,
                len(inputs),
                first=f"{where}: the vectors are for candidates "
                f"{meta['candidates']}, the policy has {policy.candidates} (swapped files?)",
            )
        targets = tuple(float(t) for t in meta["targets"])
        if ("budget" in meta["layers"]) != (policy.latency is not None):
            return ConformanceReport(
                False,
                len(inputs),
                first=f"{where}: the vectors {'do' if 'budget' in meta['layers'] else 'do not'} check "
                f"latency budgets and the policy {'has no' if policy.latency is None else 'has a'} latency section",
            )
        got = compute(
            policy,
            inputs,
            meta["gateway"],
            targets,
            int(meta["detail"]),
            meta.get("budgets"),
            meta.get("live"),
        )
        counts, first, worst = _compare(meta, want, got, inputs)
        if first is None and "decision" in meta["layers"]:
            first = _serving_path(policy, inputs[:SERVING_SAMPLE], want, targets, meta.get("budgets"))
            counts["serving"] = int(first is not None)
    except ContainerError as exc:
        return ConformanceReport(False, first=str(exc), seconds=time.perf_counter() - start)
    return ConformanceReport(
        first is None, len(inputs), tuple(meta["layers"]), counts, first, worst, time.perf_counter() - start
    )


def self_check(policy: RoutingPolicy) -> ConformanceReport:
    """The check a runtime runs when it loads a policy. The first call runs the vectors loaded
    with it and keeps the report (the vectors' bytes are then released); later calls return it."""
    if policy.conformance is not None:
        return policy.conformance
    blob, version = policy.vectors, policy.format_version
    if blob is None and version is not None and version < FORMAT_VERSION:
        return ConformanceReport(
            True,
            note=f"format {version} policy: no conformance vectors to check (publish it again to get them)",
        )
    if blob is None:
        return ConformanceReport(version is None, note="no conformance vectors were loaded with this policy")
    policy.conformance = check_vectors(policy, blob)
    policy.vectors = None
    return policy.conformance
