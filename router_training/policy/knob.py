"""The quality knob: members, operating points, and the one implementation of the knob's choice.

A member is a deterministic rule:

* ``lambda``: maximise ``p - lambda * cost`` per request;
* ``single``: always the same candidate;
* ``threshold`` (read from format 1 policies): the cheapest candidate whose ``p >= tau``.

A target x (a fraction of the best single candidate's pass rate) is served by the cheapest point
certified for x, and a target above every certified one by the point with the best calibration
pass rate. A point that mixes two members picks one with a hash of the request (`request_unit`),
so a decision is deterministic and its propensity is known. `point_choice` is that step for any
number of requests: the gateway's decision, batch routing and the conformance vectors all run it.
"""

from __future__ import annotations

import bisect
import hashlib
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence, cast

import numpy as np

from routeopt.router_training.policy.features import cut, text_bytes

RULES = ("lambda", "threshold")
MEMBER_RULES = ("lambda", "threshold", "single")


def choose(
    p: np.ndarray, c: np.ndarray, rule: str, param: float, allowed: np.ndarray | None = None
) -> np.ndarray:
    """Per-request preference order over candidates (n, K); column 0 is the choice.

    Ties go to the cheaper candidate, so the rule is deterministic. With `allowed` (n, K), the
    allowed candidates come first, each group in the rule's order (a latency budget's mask,
    `routeopt.router_training.policy.latency.budget_mask`).
    """
    p = np.atleast_2d(p)
    c = np.atleast_2d(c)
    first = () if allowed is None else (~np.broadcast_to(allowed, p.shape),)  # the last key sorts first
    if rule == "lambda":
        return np.lexsort((c, -(p - param * c), *first), axis=-1)
    if rule == "threshold":
        ok = p >= param
        key = np.where(ok, c, np.inf)
        second = np.where(ok, 0.0, -p)
        return np.lexsort((c, second, key, *first), axis=-1)
    raise ValueError(f"unknown rule {rule!r}; expected one of {RULES}")


@dataclass(frozen=True)
class Member:
    """A deterministic rule: `lambda` (param = lambda), `threshold` (tau) or `single` (index)."""

    rule: str
    param: float

    def to_list(self) -> list[str | float]:
        return [self.rule, float(self.param)]


def member_choice(
    member: Member, p: np.ndarray, c: np.ndarray, allowed: np.ndarray | None = None
) -> np.ndarray:
    """The candidate each request gets under one member (n,); ties go to the cheaper one.

    With `allowed` (n, K; every row allows at least one), members choose among the allowed
    candidates only: `single` keeps its candidate where allowed and otherwise takes the allowed
    one most likely to pass (lambda 0)."""
    p = np.atleast_2d(p)
    c = np.atleast_2d(c)
    if member.rule == "single":
        k = int(member.param)
        pick = np.full(p.shape[0], k, dtype=np.intp)
        if allowed is None:
            return pick
        allowed = np.atleast_2d(allowed)
        return np.where(allowed[:, k], pick, member_choice(Member("lambda", 0.0), p, c, allowed))
    if member.rule == "lambda":
        return cast(np.ndarray, lambda_choices(np.array([member.param]), p, c, allowed)[0])
    return choose(p, c, member.rule, member.param, allowed)[:, 0]


