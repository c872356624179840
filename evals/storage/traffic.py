"""Production traffic in the store: the gateways' decision logs and the outcomes fed back for them.

`import_decisions` reads the JSONL files `routeopt.artifacts.serving.gateway.DecisionLog` writes (one object per
line, `"kind": "decision"` or `"usage"`) into the `decisions` table; `import_feedback` reads
outcomes (request id plus passed or score, from user ratings, a validator or a judge) into
`feedback`, keyed by (request id, source). Both are idempotent: a request id is stored once, and
a feedback row imported again is kept, or updated if its values changed. Bad rows raise one
error naming the file and line, and nothing of that file is written.

`load_traffic` reads them back as one frame, decisions joined with their feedback, which
`routeopt.router_training.live.promise` scores policies on.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd

from routeopt.evals.storage.store import Store
from routeopt.evals.suite.datasets import DatasetError, file_records

DECISION_COLUMNS = (
    "request_id",
    "time",
    "suite",
    "quality_target",
    "prompt_hash",
    "prompt_chars",
    "text",
    "channel",
    "policy_version",
    "model",
    "propensity",
    "policy_model",
    "policy_probability",
    "explored",
    "exploration_rate",
    "eligible_json",
    "canary_share",
    "pass_probabilities_json",
    "expected_cost_json",
    "shadow_channel",
    "shadow_version",
    "shadow_model",
    "shadow_json",
    "source_file",
    "imported_at",
    "trace_id",
    "span_id",
)
FEEDBACK_COLUMNS = (
    "request_id",
    "source",
    "passed",
    "score",
    "cost_usd",
    "input_tokens",
    "output_tokens",
    "recorded_at",
    "file",
    "line",
    "imported_at",
)
_TRUE = ("true", "1", "yes", "pass", "passed", "y", "t")
_FALSE = ("false", "0", "no", "fail", "failed", "n", "f")


class TrafficImportError(ValueError):
    """A decision log or feedback file that cannot be imported; names the file and line."""


@dataclass(frozen=True)
class DecisionImport:
    files: int
    decisions: int
    new: int
    duplicates: int
    usage: int
    usage_matched: int
    truncated: list[str]


@dataclass(frozen=True)
class FeedbackImport:
    file: str
    rows: int
    new: int
    updated: int
    unchanged: int
    matched: int
    sources: list[str]


def log_files(sources: str | Path | Sequence[str | Path]) -> list[Path]:
    """The JSONL files of a decision log: files as given, folders searched recursively."""
    items = [sources] if isinstance(sources, (str, Path)) else list(sources)
    out: list[Path] = []
    for item in items:
        path = Path(item)
        if path.is_dir():
            out.extend(sorted(p for p in path.rglob("*.jsonl") if p.is_file()))
        elif path.is_file():
            out.append(path)
        else:
            raise TrafficImportError(f"{path}: no such decision log file or folder")
    return out


# -- reading decision logs --------------------------------------------------------------------


def _bad(where: str, field: str, value: Any, want: str) -> TrafficImportError:
    return TrafficImportError(
        f"{where}: field '{field}': {value!r} {want}; this line was not "
        "written by a routeopt gateway, or was edited (nothing was imported)"
    )


def _time(where: str, rec: dict, field: str = "time") -> datetime:
    value = rec.get(field)
    try:
        t = datetime.fromisoformat(str(value))
    except ValueError:
        raise _bad(where, field, value, "is not an ISO-8601 time") from None
    return t if t.tzinfo else t.replace(tzinfo=timezone.utc)


def _str(where: str, rec: dict, field: str, required: bool = True) -> str | None:
    value = rec.get(field)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not value:
        raise _bad(where, field, value, "must be a non-empty string")
    return value


def _num(
    where: str,
    rec: dict,
    field: str,
    lo: float = 0.0,
    hi: float = math.inf,
    required: bool = False,
    integer: bool = False,
) -> Any:
    value = rec.get(field)
    if value is None and not required:
        return None
    ok = (
        isinstance(value, (int, float))
        and not isinstance(value, bool)
        and math.isfinite(value)
        and lo <= value <= hi
        and (not integer or float(value).is_integer())
    )
    if not ok:
        kind = "a whole number" if integer else "a number"
        raise _bad(where, field, value, f"must be {kind} in [{lo:g}, {hi:g}]")
    return int(value) if integer else float(value)


def decision_row(where: str, rec: dict, source_file: str) -> dict[str, Any]:
    """One `decisions` row from one log line (validated)."""
    propensity = _num(where, rec, "propensity", required=True)
    if propensity <= 0 or propensity > 1:
        raise _bad(where, "propensity", propensity, "must lie in (0, 1]")
    shadow = rec.get("shadow") if isinstance(rec.get("shadow"), dict) else None
    exploration = rec.get("exploration") if isinstance(rec.get("exploration"), dict) else {}
    text = rec.get("text")
    return {
        "request_id": _str(where, rec, "request_id"),
        "time": _time(where, rec),
        "suite": _str(where, rec, "suite", required=False),
        "quality_target": _num(where, rec, "quality_target"),
        "prompt_hash": _str(where, rec, "prompt_hash", required=False),
        "prompt_chars": _num(where, rec, "prompt_chars", integer=True),
        "text": text if isinstance(text, str) else None,
        "channel": rec.get("channel") or "champion",
        "policy_version": _num(where, rec, "policy_version", integer=True),
        "model": _str(where, rec, "model"),
        "propensity": propensity,
        "policy_model": _str(where, rec, "policy_model", required=False),
        "policy_probability": _num(where, rec, "policy_probability", hi=1.0),
        "explored": bool(rec.get("explored", False)),
        "exploration_rate": _num(
            where, {"exploration.rate": exploration.get("rate")}, "exploration.rate", hi=1.0
        ),
        "eligible_json": json.dumps(exploration["eligible"])
        if isinstance(exploration.get("eligible"), list)
        else None,
        "canary_share": _num(where, rec, "canary_share", hi=1.0),
        "pass_probabilities_json": json.dumps(rec.get("pass_probabilities") or {}),
        "expected_cost_json": json.dumps(rec.get("expected_cost_usd") or {}),
        "shadow_channel": shadow.get("channel") if shadow else None,
        "shadow_version": _num(
            where,
            {"shadow.policy_version": shadow.get("policy_version")},
            "shadow.policy_version",
            integer=True,
        )
        if shadow
        else None,
        "shadow_model": shadow.get("model") if shadow else None,
        "shadow_json": json.dumps(shadow) if shadow else None,
        "source_file": source_file,
        "trace_id": _str(where, rec, "trace_id", required=False),
        "span_id": _str(where, rec, "span_id", required=False),
    }


def read_usage_line(where: str, rec: dict) -> tuple[str, int | None, int | None]:
    """(request id, input tokens, output tokens) of one usage record, validated."""
    u = _usage(where, rec)
    return u["request_id"], u["input_tokens"], u["output_tokens"]


def _usage(where: str, rec: dict) -> dict[str, Any]:
    return {
        "request_id": _str(where, rec, "request_id"),
        "input_tokens": _num(where, rec, "input_tokens", integer=True),
        "output_tokens": _num(where, rec, "output_tokens", integer=True),
        "cost_usd": _num(where, rec, "cost_usd"),
    }


def _lines(path: Path) -> Iterable[tuple[str, str, bool]]:
    """(where, line, is_last) for each non-blank line."""
    with path.open(encoding="utf-8", errors="replace") as fh:
        pending: tuple[str, str] | None = None
        for lineno, line in enumerate(fh, 1):
            if pending is not None:
                yield pending[0], pending[1], False
            pending = (f"{path}:{lineno}", line) if line.strip() else None
        if pending is not None:
            yield pending[0], pending[1], True


def read_log(paths: Sequence[Path]) -> tuple[list[dict], list[dict], list[str]]:
    """Decision rows, usage rows, and the truncated last lines skipped (a gateway mid-write)."""
    decisions: list[dict] = []
    usage: list[dict] = []
    truncated: list[str] = []
    for path in paths:
        for where, line, last in _lines(path):
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as exc:
                if last and not line.endswith("\n"):
                    truncated.append(where)
                    continue
                raise TrafficImportError(f"{where}: not valid JSON ({exc.msg})") from None
            if not isinstance(rec, dict):
                raise TrafficImportError(f"{where}: expected a JSON object")
            kind = rec.get("kind", "decision")
            if kind == "decision":
                decisions.append(decision_row(where, rec, str(path)))
            elif kind == "usage":
                usage.append(_usage(where, rec))
            else:
                raise _bad(where, "kind", kind, "must be 'decision' or 'usage'")
    return decisions, usage, truncated


def import_decisions(sources: str | Path | Sequence[str | Path], store: Store) -> DecisionImport:
    """Read decision logs into `decisions` (the first record of a request id wins) and add each
    request's usage (the sum of its usage records: a fallback call adds its own)."""
    import pandas as pd

    paths = log_files(sources)
    rows, usage, truncated = read_log(paths)
    first: dict[str, dict] = {}
    for row in rows:
        first.setdefault(row["request_id"], row)
    before = _count(store, "decisions")
    now = datetime.now(timezone.utc)
    frame = pd.DataFrame([{**r, "imported_at": now} for r in first.values()], columns=list(DECISION_COLUMNS))
    store.write_frame(
        frame,
        f"INSERT INTO decisions ({', '.join(DECISION_COLUMNS)}) "
        f"SELECT {', '.join(DECISION_COLUMNS)} FROM _frame ON CONFLICT DO NOTHING",
    )
    new = _count(store, "decisions") - before
    matched = _apply_usage(store, usage)
    return DecisionImport(len(paths), len(first), new, len(rows) - len(first), len(usage), matched, truncated)


