"""Suite datasets: local JSONL, CSV or Parquet files, or a Hugging Face dataset via `datasets`.

Rows become items through an optional field mapping, an id field and seeded sampling. Every row
that cannot be used is reported with its file and line (or row number), because a silently
dropped row would make two runs of "the same" suite incomparable.
"""

from __future__ import annotations

import csv
import hashlib
import json
import random
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from routeopt.evals.grading.base import lookup

Format = Literal["jsonl", "csv", "parquet"]
_SUFFIX_FORMAT: dict[str, Format] = {
    ".jsonl": "jsonl",
    ".ndjson": "jsonl",
    ".csv": "csv",
    ".parquet": "parquet",
    ".pq": "parquet",
}


class DatasetError(ValueError):
    """A dataset that cannot be loaded; the message names the file and the row or field."""


class HFSource(BaseModel):
    """A dataset on the Hugging Face hub (or a local dataset folder), read with `load_dataset`."""

    model_config = ConfigDict(extra="forbid")

    name: str
    subset: str | None = None
    split: str = "test"
    revision: str | None = None


class DatasetSpec(BaseModel):
    """Where a suite's rows come from and how they become items."""

    model_config = ConfigDict(extra="forbid")

    path: Path | None = None
    format: Format | None = None
    hf: HFSource | None = None
    fields: dict[str, str] = Field(
        default={}, description="item field -> source column (dotted path for nested values)"
    )
    id_field: str | None = None
    limit: int | None = Field(default=None, ge=1)
    seed: int = 0
    skip_bad_rows: bool = False

    @model_validator(mode="after")
    def _one_source(self) -> "DatasetSpec":
        if (self.path is None) == (self.hf is None):
            raise ValueError("give exactly one of `path` (a local file) or `hf` (a hub dataset)")
        if self.path is not None and self.format is None:
            fmt = _SUFFIX_FORMAT.get(self.path.suffix.lower())
            if fmt is None:
                raise ValueError(
                    f"cannot tell the format of {self.path.name!r}; set `format` to one of "
                    f"{sorted(set(_SUFFIX_FORMAT.values()))}"
                )
            self.format = fmt
        return self


@dataclass
class Rows:
    """Loaded items as (id, fields), the rows skipped (with why) and a digest of the content."""

    items: list[tuple[str, dict[str, Any]]]
    skipped: list[str] = field(default_factory=list)
    digest: str = ""


