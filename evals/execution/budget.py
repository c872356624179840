"""Spend caps for a run: a budget in USD for the whole run and, optionally, per candidate.

The runner reserves a pessimistic estimate of each attempt's cost *before* sending it (retries
and the judge's calls included) and settles the reservation with what the attempt actually
cost, failed attempts included (`routeopt.evals.execution.calls`). A call is refused (its item recorded with
error_kind "budget") only when it could exceed a cap even if every call still in flight turned
out to cost nothing; while in-flight reservations merely crowd the cap, the caller waits for
them to settle instead of giving up early. One `Budget` is shared by every (suite, candidate)
pair of a run in one process; it is thread-safe, and its async wait never blocks an event loop.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import threading
from dataclasses import dataclass
from typing import Iterable, Mapping, Sequence

from routeopt.evals.config import BudgetSettings, Candidate
from routeopt.evals.providers.base import Request
from routeopt.evals.storage.store import Store

BUDGET_ERROR_KIND = "budget"
_WAIT_POLL_S = 0.02
_TOKENS_PER_MESSAGE = 8  # chat-template framing tokens, generous for every vendor we know


class BudgetExhausted(RuntimeError):
    """This call could exceed a spend cap even if every call in flight cost nothing."""

    def __init__(self, message: str, *, scope: str):
        super().__init__(message)
        self.scope = scope


@dataclass(frozen=True)
class Reservation:
    """Money set aside for one call of one candidate until the call's real cost is known."""

    id: int
    candidate: str
    amount: float


def prompt_token_upper_bound(request: Request) -> int:
    """An upper bound on the prompt's tokens: byte-level BPE never yields more tokens than bytes."""
    body = sum(len(m.content.encode("utf-8")) for m in request.messages)
    return body + _TOKENS_PER_MESSAGE * len(request.messages)


def estimate_call_cost(candidate: Candidate, request: Request) -> float:
    """The most one call may cost, in USD, so that reserving it keeps every cap safe.

    Token-priced: every prompt token at the input price plus `max_tokens` at the output price.
    GPU-priced: the GPU held by this call alone for the whole timeout, at the configured
    utilisation (a call that runs longer is cut off by the runner).
    """
    if candidate.gpu_metered:
        return candidate.gpu_hour_usd / 3600.0 * candidate.timeout_s / candidate.utilization
    price_in, price_out = candidate.token_prices()
    tokens_in = prompt_token_upper_bound(request)
    return (tokens_in * price_in + request.settings.max_tokens * price_out) / 1e6


def gpu_provisional_cost(candidate: Candidate, latency_s: float | None) -> float | None:
    """A GPU-priced call's cost as if it had the GPU alone for its latency.

    The runner apportions GPU cost per flush window, after the fact; until then a budget needs
    a figure. With concurrent calls this overstates the share (they split one GPU), which errs
    on the side of the cap; `Budget.correct` books the difference when the window is costed.
    """
    if not candidate.gpu_metered or latency_s is None:
        return None
    return candidate.gpu_hour_usd / 3600.0 * latency_s / candidate.utilization