def _count(store: Store, table: str) -> int:
    return int(store.query(f"SELECT count(*) AS n FROM {table}").n.iloc[0])


def _apply_usage(store: Store, usage: list[dict]) -> int:
    import pandas as pd

    if not usage:
        return 0
    frame = (
        pd.DataFrame(usage)
        .groupby("request_id", as_index=False)
        .agg(
            input_tokens=("input_tokens", lambda s: s.sum(min_count=1)),
            output_tokens=("output_tokens", lambda s: s.sum(min_count=1)),
            cost_usd=("cost_usd", lambda s: s.sum(min_count=1)),
        )
    )
    ids = frame.request_id.tolist()
    matched = int(
        store.query("SELECT count(*) AS n FROM decisions WHERE list_contains(?, request_id)", [ids]).n.iloc[0]
    )
    store.write_frame(
        frame,
        "UPDATE decisions SET input_tokens = CAST(_frame.input_tokens AS BIGINT), "
        "output_tokens = CAST(_frame.output_tokens AS BIGINT), "
        "cost_usd = _frame.cost_usd FROM _frame "
        "WHERE decisions.request_id = _frame.request_id",
    )
    return matched


# -- feedback ---------------------------------------------------------------------------------


def _fb_error(where: str, column: str, value: Any, want: str) -> TrafficImportError:
    return TrafficImportError(
        f"{where}: column '{column}': {value!r} {want}; fix the row and "
        "import again (nothing of this file was imported)"
    )


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or (isinstance(v, str) and not v.strip())


