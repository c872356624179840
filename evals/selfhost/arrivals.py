"""What `routeopt bench replay` replays: logged arrivals, checked, ordered and made sendable.

Two inputs: gateway decision logs (`routeopt.artifacts.serving.gateway.DecisionLog` JSONL: each decision's time,
served model and prompt length; tokens from its usage records; text where the redaction hook
kept it), or an arrival trace (.jsonl or .csv: `timestamp` as ISO-8601 or seconds, `model` or
`suite`, `input_tokens`, `output_tokens`, optional `text`).

Bad input is named by file and line: a line that is not valid, a model that is not a candidate
(unless mapped with `--model LOGGED=CANDIDATE`, or `--skip-unknown`), a missing token count that
cannot be filled (the model's mean of the known counts fills it, marked estimated, else
`--output-tokens`). Unsorted lines (several gateways' files) are put in time order, duplicate
request ids keep their first line, simultaneous arrivals stay simultaneous, and gaps longer
than `max_gap_s` are shortened to it; each of these is counted in the notes the report prints.
Where the log kept no text, a prompt of the recorded length is synthesised (about 4 characters
per token, `routeopt.evals.providers.sdk.estimate_tokens`'s rule), distinct per arrival so that no
prefix cache flatters the server.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Mapping, Sequence

from routeopt.evals.suite.datasets import DatasetError, file_records

WORDS = (
    "the of and to in is that for it as was with be by on not he this are or his from at "
    "which but have an they you were her she there been one all we their has would when if "
    "so no what up out said about into than them can only other time new some could these "
    "two may first then do any like my now over such our man me even most made after also"
).split()


class ReplayInputError(ValueError):
    """A log or trace that cannot be replayed as asked; names the file and line."""


@dataclass(frozen=True)
class Arrival:
    offset_s: float  # after the first arrival, gaps shortened; divided by the speed when sent
    model: str  # the candidate it goes to
    input_tokens: int
    output_tokens: int
    text: str | None  # as logged; None: a prompt of `input_tokens` is synthesised
    where: str  # file:line
    estimated: bool = False  # a token count was filled in


@dataclass
class Arrivals:
    items: list[Arrival]
    sources: list[str]
    notes: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.items[-1].offset_s if self.items else 0.0

    def models(self) -> list[str]:
        return sorted({a.model for a in self.items})


def synthesize(tokens: int, seed: int) -> str:
    """A prompt of about `tokens` tokens (4 characters each), different for every seed."""
    target = max(4, 4 * tokens)
    out, i = [f"[{seed}]"], seed * 7919
    n = len(out[0])
    while n < target:
        word = WORDS[i % len(WORDS)]
        out.append(word)
        n += len(word) + 1
        i = i * 1103515245 + 12345 & 0x7FFFFFFF
    return " ".join(out)


def _when(value: Any, where: str) -> float:
    """Seconds since the epoch from an ISO-8601 time or a number of seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    if isinstance(value, str) and value.strip():
        try:
            return float(value)
        except ValueError:
            pass
        try:
            t = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
        except ValueError:
            pass
        else:
            return (t if t.tzinfo else t.replace(tzinfo=timezone.utc)).timestamp()
    raise ReplayInputError(f"{where}: timestamp {value!r} is neither an ISO-8601 time nor seconds")


def _count(value: Any, where: str, name: str) -> int | None:
    if value is None or value == "":
        return None
    try:
        number = float(value)
    except (TypeError, ValueError):
        number = math.nan
    if not math.isfinite(number) or number < 0 or not number.is_integer():
        raise ReplayInputError(f"{where}: {name} {value!r} is not a whole number of tokens")
    return int(number)


@dataclass
class _Row:
    t: float
    key: str  # the logged model, or "suite:NAME"
    input_tokens: int | None
    output_tokens: int | None
    text: str | None
    where: str
    request_id: str | None = None
    prompt_chars: int | None = None


def _decision_rows(path: Path) -> list[_Row]:
    """Decisions of a gateway log with their usage (tokens) joined by request id."""
    from routeopt.evals.storage.traffic import TrafficImportError, decision_row, read_usage_line

    rows: list[_Row] = []
    usage: dict[str, list[int | None]] = {}
    for where, rec in _jsonl(path):
        try:
            if rec.get("kind", "decision") == "usage":
                rid, inp, out = read_usage_line(where, rec)
                have = usage.setdefault(rid, [None, None])
                have[0] = inp if have[0] is None else have[0] + (inp or 0)
                have[1] = out if have[1] is None else have[1] + (out or 0)
                continue
            d = decision_row(where, rec, str(path))
        except TrafficImportError as exc:
            raise ReplayInputError(str(exc)) from None
        rows.append(
            _Row(
                d["time"].timestamp(),
                d["model"],
                None,
                None,
                d["text"],
                where,
                d["request_id"],
                d["prompt_chars"],
            )
        )
    for r in rows:
        if r.request_id in usage:
            r.input_tokens, r.output_tokens = usage[r.request_id]
    return rows


