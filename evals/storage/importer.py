"""Import recorded outcomes (Parquet, CSV or JSONL, one row per request x model) into the store.

Imported results land in the same tables as eval runs (a run with source='import', its
candidates, a suite version hashed from the file's items, the items and the outcomes), so
router training treats them like any other run. Importing the same file twice changes nothing:
the run id and suite versions are content hashes and the store ignores rows it already has.
"""

from __future__ import annotations

import hashlib
import json
import math
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from routeopt.evals.suite.datasets import jsonl_records
from routeopt.evals.storage.store import Outcome, Store

REQUIRED = ("request_id", "prompt", "model")
OPTIONAL_FLOATS = ("cost_usd", "latency_s", "ttft_s")
OPTIONAL_INTS = ("input_tokens", "output_tokens")


class OutcomeImportError(ValueError):
    """A file that cannot be imported; the message names the file, the row and the column."""


@dataclass(frozen=True)
class ImportSummary:
    run_id: str
    rows: int
    requests: int
    candidates: list[str]
    suites: dict[str, str]  # suite -> version
    new_run: bool


def _read_jsonl(path: Path) -> pd.DataFrame:
    records = []
    for where, rec in jsonl_records(path):
        if isinstance(rec, str):
            raise OutcomeImportError(f"{where}: {rec}")
        records.append(rec)
    return pd.DataFrame.from_records(records)


def read_outcome_file(path: Path) -> pd.DataFrame:
    """Load a long-format outcome file by its extension (.parquet, .csv, .jsonl/.json)."""
    suffix = path.suffix.lower()
    if not path.is_file():
        raise OutcomeImportError(f"{path}: no such file")
    try:
        if suffix in (".parquet", ".pq"):
            return pd.read_parquet(path)
        if suffix == ".csv":
            return pd.read_csv(
                path, dtype={"request_id": str, "model": str, "suite": str}, keep_default_na=True
            )
    except (OSError, ValueError) as e:
        raise OutcomeImportError(f"{path}: cannot read ({e})") from None
    if suffix in (".jsonl", ".json", ".ndjson"):
        return _read_jsonl(path)
    raise OutcomeImportError(f"{path}: unknown format {suffix!r}; use .parquet, .csv or .jsonl")


def _missing(v: Any) -> bool:
    return v is None or (isinstance(v, float) and math.isnan(v)) or v is pd.NA


def _where(path: Path, i: int) -> str:
    """Human row reference: data row number (1-based) as the user sees it in the file."""
    if path.suffix.lower() == ".csv":
        return f"{path}: row {i + 1} (line {i + 2})"
    return f"{path}: row {i + 1}"


def _number(path: Path, i: int, col: str, v: Any, integer: bool = False) -> float | int | None:
    if _missing(v):
        return None
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise OutcomeImportError(f"{_where(path, i)}, column '{col}': {v!r} is not a number") from None
    if not math.isfinite(x) or x < 0:
        raise OutcomeImportError(f"{_where(path, i)}, column '{col}': {v!r} must be a finite number >= 0")
    if integer:
        if x != int(x):
            raise OutcomeImportError(f"{_where(path, i)}, column '{col}': {v!r} must be a whole number")
        return int(x)
    return x


def _passed(path: Path, i: int, v: Any) -> bool | None:
    if _missing(v):
        return None
    if isinstance(v, str):
        low = v.strip().lower()
        if low in ("true", "1", "yes", "pass", "passed"):
            return True
        if low in ("false", "0", "no", "fail", "failed"):
            return False
    elif isinstance(v, (bool, int, float)) and float(v) in (0.0, 1.0):
        return bool(v)
    raise OutcomeImportError(f"{_where(path, i)}, column 'passed': {v!r} is not true/false")


def _text(path: Path, i: int, col: str, v: Any, allow_empty: bool = False) -> str:
    if _missing(v) or not isinstance(v, (str, int)) or (str(v).strip() == "" and not allow_empty):
        raise OutcomeImportError(f"{_where(path, i)}, column '{col}': missing or not text ({v!r})")
    return str(v)