def _fb_passed(where: str, v: Any) -> bool | None:
    if _missing(v):
        return None
    if isinstance(v, bool):
        return v
    if isinstance(v, (int, float)) and float(v) in (0.0, 1.0):
        return bool(v)
    if isinstance(v, str) and v.strip().lower() in _TRUE + _FALSE:
        return v.strip().lower() in _TRUE
    raise _fb_error(where, "passed", v, "is not true/false (or 1/0, pass/fail)")


def _fb_number(where: str, column: str, v: Any, hi: float = math.inf, integer: bool = False) -> Any:
    if _missing(v):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise _fb_error(where, column, v, "is not a number") from None
    if isinstance(v, bool) or not math.isfinite(x) or not 0 <= x <= hi or (integer and not x.is_integer()):
        kind = "a whole number" if integer else "a number"
        raise _fb_error(where, column, v, f"must be {kind} in [0, {hi:g}]")
    return int(x) if integer else x


def feedback_row(where: str, rec: dict, source: str, pass_threshold: float) -> dict[str, Any]:
    rid = rec.get("request_id")
    if _missing(rid) or not isinstance(rid, (str, int)) or isinstance(rid, bool):
        raise _fb_error(where, "request_id", rid, "is missing or not text")
    passed = _fb_passed(where, rec.get("passed"))
    score = _fb_number(where, "score", rec.get("score"), hi=1.0)
    if passed is None and score is None:
        raise TrafficImportError(
            f"{where}: needs a 'passed' or a 'score' value; fix the row and "
            "import again (nothing of this file was imported)"
        )
    recorded = rec.get("time", rec.get("recorded_at"))
    if not _missing(recorded):
        try:
            recorded = _time(where, {"time": str(recorded)})
        except TrafficImportError:
            raise _fb_error(where, "time", recorded, "is not an ISO-8601 time") from None
    row_source = rec.get("source")
    return {
        "request_id": str(rid).strip(),
        "source": source if _missing(row_source) else str(row_source),
        "passed": passed if passed is not None else score >= pass_threshold,
        "score": score if score is not None else float(passed),
        "cost_usd": _fb_number(where, "cost_usd", rec.get("cost_usd")),
        "input_tokens": _fb_number(where, "input_tokens", rec.get("input_tokens"), integer=True),
        "output_tokens": _fb_number(where, "output_tokens", rec.get("output_tokens"), integer=True),
        "recorded_at": None if _missing(recorded) else recorded,
        "line": where.rpartition(":")[2] if ":" in where else where,
    }


