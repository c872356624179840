"""The promotion gate of the nightly flow: a new policy replaces the champion only if, on the
same held-out items, it passes as often (within tolerance) and costs no more, and no candidate it
routes to has significantly regressed.

Where the gateways' decision logs hold enough requests with feedback, live traffic is a second
source of evidence (`routeopt.router_training.live.promise`): both policies are scored off-policy on the same logged
requests, and the new one must not be significantly worse (its pass rate's difference not below
-tolerance with 95% confidence, its cost not significantly higher). `decided_by` says which
evidence decided.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pandas as pd

from routeopt.router_training.fit.data import RoutingData, routing_data
from routeopt.router_training.policy.routing import RoutingPolicy

if TYPE_CHECKING:
    from routeopt.router_training.live.promise import Comparison

CHAMPION = "champion"


@dataclass
class PromotionDecision:
    promoted: bool
    reason: str
    new: dict[str, float] = field(default_factory=dict)
    champion: dict[str, float] = field(default_factory=dict)
    decided_by: str = "held-out items"
    live: dict[str, Any] = field(default_factory=dict)


def score_on(policy: RoutingPolicy, data: RoutingData) -> dict[str, float]:
    """Pass rate and mean cost per request of a policy's choices on recorded outcomes.

    A choice without a recorded outcome (a candidate the data lacks) counts as a failure at the
    highest observed cost for that request: a policy is never credited for what was not measured.
    """
    decisions = policy.decide_batch(data.prompts, data.suites)
    pos = {c: j for j, c in enumerate(data.candidates)}
    passed, cost = [], []
    for i, d in enumerate(decisions):
        j = pos.get(d.model)
        y = data.Y[i, j] if j is not None else np.nan
        c = data.C[i, j] if j is not None else np.nan
        passed.append(0.0 if np.isnan(y) else float(y))
        cost.append(float(np.nanmax(data.C[i])) if np.isnan(c) else float(c))
    return {"pass_rate": float(np.mean(passed)), "cost": float(np.mean(cost)), "n": len(passed)}


def heldout(frame: pd.DataFrame, request_ids: Sequence[str]) -> RoutingData:
    data = routing_data(frame)
    keep = set(request_ids)
    return data.subset(np.array([i for i, r in enumerate(data.request_ids) if r in keep], dtype=int))


def decide_promotion(
    new_policy: RoutingPolicy,
    champion_policy: RoutingPolicy | None,
    test: RoutingData,
    *,
    tolerance: float,
    blocking: Sequence[str] = (),
    vacant: str = "no champion yet",
    live: Comparison | None = None,
    min_feedback: int = 200,
    require_live: bool = False,
    live_promise: dict | None = None,
) -> PromotionDecision:
    """Compare both policies on the same held-out items and, when there is enough of it, on live
    traffic (`routeopt.router_training.live.promise.compare`), and say whether the new one may lead and which
    evidence decided. `live_promise` (`routeopt.router_training.live.promise.live_promise` of the new policy at
    its target): with at least `min_feedback` requests, a promise the traffic refutes blocks it."""
    held_out = held_out_decision(
        new_policy, champion_policy, test, tolerance=tolerance, blocking=blocking, vacant=vacant
    )
    if blocking:
        return replace(held_out, decided_by="drift")
    broken = promise_broken(live_promise, min_feedback)
    if held_out.promoted and broken:
        return replace(
            held_out, promoted=False, reason=broken, decided_by="live traffic", live={"promise": live_promise}
        )
    if champion_policy is None:
        return held_out
    return with_live_evidence(
        held_out, live, tolerance=tolerance, min_feedback=min_feedback, require_live=require_live
    )


def promise_broken(promise: dict | None, min_feedback: int) -> str:
    """Why live traffic refutes a policy's promise at its target ('' when it does not, or when
    fewer than `min_feedback` requests with feedback say anything)."""
    if not promise or promise["n"] < min_feedback or not promise["broken"]:
        return ""
    m = promise["margin"]
    return (
        f"on {promise['n']} live requests its pass rate at target {promise['target']:g} is "
        f"{promise['pass_rate']['value']:.3f} against a floor of {promise['floor']:.3f} "
        f"({promise['target']:g} x {promise['reference_model']}): margin {m['value']:+.3f}, "
        f"95% CI {m['low']:+.3f}..{m['high']:+.3f}, the promise does not hold on this traffic"
    )


def live_verdict(live: Comparison, tolerance: float) -> tuple[bool, str]:
    """Whether live traffic lets the new policy lead: not significantly worse in pass rate beyond
    the tolerance, nor significantly dearer."""
    dp, dc, n = live.pass_rate_diff, live.cost_diff, live.pass_rate_diff.n
    if dp.high < -tolerance:
        return False, (
            f"on {n} live requests the pass rate is {-dp.value:.3f} lower than the "
            f"champion's (95% CI {dp.low:+.3f}..{dp.high:+.3f}), beyond the tolerance {tolerance:g}"
        )
    if dc.n and dc.low > 0:
        return False, (
            f"on {dc.n} live requests it costs {dc.value:+.3g} USD per request more than "
            f"the champion (95% CI {dc.low:+.3g}..{dc.high:+.3g})"
        )
    return True, (
        f"not worse on {n} live requests (pass rate {dp.value:+.3f}, 95% CI "
        f"{dp.low:+.3f}..{dp.high:+.3f}; cost {dc.value:+.3g} USD per request)"
    )


def with_live_evidence(
    held_out: PromotionDecision,
    live: Comparison | None,
    *,
    tolerance: float,
    min_feedback: int,
    require_live: bool = False,
) -> PromotionDecision:
    """Combine the held-out verdict with live traffic's, when live traffic has enough feedback."""
    n = live.pass_rate_diff.n if live is not None else 0
    summary = live.to_dict() if live is not None else {}
    if n < min_feedback:
        note = f"live traffic: {n} requests with feedback, {min_feedback} needed"
        if require_live and held_out.promoted:
            return replace(
                held_out,
                promoted=False,
                reason=f"{note} (traffic.require_live)",
                decided_by="live traffic",
                live=summary,
            )
        if live is None:  # no decision logs at all: the held-out verdict stands as it is
            return held_out
        return replace(held_out, reason=f"{held_out.reason} ({note})", live=summary)
    assert live is not None
    ok, why = live_verdict(live, tolerance)
    if held_out.promoted and ok:
        return replace(
            held_out,
            reason=f"{held_out.reason}; {why}",
            decided_by="held-out items and live traffic",
            live=summary,
        )
    if held_out.promoted:
        return replace(held_out, promoted=False, reason=why, decided_by="live traffic", live=summary)
    by = "held-out items" if ok else "held-out items and live traffic"
    return replace(held_out, reason=f"{held_out.reason}; live traffic: {why}", decided_by=by, live=summary)


