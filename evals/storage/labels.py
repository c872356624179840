"""What one outcome row says about its candidate: the one place that turns error kinds into labels.

Every row is either a *label* of the candidate on its item, or *excluded*:

- a graded answer: `passed` and `score` as the grader gave them;
- an error of the candidate (a timeout, a truncated stream, a refusal, a 5xx or rate limit that
  outlived its retries, a malformed answer, or any kind not listed below): a failure, with
  `passed = False` and `score = 0`. A model that times out on the hard items must not look
  better than it is;
- an error on our side (`OUR_SIDE`: a spend cap, an open circuit breaker, a refused key, an
  unusable configuration, a bug in routeopt or a grader, a cancelled call): it says nothing
  about the model, so it is left out of pass rates and training and counted as *excluded*.

The same error on every call is ours too, whatever its kind or status: when every row of a
candidate in a run (at least `SAME_ERROR_MIN_ROWS`; rows already left out for another reason,
a spend cap or an open breaker say, aside) is an error with the same kind and the same message
(same HTTP status, same body), the requests were never the problem. A proxy that
answers a wrong key or an unknown model with HTTP 400 looks, call by call, like a model that
fails every item; taken together it is a configuration error. Those rows become `misconfigured`
(their message keeps the kind they had: `client_error: HTTP 400: ...`), are excluded like the
others, and a resumed run calls them again (`Store.mark_same_errors` applies the rule, at the
end of each evaluation). A candidate that answers even one call, or fails in two different ways,
is measured as it is.

Training (`Store.training_frame`), the run summary, the report and drift all read their pass
rates through these definitions, in SQL (`LABELS`) or pandas (`label_frame`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

OUR_SIDE: dict[str, str] = {
    "budget": "a spend cap stopped the call",
    "circuit_open": "the endpoint's circuit breaker was open",
    "auth": "the endpoint refused the API key",
    "config": "the candidate's configuration cannot be used",
    "internal": "a fault in routeopt or in its provider code",
    "grader_error": "the grader failed",
    "cancelled": "the run stopped before the answer",
    "misconfigured": "every call of the candidate got the same error: its configuration is wrong",
}
"""Error kinds that are our fault, not the candidate's, with why they are excluded."""

MISCONFIGURED = "misconfigured"
SAME_ERROR_MIN_ROWS = 3  # fewer calls cannot tell a configuration from a model that fails them all


def is_excluded(error_kind: str | None) -> bool:
    """True for a row that is no evidence about the candidate (an error on our side)."""
    return error_kind in OUR_SIDE


@dataclass(frozen=True)
class LabelSql:
    """The same definitions as SQL expressions over an outcomes table (optionally aliased)."""

    prefix: str = ""

    @property
    def _ours(self) -> str:
        return ", ".join(f"'{k}'" for k in sorted(OUR_SIDE))

    @property
    def excluded(self) -> str:
        return f"({self.prefix}error_kind IN ({self._ours}))"

    @property
    def failed_call(self) -> str:
        """An error of the candidate: counted as a failure."""
        p = self.prefix
        return f"({p}error_kind IS NOT NULL AND {p}error_kind NOT IN ({self._ours}))"

    @property
    def labeled(self) -> str:
        """A row that counts in pass rates: graded, or a failure of the candidate."""
        return (
            f"(({self.prefix}error_kind IS NULL AND {self.prefix}passed IS NOT NULL) OR {self.failed_call})"
        )

    @property
    def passed(self) -> str:
        p = self.prefix
        return (
            f"(CASE WHEN {p}error_kind IS NULL THEN {p}passed WHEN {self.excluded} THEN NULL ELSE FALSE END)"
        )

    @property
    def score(self) -> str:
        p = self.prefix
        return f"(CASE WHEN {p}error_kind IS NULL THEN {p}score WHEN {self.excluded} THEN NULL ELSE 0.0 END)"

    @property
    def live(self) -> str:
        """A row measured in this run: it counts in cost, token and time statistics.

        A cached row replays an answer recorded in an earlier run: its pass label is true of
        the model (it is graded again here) but its cost, tokens and timings are not this run's.
        """
        return f"(NOT coalesce({self.prefix}cached, FALSE))"


LABELS = LabelSql()


def same_error_sql() -> str:
    """Per candidate of one run (parameters: run_id, min rows): the candidates whose every row
    is the same error, with the row count, the error kind and the message. Rows left out for
    another reason do not count; `config` rows (HTTP 404, a missing checkpoint) do, so that a
    wrong path is named like a wrong key."""
    ours = ", ".join(f"'{k}'" for k in sorted(set(OUR_SIDE) - {"config"}))
    return f"""
        SELECT candidate, count(*) AS n, any_value(error_kind) AS error_kind, any_value(error) AS error
        FROM outcomes
        WHERE run_id = ? AND coalesce(error_kind, '') NOT IN ({ours})
        GROUP BY candidate
        HAVING count(*) >= ? AND count(*) FILTER (WHERE error_kind IS NULL) = 0
           AND count(DISTINCT error_kind) = 1 AND count(DISTINCT coalesce(error, '')) = 1
        ORDER BY candidate
    """


def label_frame(frame: Any) -> Any:
    """The same definitions over a pandas frame of outcome rows (error_kind, passed, cached):
    adds `excluded`, `labeled`, `label` (1.0 pass, 0.0 failure, NaN when excluded) and `live`."""
    import numpy as np

    out = frame.copy()
    kind = out["error_kind"]
    out["excluded"] = kind.isin(list(OUR_SIDE))
    graded = kind.isna() & out["passed"].notna()
    failed = kind.notna() & ~out["excluded"]
    out["labeled"] = graded | failed
    out["label"] = np.where(graded, out["passed"].astype("float64"), np.where(failed, 0.0, np.nan))
    out["live"] = ~out["cached"].astype("boolean").fillna(False).astype(bool)
    return out


def exclusion_summary(counts: dict[str, int]) -> str:
    """'3 rows excluded from pass rates (errors on our side): budget 2 (a spend cap ...), ...'."""
    shown = {k: n for k, n in sorted(counts.items()) if n}
    if not shown:
        return ""
    total = sum(shown.values())
    parts = ", ".join(f"{k} {n} ({OUR_SIDE.get(k, 'error on our side')})" for k, n in shown.items())
    return f"{total} row{'s' if total != 1 else ''} excluded from pass rates (errors on our side): {parts}"
