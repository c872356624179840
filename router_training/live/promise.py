"""Policies on live traffic: off-policy estimates from the gateways' decision logs and feedback.

The traffic frame (decisions joined with their feedback) comes from `routeopt.evals.storage.traffic`.

A logged request tells what the policy that served it chose, with which probability
(`propensity`), and, once feedback arrives, whether it passed and what it cost. Any published
policy can be scored on those requests (`routeopt.router_training.live.offpolicy`) if its choice for each of
them is known: from the record itself (it is the policy that served), from the shadow record
(it was the other channel), or by deciding again on the logged text (only where the operator's
redaction hook kept text). Requests with none of these are counted and skipped.

The doubly robust estimator uses the evaluated policy's own model as reward model: its pass
probabilities for the pass rate, its predicted costs for the cost per request. Costs are the
observed ones (feedback `cost_usd`, else the gateway's usage record).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from routeopt.router_training.live import offpolicy as ope
from routeopt.router_training.live.offpolicy import Estimate

# -- one policy's view of the logged requests -------------------------------------------------


@dataclass
class Terms:
    """Per logged request, what a target policy needs: its choice's weight and reward-model values
    (NaN where the policy's choice is unknown)."""

    known: np.ndarray
    weight: np.ndarray
    agree: np.ndarray
    g_pass_logged: np.ndarray
    g_pass_target: np.ndarray
    g_cost_logged: np.ndarray
    g_cost_target: np.ndarray
    target_propensity: np.ndarray
    chosen: np.ndarray
    basis: list[str | None]
    probabilities: list[dict] = field(default_factory=list)  # the target policy's view, per request


def _dicts(column: pd.Series) -> list[dict]:
    return [json.loads(x) if isinstance(x, str) and x else {} for x in column]


def _shadows(frame: pd.DataFrame) -> list[dict]:
    return [json.loads(x) if isinstance(x, str) and x else {} for x in frame["shadow_json"]]


def _targets(frame: pd.DataFrame) -> list[float | None]:
    """Each record's quality target (None: the policy's own)."""
    return [
        None if q is None or (isinstance(q, float) and math.isnan(q)) else float(q)
        for q in frame["quality_target"].to_numpy()
    ]


def _from_text(
    policy: Any, frame: pd.DataFrame, rows: np.ndarray, quality_target: float | None = None
) -> dict[int, Any]:
    """The policy's decisions, made again on the kept text of `rows` at `quality_target`, else at
    each record's own target (grouped by target)."""
    out: dict[int, Any] = {}
    targets = _targets(frame)
    groups: dict[float | None, list[int]] = {}
    for i in rows:
        groups.setdefault(targets[i] if quality_target is None else quality_target, []).append(int(i))
    for q, idx in groups.items():
        texts = [str(frame["text"].iat[i]) for i in idx]
        suites = [s if isinstance(s, str) else None for s in frame["suite"].iloc[idx]]
        for i, d in zip(idx, policy.decide_batch(texts, suites, q)):
            out[i] = d
    return out


def policy_terms(
    frame: pd.DataFrame,
    version: int | None,
    policy: Any = None,
    needed: np.ndarray | None = None,
    quality_target: float | None = None,
) -> Terms:
    """The target policy's choice per request: logged, shadowed, or decided again on kept text
    (only for the `needed` rows, when given: deciding again is the expensive part).

    With `quality_target`, the policy is scored at that target: a logged or shadowed choice
    counts only where the record was routed at that very target (a record without one was
    routed at the policy's own); elsewhere the policy decides again on the kept text."""
    n = len(frame)
    nan = np.full(n, np.nan)
    t = Terms(
        np.zeros(n, bool),
        nan.copy(),
        np.zeros(n, bool),
        nan.copy(),
        nan.copy(),
        nan.copy(),
        nan.copy(),
        nan.copy(),
        np.full(n, None, dtype=object),
        [None] * n,
        [{} for _ in range(n)],
    )
    served, propensity = frame["model"].tolist(), frame["propensity"].to_numpy(dtype=float)
    versions = pd.to_numeric(frame["policy_version"], errors="coerce").to_numpy()
    shadow_versions = pd.to_numeric(frame["shadow_version"], errors="coerce").to_numpy()
    logged_p, logged_c = _dicts(frame["pass_probabilities_json"]), _dicts(frame["expected_cost_json"])
    shadows = _shadows(frame)
    views: dict[int, tuple[str, dict, dict, str]] = {}
    same_target = _same_target(frame, quality_target, getattr(policy, "quality_target", None))
    for i in range(n):
        if not same_target[i]:
            continue
        if version is not None and versions[i] == version:
            views[i] = (frame["policy_model"].iat[i] or served[i], logged_p[i], logged_c[i], "logged")
        elif version is not None and shadow_versions[i] == version and shadows[i].get("model"):
            s = shadows[i]
            views[i] = (
                s["model"],
                s.get("pass_probabilities") or {},
                s.get("expected_cost_usd") or {},
                "shadow",
            )
    if policy is not None:
        texts = frame["text"].to_numpy()
        rest = np.array(
            [
                i
                for i in range(n)
                if i not in views and isinstance(texts[i], str) and (needed is None or needed[i])
            ],
            dtype=int,
        )
        for i, d in _from_text(policy, frame, rest, quality_target).items():
            views[i] = (d.model, d.pass_probabilities, d.expected_cost_usd, "text")
    mu = _logging_probability(frame)
    for i, (model, p, c, basis) in views.items():
        a = served[i]
        t.known[i], t.agree[i], t.basis[i], t.chosen[i] = True, model == a, basis, model
        t.probabilities[i] = p
        t.weight[i] = (1.0 if model == a else 0.0) / propensity[i]
        t.target_propensity[i] = mu(i, model)
        unused = 0.0 if model != a else np.nan  # weight 0: the served model's value does not count
        t.g_pass_target[i], t.g_pass_logged[i] = p.get(model, np.nan), p.get(a, unused)
        t.g_cost_target[i], t.g_cost_logged[i] = c.get(model, np.nan), c.get(a, unused)
    return t


def _same_target(frame: pd.DataFrame, quality_target: float | None, own: float | None) -> np.ndarray:
    """Per record, whether its logged decisions were made at `quality_target` (all of them when
    no target is asked for); a record without a target was routed at the policy's `own`."""
    if quality_target is None:
        return np.ones(len(frame), dtype=bool)
    routed = [own if q is None else q for q in _targets(frame)]
    return np.array([q is not None and abs(q - quality_target) < 1e-9 for q in routed], dtype=bool)


def _logging_probability(frame: pd.DataFrame) -> Any:
    """mu(i, model): the probability the logging policy of request i gave `model` (its own choice
    with 1 - rate, plus rate / n_eligible for each model exploration could pick)."""
    rates = pd.to_numeric(frame["exploration_rate"], errors="coerce").fillna(0.0).to_numpy()
    own = frame["policy_model"].where(frame["policy_model"].notna(), frame["model"]).tolist()
    eligible = [set(json.loads(e)) if isinstance(e, str) else set() for e in frame["eligible_json"]]

    def mu(i: int, model: str) -> float:
        share = rates[i] / len(eligible[i]) if model in eligible[i] else 0.0
        return (1 - rates[i] if eligible[i] else 1.0) * (model == own[i]) + share

    return mu


# -- estimates --------------------------------------------------------------------------------


@dataclass
class PolicyOnTraffic:
    """A policy's estimated pass rate and cost per request on the logged traffic."""

    label: str
    version: int | None
    n_logged: int
    n_feedback: int
    n_evaluated: int
    n_unknown: int
    n_unsupported: int
    agreement: float
    basis: dict[str, int]
    pass_rate: dict[str, Estimate]
    cost: dict[str, Estimate]
    n_cost: int
    terms: Terms | None = field(default=None, repr=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "label": self.label,
            "version": self.version,
            "n_logged": self.n_logged,
            "n_feedback": self.n_feedback,
            "n_evaluated": self.n_evaluated,
            "n_unknown": self.n_unknown,
            "n_unsupported": self.n_unsupported,
            "agreement": self.agreement,
            "basis": self.basis,
            "n_cost": self.n_cost,
            "pass_rate": {k: e.to_dict() for k, e in self.pass_rate.items()},
            "cost": {k: e.to_dict() for k, e in self.cost.items()},
        }


def _rows(terms: Terms, reward: np.ndarray, g_logged: np.ndarray, g_target: np.ndarray) -> np.ndarray:
    return terms.known & ~np.isnan(reward) & ~np.isnan(g_logged) & ~np.isnan(g_target)


def evaluate(
    frame: pd.DataFrame,
    version: int | None,
    policy: Any = None,
    *,
    label: str = "",
    z: float = ope.Z95,
    quality_target: float | None = None,
) -> PolicyOnTraffic:
    """IPS, self-normalised IPS and doubly robust pass rate and cost of a policy on the traffic
    (at `quality_target`, else at the targets the requests were routed at)."""
    passed, cost = frame["passed"].to_numpy(dtype=float), frame["cost"].to_numpy(dtype=float)
    t = policy_terms(
        frame, version, policy, needed=~np.isnan(passed) | ~np.isnan(cost), quality_target=quality_target
    )
    rp = _rows(t, passed, t.g_pass_logged, t.g_pass_target)
    rc = _rows(t, cost, t.g_cost_logged, t.g_cost_target)
    variance = ope.dr_model_variance(t.g_pass_target[rp], t.target_propensity[rp])
    pass_rate = (
        ope.all_estimates(
            passed[rp],
            t.weight[rp],
            t.g_pass_logged[rp],
            t.g_pass_target[rp],
            z=z,
            bounds=(0.0, 1.0),
            model_variance=variance,
        )
        if rp.any()
        else {}
    )
    costs = (
        ope.all_estimates(
            cost[rc], t.weight[rc], t.g_cost_logged[rc], t.g_cost_target[rc], z=z, bounds=(0.0, math.inf)
        )
        if rc.any()
        else {}
    )
    basis: dict[str, int] = {}
    for b, ok in zip(t.basis, rp):
        if ok:
            basis[b] = basis.get(b, 0) + 1
    has_feedback = ~np.isnan(passed)
    return PolicyOnTraffic(
        label=label or (f"version {version}" if version is not None else "policy"),
        version=version,
        n_logged=len(frame),
        n_feedback=int(has_feedback.sum()),
        n_evaluated=int(rp.sum()),
        n_unknown=int((has_feedback & ~t.known).sum()),
        n_unsupported=int((rp & (t.target_propensity <= 0)).sum()),
        agreement=float(t.agree[rp].mean()) if rp.any() else math.nan,
        basis=basis,
        pass_rate=pass_rate,
        cost=costs,
        n_cost=int(rc.sum()),
        terms=t,
    )


@dataclass
class Comparison:
    """New minus champion on the requests where both choices are known (doubly robust, paired)."""

    new: PolicyOnTraffic
    champion: PolicyOnTraffic
    pass_rate_diff: Estimate
    cost_diff: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {
            "new": self.new.to_dict(),
            "champion": self.champion.to_dict(),
            "pass_rate_diff": self.pass_rate_diff.to_dict(),
            "cost_diff": self.cost_diff.to_dict(),
        }


def _paired(a: Terms, b: Terms, reward: np.ndarray, which: str, z: float) -> Estimate:
    gl_a, gt_a = getattr(a, f"g_{which}_logged"), getattr(a, f"g_{which}_target")
    gl_b, gt_b = getattr(b, f"g_{which}_logged"), getattr(b, f"g_{which}_target")
    rows = _rows(a, reward, gl_a, gt_a) & _rows(b, reward, gl_b, gt_b)
    if not rows.any():
        return ope.EMPTY
    ta = ope.dr_terms(reward[rows], a.weight[rows], gl_a[rows], gt_a[rows])
    tb = ope.dr_terms(reward[rows], b.weight[rows], gl_b[rows], gt_b[rows])
    if which != "pass":
        return ope.paired_difference(ta, tb, z=z)
    # where the two choose differently their corrections rest on different explored requests
    differ = a.chosen[rows] != b.chosen[rows]
    variance = differ * (
        ope.dr_model_variance(gt_a[rows], a.target_propensity[rows])
        + ope.dr_model_variance(gt_b[rows], b.target_propensity[rows])
    )
    return ope.paired_difference(ta, tb, z=z, model_variance=variance, baseline_diff=gt_a[rows] - gt_b[rows])


def compare(
    frame: pd.DataFrame, new: PolicyOnTraffic, champion: PolicyOnTraffic, z: float = ope.Z95
) -> Comparison:
    assert new.terms is not None and champion.terms is not None
    passed, cost = frame["passed"].to_numpy(dtype=float), frame["cost"].to_numpy(dtype=float)
    return Comparison(
        new,
        champion,
        _paired(new.terms, champion.terms, passed, "pass", z),
        _paired(new.terms, champion.terms, cost, "cost", z),
    )


# -- the promise on live traffic --------------------------------------------------------------


def live_promise(
    frame: pd.DataFrame,
    version: int | None,
    policy: Any,
    *,
    quality_target: float | None = None,
    z: float = ope.Z95,
) -> dict[str, Any] | None:
    """The knob's promise on the logged traffic: a doubly robust estimate of the paired margin
    mean(pass of the policy at its target - x * pass of always calling its reference model), the
    policy's own pass probabilities as reward model, with its interval. `broken`: the interval's
    top is below 0 (the traffic is evidence that the promise does not hold there). None without
    requests with feedback whose choice is known."""
    x = float(policy.quality_target if quality_target is None else quality_target)
    passed = frame["passed"].to_numpy(dtype=float)
    t = policy_terms(frame, version, policy, needed=~np.isnan(passed), quality_target=quality_target)
    ref, served = policy.reference_model, frame["model"].tolist()
    propensity = frame["propensity"].to_numpy(dtype=float)
    mu = _logging_probability(frame)
    g_ref = np.array([p.get(ref, np.nan) for p in t.probabilities])
    g_served = np.array([p.get(m, np.nan) for p, m in zip(t.probabilities, served)])
    w_ref = np.array([float(m == ref) for m in served]) / propensity
    rows = _rows(t, passed, t.g_pass_logged, t.g_pass_target) & ~np.isnan(g_ref) & ~np.isnan(g_served)
    if not rows.any():
        return None
    own = ope.dr_terms(passed[rows], t.weight[rows], t.g_pass_logged[rows], t.g_pass_target[rows])
    base = ope.dr_terms(passed[rows], w_ref[rows], g_served[rows], g_ref[rows])
    mu_ref = np.array([mu(i, ref) for i in np.flatnonzero(rows)])
    differ = t.chosen[rows] != ref  # where the policy calls the reference the two terms move together
    variance = differ * (
        ope.dr_model_variance(t.g_pass_target[rows], t.target_propensity[rows])
        + x * x * ope.dr_model_variance(g_ref[rows], mu_ref)
    )
    margin = ope.paired_difference(
        own, x * base, z=z, model_variance=variance, baseline_diff=t.g_pass_target[rows] - x * g_ref[rows]
    )
    mine, theirs = ope.mean_estimate(own, z=z, bounds=(0, 1)), ope.mean_estimate(base, z=z, bounds=(0, 1))
    return {
        "version": version,
        "target": x,
        "reference_model": ref,
        "n": int(rows.sum()),
        "pass_rate": mine.to_dict(),
        "reference_pass_rate": theirs.to_dict(),
        "floor": x * theirs.value,
        "margin": margin.to_dict(),
        "broken": bool(margin.high < 0),
        "held": bool(margin.value >= 0),
    }


# -- canary -----------------------------------------------------------------------------------


@dataclass
class CanaryArms:
    """What each channel's served requests scored (served models, exploration included)."""

    version: int | None
    champion: Estimate
    candidate: Estimate
    difference: Estimate
    champion_cost: Estimate
    candidate_cost: Estimate

    def to_dict(self) -> dict[str, Any]:
        return {k: (v.to_dict() if isinstance(v, Estimate) else v) for k, v in self.__dict__.items()}


def _two_sample(a: np.ndarray, b: np.ndarray, z: float) -> Estimate:
    if len(a) < 2 or len(b) < 2:
        return ope.EMPTY
    se = math.sqrt(a.var(ddof=1) / len(a) + b.var(ddof=1) / len(b))
    value = float(b.mean() - a.mean())
    return Estimate(value, value - z * se, value + z * se, se, len(a) + len(b), float(len(a) + len(b)))


def canary_arms(frame: pd.DataFrame, version: int | None = None, z: float = ope.Z95) -> CanaryArms:
    """Champion arm vs the candidate's canary arm (optionally of one candidate version); the arms
    are assigned by a hash of the request id, so the difference is a randomised comparison."""
    canary = frame["channel"] == "candidate"
    if version is not None:
        canary &= pd.to_numeric(frame["policy_version"], errors="coerce") == version
    passed, cost = frame["passed"].to_numpy(dtype=float), frame["cost"].to_numpy(dtype=float)
    champ = (frame["channel"] == "champion").to_numpy()
    cand = canary.to_numpy()
    pa, pb = passed[champ & ~np.isnan(passed)], passed[cand & ~np.isnan(passed)]
    ca, cb = cost[champ & ~np.isnan(cost)], cost[cand & ~np.isnan(cost)]
    return CanaryArms(
        version,
        ope.mean_estimate(pa, z=z, bounds=(0, 1)),
        ope.mean_estimate(pb, z=z, bounds=(0, 1)),
        _two_sample(pa, pb, z),
        ope.mean_estimate(ca, z=z, bounds=(0, math.inf)),
        ope.mean_estimate(cb, z=z, bounds=(0, math.inf)),
    )


def live_comparison(
    frame: pd.DataFrame,
    new_policy: Any,
    new_version: int | None,
    champion_policy: Any,
    champion_version: int | None,
) -> Comparison | None:
    """The new policy against the champion on a traffic frame (None without a champion or
    without logged decisions)."""
    if champion_policy is None or frame.empty:
        return None
    new = evaluate(frame, new_version, new_policy, label="new")
    old = evaluate(frame, champion_version, champion_policy, label="champion")
    return compare(frame, new, old)


def _versions(frame: pd.DataFrame) -> tuple[int | None, int | None]:
    """(champion, candidate) versions seen in the window: the champion's most frequent serving
    version, the candidate's latest shadowed or canary-served one."""

    def latest(values: pd.Series) -> int | None:
        values = pd.to_numeric(values, errors="coerce").dropna()
        return int(values.iloc[-1]) if len(values) else None

    served = pd.to_numeric(
        frame.loc[frame["channel"] == "champion", "policy_version"], errors="coerce"
    ).dropna()
    champion = int(served.mode().iloc[0]) if len(served) else None
    shadow = frame.loc[frame["shadow_version"].notna() & (frame["channel"] == "champion"), "shadow_version"]
    canary = frame.loc[frame["channel"] == "candidate", "policy_version"]
    return champion, latest(pd.concat([shadow, canary]))


def live_summary(frame: pd.DataFrame, since: str, until: str) -> dict[str, Any] | None:
    """Champion vs candidate on the traffic frame of [since, until) (the dashboard's section):
    counts, off-policy estimates from the logs alone (served and shadow records), the paired
    difference, and the canary arms. None without logged decisions."""
    if frame.empty:
        return None
    champion_v, candidate_v = _versions(frame)
    policies = [evaluate(frame, champion_v, label="champion")]
    if candidate_v is not None and candidate_v != champion_v:
        policies.append(evaluate(frame, candidate_v, label="candidate"))
    diff = compare(frame, policies[1], policies[0]) if len(policies) == 2 else None
    canary = (frame["channel"] == "candidate").any()
    return {
        "since": since,
        "until": until,
        "logged": len(frame),
        "feedback": int(frame["passed"].notna().sum()),
        "explored": float(frame["explored"].fillna(False).astype(bool).mean()),
        "with_text": float(frame["text"].map(lambda t: isinstance(t, str)).mean()),
        "shadowed": float(frame["shadow_version"].notna().mean()),
        "policies": [p.to_dict() for p in policies],
        "difference": diff.to_dict() if diff else None,
        "canary": canary_arms(frame, candidate_v).to_dict() if canary else None,
    }
