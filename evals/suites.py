"""Eval suites: YAML files in `evals/suites/`, parsed into validated pydantic models.

A suite names a dataset, a prompt template, generation settings and a grader. Its version is a
hash of everything that changes its results (resolved spec and dataset content), and outcomes
record it, so results of an edited suite are never mixed with old ones.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from evals.graders import Grader, build_grader, render
from evals.providers.base import GenerationSettings, Message, Request


class SuiteError(ValueError):
    """A suite that cannot be used; the message names the file and field (or line)."""


class DatasetSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    path: Path
    id_field: str | None = None
    limit: int | None = Field(default=None, ge=1)
    seed: int = 0


class PromptSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str
    system: str | None = None


class GenerationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0, le=2)
    stop: list[str] = []

    def settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=self.max_tokens, temperature=self.temperature, stop=tuple(self.stop)
        )


class SuiteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    owner: str | None = None
    tags: list[str] = []
    dataset: DatasetSpec
    prompt: PromptSpec
    generation: GenerationSpec = GenerationSpec()
    grader: dict[str, Any]

    @field_validator("grader")
    @classmethod
    def _grader_valid(cls, v: dict[str, Any]) -> dict[str, Any]:
        build_grader(v)
        return v


@dataclass(frozen=True)
class Item:
    id: str
    fields: dict[str, Any]


@dataclass
class Suite:
    """A loaded suite: its spec, its items, its grader and its version hash."""

    spec: SuiteSpec
    source: Path
    items: list[Item]
    grader: Grader
    version: str

    @property
    def name(self) -> str:
        return self.spec.name

    def request(self, item: Item) -> Request:
        messages: list[Message] = []
        if self.spec.prompt.system:
            messages.append(Message("system", render(self.spec.prompt.system, item.fields)))
        messages.append(Message("user", render(self.spec.prompt.template, item.fields)))
        return Request(tuple(messages), self.spec.generation.settings())

    def prompt_text(self, item: Item) -> str:
        return self.request(item).prompt_text


def _validation_message(path: Path, err: ValidationError) -> str:
    lines = [f"{path}: invalid suite"]
    for e in err.errors():
        loc = ".".join(str(x) for x in e["loc"]) or "(top level)"
        lines.append(f"  {loc}: {e['msg']}")
    return "\n".join(lines)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    rows = []
    with path.open() as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise SuiteError(f"{path}:{lineno}: not valid JSON: {exc.msg}") from None
            if not isinstance(row, dict):
                raise SuiteError(f"{path}:{lineno}: expected a JSON object")
            rows.append(row)
    return rows


def _load_items(spec: SuiteSpec, source: Path) -> tuple[list[Item], str]:
    path = spec.dataset.path if spec.dataset.path.is_absolute() else source.parent / spec.dataset.path
    if not path.exists():
        raise SuiteError(f"{source}: dataset.path: file not found: {path}")
    rows = read_jsonl(path)
    if not rows:
        raise SuiteError(f"{source}: dataset.path: {path} has no rows")
    items = []
    for n, row in enumerate(rows):
        item_id = str(row[spec.dataset.id_field]) if spec.dataset.id_field else str(n)
        items.append(Item(item_id, row))
    if spec.dataset.limit and len(items) > spec.dataset.limit:
        import random

        rng = random.Random(spec.dataset.seed)
        items = sorted(rng.sample(items, spec.dataset.limit), key=lambda i: rows.index(i.fields))
    digest = hashlib.sha256(path.read_bytes()).hexdigest()
    return items, digest


def load_suite(path: str | Path) -> Suite:
    """Parse, validate and load one suite file; raise SuiteError naming file and field."""
    path = Path(path).resolve()
    try:
        raw = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f":{mark.line + 1}" if mark is not None else ""
        raise SuiteError(f"{path}{where}: not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise SuiteError(f"{path}: expected a mapping at the top level")
    try:
        spec = SuiteSpec.model_validate(raw)
    except ValidationError as err:
        raise SuiteError(_validation_message(path, err)) from None
    items, data_digest = _load_items(spec, path)
    try:
        render(spec.prompt.template, items[0].fields)
    except Exception as exc:  # jinja raises several types; all mean the template does not fit
        raise SuiteError(f"{path}: prompt.template: {exc}") from None
    spec_json = json.dumps(spec.model_dump(mode="json", exclude={"description", "owner", "tags"}),
                           sort_keys=True)
    version = hashlib.sha256((spec_json + data_digest).encode()).hexdigest()[:12]
    return Suite(spec, path, items, build_grader(spec.grader), version)


def discover_suites(folder: str | Path, names: list[str] | None = None) -> list[Path]:
    """Suite files in a folder (sorted), optionally filtered by suite file stem."""
    folder = Path(folder)
    if not folder.is_dir():
        raise SuiteError(f"{folder}: suites folder not found")
    paths = sorted(p for p in folder.glob("*.yaml") if not p.name.startswith("_"))
    if names:
        by_stem = {p.stem: p for p in paths}
        missing = [n for n in names if n not in by_stem]
        if missing:
            raise SuiteError(f"{folder}: no suite named {missing}; found {sorted(by_stem)}")
        paths = [by_stem[n] for n in names]
    return paths
