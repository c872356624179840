"""The promotion gate of the nightly flow: a new policy replaces the champion only if, on the
same held-out items, it passes as often (within tolerance) and costs no more, and no candidate it
routes to has significantly regressed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from router_training.data import RoutingData, routing_data
from router_training.policy import RoutingPolicy

CHAMPION = "champion"


@dataclass
class PromotionDecision:
    promoted: bool
    reason: str
    new: dict[str, float] = field(default_factory=dict)
    champion: dict[str, float] = field(default_factory=dict)


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
    """The verified champion policy, or (None, why) when any new policy may take its place.

    A champion that expired, or that is unsigned while policies are signed, is served by no
    verifying gateway, so it is replaceable: comparing with it would only keep gateways on their
    default model. Any other failure (a bad signature, tampered files) raises: that needs a person.
    """
    from artifacts.registry import current_pointer
    from artifacts.runtime import PolicyLoadError, load

    pointer, _ = current_pointer(registry, CHAMPION)
    if pointer is None:
        return None, "no champion yet"
    try:
        router = load(registry, public_key, channel=CHAMPION, state_dir=False, default_model="")
    except PolicyLoadError as exc:
        if exc.kind not in ("expired", "unsigned"):
            raise PolicyLoadError(f"{registry}: the champion cannot be verified, so the gate cannot "
                                  f"judge ({exc}); check it with `routeopt policies verify` and "
                                  f"promote a good version by hand", exc.kind) from None
        return None, f"champion version {pointer.version} is replaceable ({exc.kind}: {exc})"
    return router.policy, ""