class Budget:
    """Run-wide and per-candidate spend caps with reserve-before-call and settle-after.

    `run_usd` caps the whole run; `per_candidate_usd` caps single candidates. A cap of None is
    no cap. `spent` pre-loads money already spent (a resumed run keeps counting from there).
    """

    def __init__(
        self,
        run_usd: float | None = None,
        per_candidate_usd: Mapping[str, float] | None = None,
        *,
        spent: Mapping[str, float] | None = None,
    ):
        for name, cap in [("run_usd", run_usd), *(per_candidate_usd or {}).items()]:
            if cap is not None and (not math.isfinite(cap) or cap < 0):
                raise ValueError(f"budget cap {name}: must be a finite amount >= 0, got {cap!r}")
        self.run_usd = run_usd
        self.per_candidate_usd = dict(per_candidate_usd or {})
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._spent: dict[str, float] = {k: float(v) for k, v in (spent or {}).items()}
        self._in_flight: dict[int, Reservation] = {}
        self._ids = itertools.count(1)
        self.refused: dict[str, int] = {}

    def __getstate__(self) -> dict:
        """Picklable for tasks in other processes; the copy is independent (see `split`)."""
        with self._lock:
            state = {k: v for k, v in self.__dict__.items() if k not in ("_lock", "_settled", "_ids")}
            state["_in_flight"] = {}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._settled = threading.Condition(self._lock)
        self._ids = itertools.count(1)

    def split(self, pairs: Sequence[tuple[str, str]]) -> dict[tuple[str, str], "Budget"]:
        """Independent budgets for (suite, candidate) tasks that run in other processes.

        Workers elsewhere cannot share this object's lock, so each pair gets an equal share of
        what remains of the run cap and of its candidate's cap. A capped candidate that no pair
        evaluates (a judge, called from every pair's grading) has its cap shared by all pairs.
        Conservative: a share one pair leaves unspent is not reused by another.
        """
        pairs = list(dict.fromkeys(pairs))
        per_cand: dict[str, int] = {}
        for _, cand in pairs:
            per_cand[cand] = per_cand.get(cand, 0) + 1
        with self._lock:
            run_left = None if self.run_usd is None else max(0.0, self.run_usd - self._spent_locked(None))
            cand_left = {
                c: max(0.0, cap - self._spent_locked(c)) for c, cap in self.per_candidate_usd.items()
            }
        others = {c: left / len(pairs) for c, left in cand_left.items() if c not in per_cand}
        return {
            (suite, cand): Budget(
                None if run_left is None else run_left / len(pairs),
                {**others, **({cand: cand_left[cand] / per_cand[cand]} if cand in cand_left else {})},
            )
            for suite, cand in pairs
        }

    # -- queries -------------------------------------------------------------------------

    def spent(self, candidate: str | None = None) -> float:
        """Settled spend of one candidate, or of the whole run."""
        with self._lock:
            return self._spent_locked(candidate)

    def reserved(self, candidate: str | None = None) -> float:
        with self._lock:
            return self._reserved_locked(candidate)

    def remaining(self, candidate: str | None = None) -> float:
        """What may still be committed: the tighter of the run cap and the candidate's cap."""
        with self._lock:
            room = [
                cap - self._spent_locked(scope) - self._reserved_locked(scope)
                for scope, cap in self._caps(candidate)
            ]
        return min(room, default=math.inf)

    def snapshot(self) -> dict:
        """Caps, spend and refusals, for run summaries and alerts."""
        with self._lock:
            return {
                "run_usd": self.run_usd,
                "per_candidate_usd": dict(self.per_candidate_usd),
                "spent_usd": round(self._spent_locked(None), 10),
                "spent_by_candidate": dict(self._spent),
                "in_flight": len(self._in_flight),
                "refused": dict(self.refused),
            }

    # -- reserve / settle ----------------------------------------------------------------

    def try_reserve(self, candidate: str, amount: float) -> Reservation | None:
        """Reserve now if every cap has room; None if the caller should wait for settlements.

        Raises BudgetExhausted when the call could not fit even with nothing in flight.
        """
        if amount < 0 or not math.isfinite(amount):
            raise ValueError(f"a call's cost estimate must be a finite amount >= 0, got {amount!r}")
        with self._lock:
            return self._try_reserve_locked(candidate, amount)

    def reserve(self, candidate: str, amount: float, timeout: float | None = None) -> Reservation:
        """Block (in a thread) until the call fits; raise BudgetExhausted when it never will."""
        with self._settled:
            res = self._try_reserve_locked(candidate, amount)
            while res is None:
                if not self._settled.wait(timeout):
                    raise TimeoutError(f"no budget settlement within {timeout}s")
                res = self._try_reserve_locked(candidate, amount)
            return res

    async def areserve(self, candidate: str, amount: float) -> Reservation:
        """`reserve` for async callers: waits by polling, so the loop keeps running the calls
        whose settlement it waits for (they may live on this very loop)."""
        while True:
            res = self.try_reserve(candidate, amount)
            if res is not None:
                return res
            await asyncio.sleep(_WAIT_POLL_S)

    def settle(self, reservation: Reservation, cost_usd: float | None) -> None:
        """Replace a reservation by the call's actual cost (None or 0: nothing was billed)."""
        with self._settled:
            if self._in_flight.pop(reservation.id, None) is None:
                raise ValueError(f"reservation {reservation.id} was already settled")
            self._add_locked(reservation.candidate, cost_usd or 0.0)
            self._settled.notify_all()

    def correct(self, candidate: str, delta_usd: float) -> None:
        """Book a late adjustment (a GPU window costed after its calls were settled)."""
        with self._settled:
            self._add_locked(candidate, delta_usd)
            self._settled.notify_all()

    # -- internals -----------------------------------------------------------------------

    def _caps(self, candidate: str | None) -> Iterable[tuple[str | None, float]]:
        if self.run_usd is not None:
            yield None, self.run_usd
        if candidate is not None and candidate in self.per_candidate_usd:
            yield candidate, self.per_candidate_usd[candidate]

    def _spent_locked(self, candidate: str | None) -> float:
        if candidate is None:
            return sum(self._spent.values())
        return self._spent.get(candidate, 0.0)

    def _reserved_locked(self, candidate: str | None) -> float:
        return sum(
            r.amount for r in self._in_flight.values() if candidate is None or r.candidate == candidate
        )

    def _add_locked(self, candidate: str, amount: float) -> None:
        self._spent[candidate] = max(0.0, self._spent.get(candidate, 0.0) + amount)

    def _try_reserve_locked(self, candidate: str, amount: float) -> Reservation | None:
        must_wait = False
        for scope, cap in self._caps(candidate):
            spent = self._spent_locked(scope)
            if spent + amount > cap:
                self.refused[candidate] = self.refused.get(candidate, 0) + 1
                label = "the run" if scope is None else f"candidate {candidate!r}"
                raise BudgetExhausted(
                    f"budget: {label} is capped at ${cap:.6g} and has spent ${spent:.6g}; "
                    f"this call could cost up to ${amount:.6g}, so it was not sent",
                    scope="run" if scope is None else "candidate",
                )
            if spent + self._reserved_locked(scope) + amount > cap:
                must_wait = True
        if must_wait:
            return None
        res = Reservation(next(self._ids), candidate, amount)
        self._in_flight[res.id] = res
        return res