def lambda_choices(
    params: np.ndarray, p: np.ndarray, c: np.ndarray, allowed: np.ndarray | None = None
) -> np.ndarray:
    """The choices of the `lambda` members with these params (len(params), n): the candidate
    with the highest p - lambda * c, ties to the cheaper (then the first), among the `allowed`
    ones where given. Lambdas are scored together, one candidate's column at a time (a
    reduction over a handful of candidates costs more than the arithmetic), in blocks that
    stay in the processor's cache."""
    p = np.atleast_2d(p)
    c = np.atleast_2d(c)
    params = np.asarray(params, dtype=np.float64)
    mask = None if allowed is None else np.broadcast_to(np.atleast_2d(allowed), p.shape)
    out = np.zeros((len(params), p.shape[0]), dtype=np.intp)
    step = max(1, _BLOCK // max(p.shape[0], 1))
    for start in range(0, len(params), step):
        lam = params[start : start + step, None]
        scores = []
        for k in range(p.shape[1]):
            score = p[:, k] - lam * c[:, k]
            scores.append(score if mask is None else np.where(mask[:, k], score, -np.inf))
        best = scores[0]
        for score in scores[1:]:
            best = np.maximum(best, score)
        pick = out[start : start + step]
        cheapest = np.where(scores[0] >= best, c[:, 0], np.inf)
        for k, score in enumerate(scores[1:], start=1):
            cost = np.where(score >= best, c[:, k], np.inf)
            cheaper = cost < cheapest
            pick[cheaper] = k
            cheapest = np.where(cheaper, cost, cheapest)
    return out


_BLOCK = 8192  # lambda_choices' scores per candidate and block: 64 KB


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

    def to_list(self) -> list[float | None]:
        return [
            self.a,
            self.b,
            round(self.weight, 9),
            _finite_or_none(self.certified),
            _finite_or_none(self.pass_rate),
            _finite_or_none(self.cost),
        ]

    @classmethod
    def from_list(cls, v: Sequence[Any]) -> "OperatingPoint":
        a, b, w, cert, q, c = v
        return cls(
            int(a),
            int(b),
            float(w),
            -math.inf if cert is None else float(cert),
            math.nan if q is None else float(q),
            math.nan if c is None else float(c),
        )


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
                raise ValueError(
                    f"an operating point names member {max(p.a, p.b)}; there are {len(self.members)}"
                )
        if any(b <= a for a, b in zip(self._certified, self._certified[1:])):
            raise ValueError("knob points must have strictly rising certified targets")

    @classmethod
    def from_points(
        cls,
        members: list[Member],
        points: list[OperatingPoint],
        reference: OperatingPoint,
        top: OperatingPoint,
        confidence: float,
    ) -> "Knob":
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

    def to_dict(self) -> dict[str, Any]:
        return {
            "confidence": _finite_or_none(self.confidence),
            "members": [m.to_list() for m in self.members],
            "points": [p.to_list() for p in self.points],
            "top": self.top.to_list(),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Knob":
        members = [Member(str(r), float(v)) for r, v in d["members"]]
        bad = [m.rule for m in members if m.rule not in MEMBER_RULES]
        if bad:
            raise ValueError(f"unknown knob member rule {bad[0]!r}; this build reads {MEMBER_RULES}")
        return cls(
            members,
            [OperatingPoint.from_list(p) for p in d["points"]],
            OperatingPoint.from_list(d["top"]),
            math.nan if d.get("confidence") is None else float(d["confidence"]),
        )

    @classmethod
    def from_table(cls, rule: str, table: list[tuple[float, float]], reference_rate: float) -> "Knob":
        """A format 1 table (param, expected pass rate), cheapest first, served as it was."""
        members = [Member(rule, float(param)) for param, _ in table]
        scale = reference_rate if reference_rate > 0 else 1.0
        points = [
            OperatingPoint(i, i, 1.0, float(q) / scale, float(q), math.nan) for i, (_, q) in enumerate(table)
        ]
        stair = [p for i, p in enumerate(points) if i == 0 or p.certified > points[i - 1].certified]
        return cls(members, stair, points[-1], math.nan)


def point_choice(
    knob: Knob,
    point: OperatingPoint,
    p: np.ndarray,
    c: np.ndarray,
    unit: Callable[[int], float],
    allowed: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """The candidate each request (rows of p and c) gets at `point`, and the probability it had.

    A mixed point takes member a where the request's unit is below the point's weight, else
    member b; `unit(i)` is request i's `request_unit`, asked for only where the two differ.
    `allowed` (n, K) restricts both members to a latency budget's candidates.

    One request (a gateway's decision) takes its row in Python's floats, `_row_choice`: the same
    comparisons on the same doubles, at a fraction of the cost of a dozen array calls."""
    row = _one_row(p, c, allowed)
    if (
        row is not None
        and knob.members[point.a].rule != "threshold"
        and knob.members[point.b].rule != "threshold"
    ):
        one, one_prop = _row_choice(knob, point, *row, lambda: unit(0))
        return np.array([one], dtype=np.intp), np.array([one_prop])
    pick_a = member_choice(knob.members[point.a], p, c, allowed)
    if point.weight >= 1.0:
        return pick_a, np.ones(len(pick_a))
    pick_b = member_choice(knob.members[point.b], p, c, allowed)
    # w * [a == pick] + (1 - w) * [b == pick] where the members agree, where the pick is a's and
    # where it is b's, in Python's floats (the same IEEE operations as on arrays)
    w = point.weight
    agree, to_a, to_b = w * 1.0 + (1 - w) * 1.0, w * 1.0 + (1 - w) * 0.0, w * 0.0 + (1 - w) * 1.0
    prop = np.full(len(pick_a), agree)
    differ = np.flatnonzero(pick_a != pick_b)  # the draw matters (and is hashed) only there
    if not len(differ):
        return pick_a, prop
    b_rows = differ[[not unit(int(i)) < w for i in differ]]
    pick = pick_a.copy()
    pick[b_rows] = pick_b[b_rows]
    prop[differ] = to_a
    prop[b_rows] = to_b
    return pick, prop


def fallback_order(
    knob: Knob, point: OperatingPoint, p: np.ndarray, c: np.ndarray, allowed: np.ndarray | None = None
) -> np.ndarray:
    """Per request, every candidate in the order of `p - lambda * cost` (the point's first lambda
    member's; 0 without one), ties to the cheaper: what a decision falls back along (with
    `allowed`, the candidates within the latency budget first)."""
    return choose(p, c, "lambda", fallback_lambda(knob, point), allowed)


def _one_row(
    p: np.ndarray, c: np.ndarray, allowed: np.ndarray | None
) -> tuple[list[float], list[float], list[bool] | None] | None:
    """A single request's p, c (and allowed) as Python lists, or None: several rows, or a value
    that is not finite (where Python's max and numpy's differ, the arrays decide)."""
    if np.ndim(p) == 2 and len(p) != 1:
        return None
    pr, cr = np.ravel(p).tolist(), np.ravel(c).tolist()
    if not math.isfinite(math.fsum(pr) + math.fsum(cr)):
        return None
    if allowed is None:
        return pr, cr, None
    mask = np.ravel(allowed)
    return pr, cr, (mask if len(mask) == len(pr) else np.broadcast_to(allowed, (1, len(pr)))[0]).tolist()


def row_decision(
    knob: Knob,
    point: OperatingPoint,
    p: list[float],
    c: list[float],
    unit: Callable[[], float],
    allowed: list[bool] | None = None,
) -> tuple[int, float, list[int]] | None:
    """One request's `point_choice` and `fallback_order` in Python's floats: the candidate, the
    probability it had and every candidate in fallback order (with `allowed`, a latency budget's
    mask, the allowed ones first); None where the arrays decide (a threshold member, a value or
    the fallback lambda not finite)."""
    lam = fallback_lambda(knob, point)
    if (
        knob.members[point.a].rule == "threshold"
        or knob.members[point.b].rule == "threshold"
        or not math.isfinite(math.fsum(p) + math.fsum(c) + lam)
    ):
        return None
    pick, prop = _row_choice(knob, point, p, c, allowed, unit)
    return pick, prop, _row_order(p, c, lam, allowed)


def _row_order(p: list[float], c: list[float], lam: float, allowed: list[bool] | None) -> list[int]:
    """`choose(p, c, "lambda", lam, allowed)` of one finite row: the allowed first, then by
    -(p - lam * c), then cost, then index (np.lexsort's order: sorted() is stable)."""
    mask = [True] * len(p) if allowed is None else allowed
    keys = [(not ok, -(a - lam * b), b) for ok, a, b in zip(mask, p, c)]
    return sorted(range(len(keys)), key=keys.__getitem__)


def _row_member(member: Member, p: list[float], c: list[float], allowed: list[bool] | None) -> int:
    """`member_choice` of one finite row (lambda and single members): the first of the cheapest
    among the candidates whose p - lambda * cost is the largest, as argmax and argmin take it."""
    if member.rule == "single":
        k = int(member.param)
        if allowed is None or allowed[k]:
            return k
        member = Member("lambda", 0.0)
    lam = member.param
    score = [a - lam * b for a, b in zip(p, c)]
    if allowed is not None:
        score = [v if ok else -math.inf for v, ok in zip(score, allowed)]
    best = max(score)
    return min((c[j], j) for j, v in enumerate(score) if v >= best)[1]


def _row_choice(
    knob: Knob,
    point: OperatingPoint,
    p: list[float],
    c: list[float],
    allowed: list[bool] | None,
    unit: Callable[[], float],
) -> tuple[int, float]:
    """`point_choice` of one finite row: the candidate and the probability it had."""
    pick_a = _row_member(knob.members[point.a], p, c, allowed)
    w = point.weight
    if w >= 1.0:
        return pick_a, 1.0
    pick_b = _row_member(knob.members[point.b], p, c, allowed)
    if pick_a == pick_b:
        return pick_a, w * 1.0 + (1 - w) * 1.0
    if unit() < w:
        return pick_a, w * 1.0 + (1 - w) * 0.0
    return pick_b, w * 0.0 + (1 - w) * 1.0


def fallback_lambda(knob: Knob, point: OperatingPoint) -> float:
    for m in (knob.members[point.a], knob.members[point.b]):
        if m.rule == "lambda":
            return m.param
    return 0.0


def request_unit(prompt: str, suite: str | None) -> float:
    """A uniform number in [0, 1] fixed by the request: mixes pick their member with it."""
    return cut_unit(suite, cut(text_bytes(prompt)))


def cut_unit(suite: str | None, cut_bytes: bytes) -> float:
    """`request_unit` from the prompt's cut bytes: BLAKE2b-64 of the suite's bytes, a NUL and the
    cut bytes (the spec's section 7: the cut bounds the work a huge prompt costs), read
    big-endian and divided by 2**64 (which may round up to 1.0)."""
    digest = hashlib.blake2b(text_bytes(suite or "") + b"\x00" + cut_bytes, digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2.0**64