def jsonl_records(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Each non-blank line of a JSONL file as (`file:line`, its object), or (`file:line`, what
    is wrong with it), so every reader reports bad lines the same way and chooses what to do."""
    with path.open(encoding="utf-8-sig") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            where = f"{path}:{lineno}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                yield where, f"not valid JSON ({exc.msg})"
                continue
            yield where, row if isinstance(row, dict) else "expected a JSON object"


def _csv(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    with path.open(encoding="utf-8-sig", newline="") as fh:
        reader = csv.DictReader(fh)
        if not reader.fieldnames:
            return
        width = len(reader.fieldnames)
        for row in reader:
            where = f"{path}:{reader.line_num}"
            if None in row or any(v is None for v in row.values()):
                yield where, f"expected {width} columns ({', '.join(reader.fieldnames)})"
                continue
            yield where, dict(row)


def _parquet(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for a bad file
        raise DatasetError(f"{path}: not a readable Parquet file ({exc})") from None
    for i, row in enumerate(table.to_pylist()):
        yield f"{path} row {i}", row


def file_records(path: Path) -> Iterator[tuple[str, dict[str, Any] | str]]:
    """Rows of a .jsonl/.ndjson, .csv or .parquet file as (where, row) or (where, problem), the
    way suites read them (CSV values stay text); an unknown extension raises DatasetError."""
    suffix = path.suffix.lower()
    readers = {
        ".jsonl": jsonl_records,
        ".ndjson": jsonl_records,
        ".json": jsonl_records,
        ".csv": _csv,
        ".parquet": _parquet,
        ".pq": _parquet,
    }
    if suffix not in readers:
        raise DatasetError(f"{path}: unknown format {suffix!r}; use .jsonl, .csv or .parquet")
    if not path.is_file():
        raise DatasetError(f"{path}: no such file")
    return readers[suffix](path)


def _hub(src: HFSource) -> Iterator[tuple[str, dict[str, Any] | str]]:
    import datasets

    try:
        ds = datasets.load_dataset(src.name, src.subset, split=src.split, revision=src.revision)
    except Exception as exc:  # hub, cache and builder errors all mean "cannot load this"
        raise DatasetError(
            f"hf dataset {src.name!r} (subset {src.subset!r}, split {src.split!r}, revision "
            f"{src.revision!r}): cannot load: {type(exc).__name__}: {exc}"
        ) from None
    label = f"hf:{src.name}[{src.split}]"
    for i, row in enumerate(ds):
        yield f"{label} row {i}", dict(row)


def _raw_rows(spec: DatasetSpec, base_dir: Path) -> tuple[str, Iterator[tuple[str, Any]]]:
    if spec.hf is not None:
        return f"hf:{spec.hf.name}", _hub(spec.hf)
    assert spec.path is not None
    path = spec.path if spec.path.is_absolute() else base_dir / spec.path
    if not path.is_file():
        raise DatasetError(f"dataset file not found: {path}")
    reader = {"jsonl": jsonl_records, "csv": _csv, "parquet": _parquet}[spec.format or "jsonl"]
    return str(path), reader(path)


def _to_item(spec: DatasetSpec, row: dict[str, Any], n: int) -> tuple[str, dict[str, Any]]:
    fields = dict(row)
    for name, column in spec.fields.items():
        try:
            fields[name] = lookup(row, column)
        except KeyError:
            raise ValueError(f"fields.{name}: column {column!r} not in row") from None
    if spec.id_field is None:
        return str(n), fields
    if spec.id_field not in fields or fields[spec.id_field] in (None, ""):
        raise ValueError(f"id_field: row has no {spec.id_field!r}")
    return str(fields[spec.id_field]), fields


def content_digest(items: list[tuple[str, dict[str, Any]]]) -> str:
    payload = json.dumps(items, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(payload.encode()).hexdigest()


_Row = tuple[str, dict[str, Any]]


def _collect(spec: DatasetSpec, raw: Iterator[tuple[str, Any]]) -> tuple[list[_Row], list[str]]:
    items: list[_Row] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for where, row in raw:
        if isinstance(row, str):
            problems.append(f"{where}: {row}")
            continue
        try:
            item_id, fields = _to_item(spec, row, len(items))
        except ValueError as exc:
            problems.append(f"{where}: {exc}")
            continue
        if item_id in seen:
            problems.append(f"{where}: id {item_id!r} repeats the row at {seen[item_id]}")
            continue
        seen[item_id] = where
        items.append((item_id, fields))
    return items, problems


def load_rows(spec: DatasetSpec, base_dir: Path) -> Rows:
    """Read, map, check and sample a dataset. Raises DatasetError naming every bad row."""
    label, raw = _raw_rows(spec, base_dir)
    try:
        items, problems = _collect(spec, raw)
    except UnicodeDecodeError as exc:
        bad = exc.object[exc.start : exc.start + 1].hex()
        raise DatasetError(f"{label}: not UTF-8 text (a byte 0x{bad}); re-save it as UTF-8") from None
    except OSError as exc:
        raise DatasetError(f"{label}: cannot read: {exc.strerror or exc}") from None
    if problems and not spec.skip_bad_rows:
        more = f" (and {len(problems) - 20} more)" if len(problems) > 20 else ""
        raise DatasetError(
            f"{len(problems)} bad row(s){more}; fix them or set dataset.skip_bad_rows: true\n  "
            + "\n  ".join(problems[:20])
        )
    if not items:
        raise DatasetError(f"{label}: dataset has no usable rows")
    if spec.limit is not None and len(items) > spec.limit:
        keep = sorted(random.Random(spec.seed).sample(range(len(items)), spec.limit))
        items = [items[i] for i in keep]
    return Rows(items, problems, content_digest(items))