def _row(path: Path, i: int, rec: dict, suite_default: str, has_score: bool) -> dict:
    out = {c: _text(path, i, c, rec[c], allow_empty=(c == "prompt")) for c in REQUIRED}
    suite = rec.get("suite")
    out["suite"] = suite_default if _missing(suite) or str(suite).strip() == "" else str(suite)
    passed = _passed(path, i, rec.get("passed"))
    score = _number(path, i, "score", rec.get("score")) if has_score else None
    if score is not None and score > 1:
        raise OutcomeImportError(f"{_where(path, i)}, column 'score': {score} must lie in [0, 1]")
    if score is None and passed is None:
        raise OutcomeImportError(f"{_where(path, i)}: needs a 'score' or a 'passed' value")
    out["score"] = score if score is not None else float(passed)
    out["passed"] = passed if passed is not None else out["score"] >= 0.5
    for c in OPTIONAL_FLOATS:
        out[c] = _number(path, i, c, rec.get(c))
    for c in OPTIONAL_INTS:
        out[c] = _number(path, i, c, rec.get(c), integer=True)
    response = rec.get("response")
    out["response"] = None if _missing(response) else str(response)
    return out


def validate(frame: pd.DataFrame, path: Path, suite_default: str) -> list[dict]:
    """Check columns and every row; the first problem raises with its row and column."""
    missing = [c for c in REQUIRED if c not in frame.columns]
    if "score" not in frame.columns and "passed" not in frame.columns:
        missing.append("score (or passed)")
    if missing:
        raise OutcomeImportError(f"{path}: missing required column(s): {', '.join(missing)}")
    if frame.empty:
        raise OutcomeImportError(f"{path}: no rows to import")
    has_score = "score" in frame.columns
    rows = [
        _row(path, i, rec, suite_default, has_score) for i, rec in enumerate(frame.to_dict(orient="records"))
    ]
    seen: dict[tuple[str, str, str], int] = {}
    prompts: dict[tuple[str, str], tuple[str, int]] = {}
    for i, r in enumerate(rows):
        key = (r["suite"], r["request_id"], r["model"])
        if key in seen:
            raise OutcomeImportError(
                f"{_where(path, i)}: duplicate of {_where(path, seen[key])} "
                f"(same suite, request_id and model)"
            )
        seen[key] = i
        first = prompts.setdefault((r["suite"], r["request_id"]), (r["prompt"], i))
        if first[0] != r["prompt"]:
            raise OutcomeImportError(
                f"{_where(path, i)}, column 'prompt': differs from the prompt of the "
                f"same request_id at {_where(path, first[1])}"
            )
    return rows


def _suite_version(items: list[tuple[str, str]]) -> str:
    h = hashlib.sha256()
    for request_id, prompt in sorted(items):
        h.update(json.dumps([request_id, prompt]).encode("utf-8"))
    return "import-" + h.hexdigest()[:16]


def _file_hash(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def import_outcomes(
    path: str | Path, store: Store, run_id: str | None = None, suite_default: str = "imported"
) -> ImportSummary:
    """Validate a long-format outcome file and write it to the store as one 'import' run."""
    path = Path(path)
    rows = validate(read_outcome_file(path), path, suite_default)
    digest = _file_hash(path)
    run_id = run_id or f"import-{digest[:16]}"
    items: dict[str, dict[str, str]] = {}
    for r in rows:
        items.setdefault(r["suite"], {})[r["request_id"]] = r["prompt"]
    versions = {s: _suite_version(list(its.items())) for s, its in items.items()}
    candidates = sorted({r["model"] for r in rows})
    new = store.begin_run(
        run_id,
        source="import",
        config_fingerprint=digest,
        config={"file": str(path), "sha256": digest, "rows": len(rows)},
        candidates=[{"name": c, "provider": "import", "model": c} for c in candidates],
    )
    for suite, its in items.items():
        spec = {"name": suite, "source": "import", "file": path.name}
        store.register_suite(suite, versions[suite], spec, [(k, p, {}) for k, p in its.items()])
    store.write_outcomes(
        Outcome(
            run_id=run_id,
            suite=r["suite"],
            suite_version=versions[r["suite"]],
            item_id=r["request_id"],
            candidate=r["model"],
            passed=r["passed"],
            score=r["score"],
            input_tokens=r["input_tokens"],
            output_tokens=r["output_tokens"],
            cost_usd=r["cost_usd"],
            latency_s=r["latency_s"],
            ttft_s=r["ttft_s"],
            response=r["response"],
        )
        for r in rows
    )
    store.finish_run(run_id)
    return ImportSummary(
        run_id=run_id,
        rows=len(rows),
        requests=sum(len(v) for v in items.values()),
        candidates=candidates,
        suites=versions,
        new_run=new,
    )


def training_frame_of(path: str | Path) -> pd.DataFrame:
    """The training frame `routeopt train` reads after `routeopt import outcomes path` into a new
    store (a temporary one): what benchmarks train on, so they see exactly what a user's run sees."""
    with tempfile.TemporaryDirectory(prefix="routeopt-import-") as tmp:
        with Store(Path(tmp) / "outcomes.duckdb") as store:
            import_outcomes(path, store)
            return store.training_frame()