def held_out_decision(
    new_policy: RoutingPolicy,
    champion_policy: RoutingPolicy | None,
    test: RoutingData,
    *,
    tolerance: float,
    blocking: Sequence[str] = (),
    vacant: str = "no champion yet",
) -> PromotionDecision:
    """Compare both policies on the same held-out items and say whether the new one may lead.

    `vacant` says why there is no champion to compare with (none yet, or it expired)."""
    new = score_on(new_policy, test) if len(test) else {}
    if blocking:
        return PromotionDecision(False, "drift blocks promotion: " + "; ".join(blocking), new)
    if champion_policy is None:
        return PromotionDecision(True, vacant, new)
    if not len(test):
        return PromotionDecision(False, "no held-out items to compare on", new)
    old = score_on(champion_policy, test)
    if new["pass_rate"] < old["pass_rate"] - tolerance:
        why = f"pass rate {new['pass_rate']:.3f} < champion {old['pass_rate']:.3f} - {tolerance:g}"
        return PromotionDecision(False, why, new, old)
    if new["cost"] > old["cost"] * (1 + 1e-9):
        why = f"cost {new['cost']:.3g} > champion {old['cost']:.3g} per request"
        return PromotionDecision(False, why, new, old)
    return PromotionDecision(True, "not worse than the champion on the same held-out items", new, old)


def champion_policy(registry: Path | str, public_key: Any) -> tuple[RoutingPolicy | None, str]:
    """The verified champion policy, or (None, why) when any new policy may take its place."""
    policy, _, vacant = champion_version(registry, public_key)
    return policy, vacant