def budget_for_run(settings: BudgetSettings, spent: Mapping[str, float] | None = None) -> Budget | None:
    """A Budget when the config sets any cap, else None (the runner then checks nothing)."""
    if settings.run_usd is None and not settings.per_candidate_usd:
        return None
    return Budget(settings.run_usd, settings.per_candidate_usd, spent=spent)


def spent_in_run(store: Store, run_id: str) -> dict[str, float]:
    """What a run already spent per candidate, so a resumed run keeps counting from there.

    Cached answers carry their list-price cost for training but were not paid: not counted.
    Judge calls are counted against the judge candidate, preflight probes against their own.
    A judged suite's batch answers waiting for their judge (`batch_answers`) count until their
    row is written; judge replies stored for them (`judge_replies`) count once each, and the
    rows graded from them (`judge_call_mode` set) do not count them again.
    """
    parts = [
        "SELECT candidate, coalesce(cost_usd, 0) AS usd FROM outcomes"
        " WHERE run_id = ? AND NOT coalesce(cached, FALSE)",
        "SELECT judge_candidate, judge_cost_usd FROM outcomes WHERE run_id = ?"
        " AND judge_candidate IS NOT NULL AND judge_cost_usd IS NOT NULL AND judge_call_mode IS NULL",
        "SELECT candidate, coalesce(cost_usd, 0) FROM preflight WHERE run_id = ?",
    ]
    if store.has_table("batch_answers"):
        parts += [
            "SELECT a.candidate, coalesce(a.cost_usd, 0) FROM batch_answers a WHERE a.run_id = ?"
            " AND NOT EXISTS (SELECT 1 FROM outcomes o WHERE o.run_id = a.run_id AND o.suite = a.suite"
            " AND o.item_id = a.item_id AND o.candidate = a.candidate)",
            "SELECT judge, coalesce(cost_usd, 0) FROM judge_replies WHERE run_id = ?",
        ]
    frame = store.query(
        f"SELECT candidate, sum(usd) AS usd FROM ({' UNION ALL '.join(parts)}) GROUP BY candidate",
        [run_id] * len(parts),
    )
    return {str(r.candidate): float(r.usd) for r in frame.itertuples()}