def read_feedback(path: Path, source: str = "feedback", pass_threshold: float = 0.5) -> list[dict]:
    """Validate every row of a feedback file; the first bad row raises with its file and line."""
    try:
        records = list(file_records(path))
    except (DatasetError, UnicodeDecodeError) as exc:
        raise TrafficImportError(str(exc)) from None
    rows: list[dict] = []
    seen: dict[tuple[str, str], str] = {}
    for where, rec in records:
        if isinstance(rec, str):
            raise TrafficImportError(f"{where}: {rec}; fix the row and import again")
        row = feedback_row(where, rec, source, pass_threshold)
        key = (row["request_id"], row["source"])
        if key in seen:
            raise TrafficImportError(
                f"{where}: request_id {key[0]!r} from source {key[1]!r} "
                f"repeats {seen[key]}; keep one row per request and source"
            )
        seen[key] = where
        rows.append(row)
    if not rows:
        raise TrafficImportError(f"{path}: no feedback rows")
    return rows


def import_feedback(
    path: str | Path, store: Store, *, source: str = "feedback", pass_threshold: float = 0.5
) -> FeedbackImport:
    """Validate a feedback file and upsert it; says how many rows meet a logged decision."""
    import pandas as pd

    path = Path(path)
    rows = read_feedback(path, source, pass_threshold)
    now = datetime.now(timezone.utc)
    frame = pd.DataFrame(
        [{**r, "file": str(path), "imported_at": now} for r in rows], columns=list(FEEDBACK_COLUMNS)
    )
    ids = sorted({r["request_id"] for r in rows})
    old = store.query(
        "SELECT request_id, source, passed, score, cost_usd, input_tokens, output_tokens "
        "FROM feedback WHERE list_contains(?, request_id)",
        [ids],
    )
    before = {(r.request_id, r.source): r for r in old.itertuples()}
    new = updated = 0
    for r in rows:
        prior = before.get((r["request_id"], r["source"]))
        if prior is None:
            new += 1
        elif any(
            not _same(getattr(prior, c), r[c])
            for c in ("passed", "score", "cost_usd", "input_tokens", "output_tokens")
        ):
            updated += 1
    sets = ", ".join(f"{c} = EXCLUDED.{c}" for c in FEEDBACK_COLUMNS if c not in ("request_id", "source"))
    store.write_frame(
        frame,
        f"INSERT INTO feedback ({', '.join(FEEDBACK_COLUMNS)}) SELECT "
        f"{', '.join(FEEDBACK_COLUMNS)} FROM _frame ON CONFLICT DO UPDATE SET {sets}",
    )
    matched = int(
        store.query("SELECT count(*) AS n FROM decisions WHERE list_contains(?, request_id)", [ids]).n.iloc[0]
    )
    return FeedbackImport(
        str(path),
        len(rows),
        new,
        updated,
        len(rows) - new - updated,
        matched,
        sorted({r["source"] for r in rows}),
    )


def _same(a: Any, b: Any) -> bool:
    import pandas as pd

    a_missing, b_missing = a is pd.NA or _missing(a), _missing(b)
    if a_missing or b_missing:
        return a_missing and b_missing
    if isinstance(b, float) or isinstance(a, float):
        return math.isclose(float(a), float(b), rel_tol=1e-12, abs_tol=0.0)
    return bool(a == b)


# -- reading the traffic back: what `routeopt.router_training.live.promise` scores policies on -------------------

TRAFFIC_COLUMNS = (
    "request_id",
    "time",
    "suite",
    "quality_target",
    "text",
    "channel",
    "policy_version",
    "model",
    "propensity",
    "policy_model",
    "explored",
    "exploration_rate",
    "eligible_json",
    "pass_probabilities_json",
    "expected_cost_json",
    "shadow_version",
    "shadow_model",
    "shadow_json",
    "input_tokens",
    "output_tokens",
    "cost_usd",
    "prompt_chars",
    "prompt_hash",
)
FEEDBACK_SUMMARY_COLUMNS = [
    "request_id",
    "passed",
    "feedback_cost_usd",
    "feedback_input_tokens",
    "feedback_output_tokens",
    "sources",
]