def champion_version(registry: Path | str, public_key: Any) -> tuple[RoutingPolicy | None, int | None, str]:
    """The verified champion policy, its version, and ('' or) why any new policy may take its place.

    A champion that expired, or that is unsigned while policies are signed, is served by no
    verifying gateway, so it is replaceable: comparing with it would only keep gateways on their
    default model. Any other failure (a bad signature, tampered files) raises: that needs a person.
    """
    from routeopt.artifacts.publish.registry import current_pointer
    from routeopt.artifacts.serving.loader import PolicyLoadError, load

    pointer, _ = current_pointer(registry, CHAMPION)
    if pointer is None:
        return None, None, "no champion yet"
    try:
        router = load(registry, public_key, channel=CHAMPION, state_dir=False, default_model="")
    except PolicyLoadError as exc:
        if exc.kind not in ("expired", "unsigned"):
            raise PolicyLoadError(
                f"{registry}: the champion cannot be verified, so the gate cannot "
                f"judge ({exc}); check it with `routeopt policies verify` and "
                f"promote a good version by hand",
                exc.kind,
            ) from None
        return None, None, f"champion version {pointer.version} is replaceable ({exc.kind}: {exc})"
    return router.policy, router.version, ""


def rollout_evidence(
    frame: pd.DataFrame,
    version: int,
    champion_version: int | None,
    kind: str,
    *,
    margin: float,
    min_feedback: int,
    since: str | None = None,
) -> tuple[bool, str, dict[str, Any]]:
    """Whether a shadow or canary of `version` on live traffic (a traffic frame of
    `routeopt.evals.storage.traffic`, logged since `since`) shows it is no worse than the champion: its
    pass rate's difference is above -margin with 95% confidence (non-inferiority; too little
    traffic shows nothing and does not promote), and its cost not significantly higher.

    shadow: both policies' choices are known on the logged requests (one served, the other was
    shadowed), so they are compared off-policy, paired on the same requests. canary: the requests
    the candidate served are compared with the champion's, arm against arm (the split is a hash
    of the request id, so this is a randomised comparison).
    """
    from routeopt.router_training.live.promise import canary_arms, compare, evaluate

    if kind not in ("shadow", "canary"):
        raise ValueError(f"kind must be 'shadow' or 'canary', got {kind!r}")
    if champion_version is None:
        return True, "no champion yet", {}
    if frame.empty:
        return False, f"no logged decisions{' since ' + since if since else ''}", {}
    if kind == "canary":
        arms = canary_arms(frame, version)
        n, d, dc = arms.candidate.n, arms.difference, _difference(arms.candidate_cost, arms.champion_cost)
        what = (
            f"canary arm pass rate {arms.candidate.value:.3f} vs champion arm {arms.champion.value:.3f} "
            f"on {n} + {arms.champion.n} requests"
        )
        detail = arms.to_dict()
    else:
        live = compare(
            frame,
            evaluate(frame, version, label=f"version {version}"),
            evaluate(frame, champion_version, label="champion"),
        )
        n, d, dc = live.pass_rate_diff.n, live.pass_rate_diff, live.cost_diff
        what = f"shadowed beside the champion on {n} requests"
        detail = live.to_dict()
    if n < min_feedback:
        return (
            False,
            f"version {version} {what.split(' on ')[0]}: {n} requests with feedback, {min_feedback} needed",
            detail,
        )
    interval = f"pass rate difference {d.value:+.3f}, 95% CI {d.low:+.3f}..{d.high:+.3f}"
    if not d.low >= -margin:
        return (
            False,
            (
                f"{what}: {interval}; not shown to be within {margin:g} of the champion "
                "(more traffic, or a wider --margin)"
            ),
            detail,
        )
    if dc.n and dc.low > 0:
        return False, f"{what}: {interval}; but dearer by {dc.value:+.3g} USD per request", detail
    return True, f"{what}: {interval}, within {margin:g} of the champion", detail


def _difference(a: Any, b: Any) -> Any:
    """a - b for two independent estimates (the canary arms' costs)."""
    from routeopt.router_training.live.offpolicy import EMPTY, Estimate

    if not a.n or not b.n:
        return EMPTY
    se = (a.se**2 + b.se**2) ** 0.5
    value = a.value - b.value
    return Estimate(value, value - 1.96 * se, value + 1.96 * se, se, a.n + b.n, float(a.n + b.n))