def _jsonl(path: Path) -> list[tuple[str, dict]]:
    from routeopt.evals.suite.datasets import jsonl_records

    out = []
    for where, rec in jsonl_records(path):
        if isinstance(rec, str):
            raise ReplayInputError(f"{where}: {rec}")
        if not isinstance(rec, dict):
            raise ReplayInputError(f"{where}: expected a JSON object")
        out.append((where, rec))
    return out


def _trace_rows(path: Path) -> list[_Row]:
    """Rows of an arrival trace (.jsonl or .csv)."""
    rows = []
    try:
        records = list(file_records(path))
    except DatasetError as exc:
        raise ReplayInputError(str(exc)) from None
    for where, rec in records:
        if isinstance(rec, str):
            raise ReplayInputError(f"{where}: {rec}")
        key = rec.get("model") or (f"suite:{rec['suite']}" if rec.get("suite") else None)
        if not key:
            raise ReplayInputError(f"{where}: needs a 'model' (or a 'suite') to send the request to")
        text = rec.get("text")
        rows.append(
            _Row(
                _when(rec.get("timestamp", rec.get("time")), where),
                str(key),
                _count(rec.get("input_tokens"), where, "input_tokens"),
                _count(rec.get("output_tokens"), where, "output_tokens"),
                text if isinstance(text, str) and text else None,
                where,
                rec.get("request_id"),
            )
        )
    return rows


def _is_decision_log(path: Path) -> bool:
    if path.suffix.lower() not in (".jsonl", ".ndjson"):
        return False
    with path.open(encoding="utf-8-sig") as fh:
        for line in fh:
            if line.strip():
                return '"kind"' in line and ('"decision"' in line or '"usage"' in line)
    return False


def read_rows(sources: Sequence[str | Path]) -> tuple[list[_Row], list[str]]:
    """Every row of the given files and folders (folders: their .jsonl files), and the files."""
    files: list[Path] = []
    for source in sources:
        p = Path(source)
        if p.is_dir():
            files.extend(sorted(q for q in p.rglob("*.jsonl") if q.is_file()))
        elif p.is_file():
            files.append(p)
        else:
            raise ReplayInputError(f"{p}: no such log, trace file or folder")
    if not files:
        raise ReplayInputError(f"{', '.join(map(str, sources))}: no .jsonl files to replay")
    rows: list[_Row] = []
    for f in files:
        rows.extend(_decision_rows(f) if _is_decision_log(f) else _trace_rows(f))
    return rows, [str(f) for f in files]


def _resolve_models(
    rows: list[_Row],
    candidates: Sequence[str],
    mapping: Mapping[str, str],
    only: str | None,
    skip_unknown: bool,
    notes: list[str],
) -> list[tuple[_Row, str]]:
    known = set(candidates)
    out, unknown = [], {}
    for r in rows:
        target = only or mapping.get(r.key, r.key)
        if target in known:
            out.append((r, target))
        else:
            unknown.setdefault(r.key, []).append(r.where)
    if unknown and not skip_unknown:
        listed = "; ".join(f"{k!r} ({len(w)} arrivals, first at {w[0]})" for k, w in sorted(unknown.items()))
        raise ReplayInputError(
            f"not candidates of the config: {listed}. Map them with --model LOGGED=CANDIDATE, send "
            f"everything to one with --candidate, or leave them out with --skip-unknown; "
            f"candidates: {', '.join(sorted(known))}"
        )
    for k, w in sorted(unknown.items()):
        notes.append(f"{len(w)} arrivals for {k!r}, not a candidate, were left out (first at {w[0]})")
    return out