def decisions_from_store(store: Any, since: str | None = None, until: str | None = None) -> pd.DataFrame:
    """Logged decisions in [since, until) (ISO dates or times), oldest first, ties by request id
    (so every read sees one order; none without a store)."""
    if store is None or not store.has_table("decisions"):
        return pd.DataFrame(columns=list(TRAFFIC_COLUMNS))
    where, params = [], []
    if since:
        where.append("time >= CAST(? AS TIMESTAMPTZ)")
        params.append(since)
    if until:
        where.append("time < CAST(? AS TIMESTAMPTZ)")
        params.append(until)
    clause = f"WHERE {' AND '.join(where)}" if where else ""
    return store.query(
        f"SELECT {', '.join(TRAFFIC_COLUMNS)} FROM decisions {clause} ORDER BY time, request_id", params
    )


def decisions_from_log(paths: str | Path | Sequence[str | Path]) -> pd.DataFrame:
    """The same frame read straight from decision log files (first record per request id)."""
    rows, usage, _ = read_log(log_files(paths))
    frame = pd.DataFrame(
        rows, columns=[c for c in TRAFFIC_COLUMNS if c not in ("input_tokens", "output_tokens", "cost_usd")]
    )
    frame = frame.drop_duplicates("request_id", keep="first")
    if usage:
        sums = (
            pd.DataFrame(usage)
            .groupby("request_id")[["input_tokens", "output_tokens", "cost_usd"]]
            .sum(min_count=1)
        )
        frame = frame.merge(sums, how="left", left_on="request_id", right_index=True)
    for c in ("input_tokens", "output_tokens", "cost_usd"):
        if c not in frame:
            frame[c] = np.nan
    return frame.sort_values("time", kind="stable").reset_index(drop=True)


def feedback_from_store(store: Any, source: str | None = None) -> pd.DataFrame:
    """Per request: the mean of its feedback's `passed` over sources (or one source) and cost
    (none without a store: feedback lives only in a database)."""
    if store is None or not store.has_table("feedback"):
        return pd.DataFrame(columns=FEEDBACK_SUMMARY_COLUMNS)
    clause, params = ("WHERE source = ?", [source]) if source else ("", [])
    return store.query(
        "SELECT request_id, avg(CAST(passed AS DOUBLE)) AS passed, avg(cost_usd) AS feedback_cost_usd, "
        "avg(input_tokens) AS feedback_input_tokens, avg(output_tokens) AS feedback_output_tokens, "
        f"count(*) AS sources FROM feedback {clause} GROUP BY request_id",
        params,
    )


def window(decisions: pd.DataFrame, since: str | None, until: str | None) -> pd.DataFrame:
    """The decisions in [since, until) (ISO dates or times, UTC unless they say otherwise)."""
    if not since and not until:
        return decisions
    t = pd.to_datetime(decisions["time"], utc=True)
    keep = np.ones(len(decisions), dtype=bool)
    if since:
        keep &= (
            t >= pd.Timestamp(since, tz="UTC")
            if pd.Timestamp(since).tzinfo is None
            else t >= pd.Timestamp(since)
        ).to_numpy()
    if until:
        keep &= (
            t < pd.Timestamp(until, tz="UTC")
            if pd.Timestamp(until).tzinfo is None
            else t < pd.Timestamp(until)
        ).to_numpy()
    return decisions[keep].reset_index(drop=True)


def traffic_frame(decisions: pd.DataFrame, feedback: pd.DataFrame) -> pd.DataFrame:
    """Decisions with their feedback; `cost` is the observed cost (feedback, else usage)."""
    frame = decisions.merge(feedback, how="left", on="request_id")
    fb_cost = pd.to_numeric(frame.get("feedback_cost_usd"), errors="coerce")
    frame["cost"] = fb_cost.fillna(pd.to_numeric(frame["cost_usd"], errors="coerce"))
    frame["passed"] = pd.to_numeric(frame["passed"], errors="coerce")
    return frame


def load_traffic(
    store: Any, *, since: str | None = None, until: str | None = None, source: str | None = None
) -> pd.DataFrame:
    """The stored decisions in [since, until) with their feedback (of one `source`, or all)."""
    return traffic_frame(decisions_from_store(store, since, until), feedback_from_store(store, source))