def _fill_tokens(pairs: list[tuple[_Row, str]], default_output: int | None) -> list[tuple[_Row, str, bool]]:
    """Input from the text or prompt length when not logged; missing counts from the model's mean."""
    means: dict[str, list[float]] = {}
    for r, m in pairs:
        if r.input_tokens is None:
            if r.text:
                r.input_tokens = math.ceil(len(r.text) / 4)
            elif r.prompt_chars:
                r.input_tokens = math.ceil(r.prompt_chars / 4)
        for i, v in enumerate((r.input_tokens, r.output_tokens)):
            if v is not None:
                means.setdefault(f"{m}#{i}", []).append(v)
    out = []
    for (
        r,
        m,
    ) in pairs:
        estimated = r.input_tokens is None or r.output_tokens is None
        for i, name in enumerate(("input_tokens", "output_tokens")):
            if getattr(r, name) is not None:
                continue
            known = means.get(f"{m}#{i}")
            if known:
                setattr(r, name, max(1, round(sum(known) / len(known))))
            elif name == "output_tokens" and default_output:
                r.output_tokens = default_output
            else:
                hint = " or give --output-tokens" if name == "output_tokens" else ""
                raise ReplayInputError(
                    f"{r.where}: no {name} for {m!r}, and no other arrival of it "
                    f"has one to estimate from; add the counts{hint}"
                )
        out.append((r, m, estimated))
    return out


def load_arrivals(
    sources: Sequence[str | Path],
    candidates: Sequence[str],
    *,
    mapping: Mapping[str, str] | None = None,
    only: str | None = None,
    skip_unknown: bool = False,
    max_gap_s: float | None = 60.0,
    default_output_tokens: int | None = None,
    limit_s: float | None = None,
) -> Arrivals:
    """The arrivals to replay, in time order, with what was done to the input in `notes`."""
    rows, files = read_rows(sources)
    notes: list[str] = []
    _order(rows, notes)
    rows = _dedupe(rows, notes)
    pairs = _fill_tokens(
        _resolve_models(rows, candidates, mapping or {}, only, skip_unknown, notes), default_output_tokens
    )
    if not pairs:
        raise ReplayInputError(f"{', '.join(files)}: nothing to replay")
    items = _offsets(pairs, max_gap_s, notes)
    if limit_s is not None:
        items = [a for a in items if a.offset_s <= limit_s]
    n_est = sum(a.estimated for a in items)
    if n_est:
        notes.append(f"{n_est} arrivals had a token count filled in (the model's mean, marked estimated)")
    synthesized = sum(a.text is None for a in items)
    if synthesized:
        notes.append(f"{synthesized} arrivals had no text: prompts of their input length were synthesised")
    return Arrivals(items, files, notes)


def _order(rows: list[_Row], notes: list[str]) -> None:
    late = [r for prev, r in zip(rows, rows[1:]) if r.t < prev.t]
    if late:
        notes.append(
            f"{len(late)} arrivals were out of time order (first at {late[0].where}); "
            "they are replayed in time order"
        )
    rows.sort(key=lambda r: r.t)
    same = sum(1 for a, b in zip(rows, rows[1:]) if a.t == b.t)
    if same:
        notes.append(f"{same} arrivals share their timestamp with the one before: they are sent together")


def _dedupe(rows: list[_Row], notes: list[str]) -> list[_Row]:
    seen: dict[str, str] = {}
    out, dup = [], []
    for r in rows:
        if r.request_id is not None and r.request_id in seen:
            dup.append(r.where)
            continue
        if r.request_id is not None:
            seen[r.request_id] = r.where
        out.append(r)
    if dup:
        notes.append(
            f"{len(dup)} lines repeat a request id already seen (first at {dup[0]}): "
            "the first line of each request is replayed"
        )
    return out


def _offsets(pairs: list[tuple[_Row, str, bool]], max_gap_s: float | None, notes: list[str]) -> list[Arrival]:
    items, cut, shortened = [], 0.0, []
    t0 = prev = pairs[0][0].t
    for r, model, estimated in pairs:
        gap = r.t - prev
        if max_gap_s is not None and gap > max_gap_s:
            cut += gap - max_gap_s
            shortened.append(f"{gap:,.0f} s before {r.where}")
        prev = r.t
        items.append(
            Arrival(
                r.t - t0 - cut,
                model,
                int(r.input_tokens or 1),
                int(r.output_tokens or 1),
                r.text,
                r.where,
                estimated,
            )
        )
    if shortened:
        notes.append(
            f"{len(shortened)} gaps longer than {max_gap_s:g} s were shortened to it "
            f"({cut:,.0f} s of idle time cut; {'; '.join(shortened[:3])}"
            f"{'; ...' if len(shortened) > 3 else ''})"
        )
    return items
