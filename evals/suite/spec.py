"""Eval suites: YAML files in `evals/suites/`, parsed into validated pydantic models.

A suite names a dataset, a prompt (template or chat messages, optional system prompt and
few-shot examples), generation settings (with per-candidate overrides) and a grader. A suite
may `include:` other suite files and override fields (deep merge). Its version is a hash of
everything that changes its results (the resolved spec minus metadata, the dataset content, the
few-shot examples and any custom grader code), and outcomes record it, so results of an edited
suite are never mixed with old ones. Every problem is reported with its file, line and field.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from routeopt.evals.suite.datasets import DatasetError, DatasetSpec, content_digest, load_rows
from routeopt.evals.grading import (
    Grader,
    GraderContext,
    GraderSpecError,
    build_grader,
    pydantic_message,
    render,
    template_error,
)
from routeopt.evals.providers.base import GenerationSettings, Message, Request
from routeopt.evals.suite.files import Problem, Provenance, SuiteError, resolve_includes

if TYPE_CHECKING:
    from routeopt.evals.config import Config

__all__ = [
    "Item",
    "Problem",
    "Suite",
    "SuiteError",
    "SuiteSpec",
    "check_suite",
    "discover_suites",
    "load_suite",
    "read_jsonl",
]
METADATA = ("description", "owner", "tags")


class MessageSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    role: Literal["system", "user", "assistant"]
    content: str


class FewShotSpec(BaseModel):
    """Worked examples shown before each item, drawn (seeded) from another split or file."""

    model_config = ConfigDict(extra="forbid")

    dataset: DatasetSpec | None = None
    split: str | None = Field(default=None, description="another split of the suite's hf dataset")
    n: int = Field(default=3, ge=1, le=64)
    seed: int = 0
    answer: str = Field(description="template of the assistant turn, e.g. '{{ answer }}'")
    template: str | None = Field(default=None, description="user turn; default: prompt.template")

    @model_validator(mode="after")
    def _one_source(self) -> "FewShotSpec":
        if (self.dataset is None) == (self.split is None):
            raise ValueError("give exactly one of `dataset` (a file or hf source) or `split`")
        return self


class PromptSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    template: str | None = None
    system: str | None = None
    messages: list[MessageSpec] | None = None
    few_shot: FewShotSpec | None = None

    @model_validator(mode="after")
    def _one_form(self) -> "PromptSpec":
        if (self.template is None) == (self.messages is None):
            raise ValueError("give exactly one of `template` (one user message) or `messages`")
        if self.few_shot and self.few_shot.template is None and self.template is None:
            raise ValueError("few_shot needs its own `template` when the prompt uses `messages`")
        return self


class GenerationSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    max_tokens: int = Field(default=256, ge=1)
    temperature: float = Field(default=0.0, ge=0, le=2)
    stop: list[str] = []
    top_p: float | None = Field(default=None, gt=0, le=1)

    def settings(self) -> GenerationSettings:
        return GenerationSettings(
            max_tokens=self.max_tokens,
            temperature=self.temperature,
            stop=tuple(self.stop),
            top_p=self.top_p,
        )


class CandidateOverride(BaseModel):
    model_config = ConfigDict(extra="forbid")

    generation: dict[str, Any] = {}


class SuiteSpec(BaseModel):
    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[a-z0-9][a-z0-9_.-]*$")
    description: str = ""
    owner: str | None = None
    tags: list[str] = []
    dataset: DatasetSpec
    prompt: PromptSpec
    generation: GenerationSpec = GenerationSpec()
    overrides: dict[str, CandidateOverride] = {}
    grader: dict[str, Any]


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
    few_shot: list[Item] = field(default_factory=list)
    generation_by_candidate: dict[str, GenerationSpec] = field(default_factory=dict)
    skipped: list[str] = field(default_factory=list)
    warnings: list[Problem] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.spec.name

    def messages(self, item: Item) -> list[Message]:
        """The chat for one item: system prompt, few-shot turns, then the item's message(s)."""
        p = self.spec.prompt
        out: list[Message] = []
        if p.system:
            out.append(Message("system", render(p.system, item.fields)))
        if p.few_shot:
            user = p.few_shot.template or p.template
            assert user is not None
            for shot in self.few_shot:
                out.append(Message("user", render(user, shot.fields)))
                out.append(Message("assistant", render(p.few_shot.answer, shot.fields)))
        if p.template is not None:
            out.append(Message("user", render(p.template, item.fields)))
        for m in p.messages or []:
            out.append(Message(m.role, render(m.content, item.fields)))
        return out

    def request(self, item: Item, candidate: Any = None) -> Request:
        """The request for an item, with the candidate's generation overrides if it has any.

        `candidate` is a candidate name or any object with a `.name` (an `routeopt.evals.config.Candidate`).
        """
        name = getattr(candidate, "name", candidate)
        gen = self.generation_by_candidate.get(name, self.spec.generation) if name else self.spec.generation
        p = self.spec.prompt
        shared = (1 if p.system else 0) + (2 * len(self.few_shot) if p.few_shot else 0)
        return Request(tuple(self.messages(item)), gen.settings(), shared_messages=shared)

    def prompt_text(self, item: Item) -> str:
        return self.request(item).prompt_text

    def resolved(self) -> dict[str, Any]:
        """The spec after includes, as plain data (what `routeopt suites show` prints)."""
        return self.spec.model_dump(mode="json", exclude_none=True)


def read_jsonl(path: Path) -> list[dict[str, Any]]:
    """All rows of a JSONL file (kept for callers of v1; suites load through routeopt.evals.suite.datasets)."""
    rows = load_rows(DatasetSpec(path=Path(path).resolve()), Path("."))
    return [fields for _, fields in rows.items]


class _Checker:
    """Collects every problem of one suite file, each with its file, line and field."""

    def __init__(self, path: Path, prov: Provenance):
        self.path = path
        self.prov = prov
        self.problems: list[Problem] = []

    def add(
        self, loc: tuple[str | int, ...], message: str, severity: Literal["error", "warning"] = "error"
    ) -> None:
        file, line = self.prov.locate(loc, self.path)
        field = ".".join(map(str, loc)) or "(top level)"
        self.problems.append(Problem(file, line, field, message, severity))

    @property
    def errors(self) -> list[Problem]:
        return [p for p in self.problems if p.severity == "error"]


def _spec(raw: dict[str, Any], chk: _Checker) -> SuiteSpec | None:
    try:
        return SuiteSpec.model_validate(raw)
    except ValidationError as err:
        for e in err.errors():
            chk.add(tuple(e["loc"]), pydantic_message(e, SuiteSpec))
    return None


def _grader(raw: dict[str, Any], context: GraderContext, chk: _Checker) -> Grader | None:
    try:
        return build_grader(raw["grader"], context)
    except GraderSpecError as exc:
        for loc, msg in exc.problems:
            chk.add(("grader",) + loc, msg)
    return None


def _generations(spec: SuiteSpec, config: "Config | None", chk: _Checker) -> dict[str, GenerationSpec]:
    out: dict[str, GenerationSpec] = {}
    known = [c.name for c in config.candidates] if config is not None else None
    for name, override in spec.overrides.items():
        if known is not None and name not in known:
            chk.add(
                ("overrides", name),
                f"no candidate {name!r} in the config (it has {known}); the override is unused",
                "warning",
            )
        merged = {**spec.generation.model_dump(), **override.generation}
        try:
            out[name] = GenerationSpec.model_validate(merged)
        except ValidationError as err:
            for e in err.errors():
                chk.add(("overrides", name, "generation") + tuple(e["loc"]), pydantic_message(e))
    return out


def _items(
    ds: DatasetSpec, base: Path, chk: _Checker, loc: tuple[str, ...]
) -> tuple[list[Item], list[str], str]:
    try:
        rows = load_rows(ds, base)
    except DatasetError as exc:
        chk.add(loc, str(exc))
        return [], [], ""
    return [Item(i, f) for i, f in rows.items], rows.skipped, rows.digest


def _few_shot(prompt: PromptSpec, dataset: DatasetSpec, base: Path, chk: _Checker) -> list[Item]:
    fs = prompt.few_shot
    if fs is None:
        return []
    ds = fs.dataset
    if ds is None:
        if dataset.hf is None:
            chk.add(("prompt", "few_shot", "split"), "`split` needs an hf dataset; use `dataset` for a file")
            return []
        hf = dataset.hf.model_copy(update={"split": fs.split})
        ds = dataset.model_copy(update={"hf": hf})
    ds = ds.model_copy(update={"limit": fs.n, "seed": fs.seed})
    shots, _, _ = _items(ds, base, chk, ("prompt", "few_shot", "dataset"))
    return shots


Check = tuple[tuple[str | int, ...], str, dict[str, Any]]


def _template_checks(p: PromptSpec, grader: Grader | None) -> list[Check]:
    """(location, template, extra variables) of every template rendered over an item's fields."""
    out: list[Check] = []
    if p.system:
        out.append((("prompt", "system"), p.system, {}))
    if p.template is not None:
        out.append((("prompt", "template"), p.template, {}))
    out += [(("prompt", "messages", i, "content"), m.content, {}) for i, m in enumerate(p.messages or [])]
    out += _grader_templates(grader, ("grader",)) if grader else []
    return out


def _grader_templates(g: Grader, loc: tuple[str | int, ...]) -> list[Check]:
    out: list[Check] = []
    for name in ("target", "prelude", "rubric", "choices"):
        value = getattr(g, name, None)
        values = value if isinstance(value, list) else [value]
        extra = {"response": ""} if name == "rubric" else {}
        out += [(loc + (name,), v, extra) for v in values if isinstance(v, str)]
    for i, child in enumerate(getattr(g, "_children", [])):
        out += _grader_templates(child, loc + ("graders", i))
    return out


def _check_templates(
    prompt: PromptSpec, skip_bad: bool, grader: Grader | None, items: list[Item], chk: _Checker
) -> list[Item]:
    """Render every template over every item; return the items that rendered (bad ones reported)."""
    checks = _template_checks(prompt, grader)
    syntax = [(loc, template_error(t)) for loc, t, _ in checks]
    for loc, why in syntax:
        if why:
            chk.add(loc, why)
    if any(why for _, why in syntax):
        return items
    good: list[Item] = []
    bad: dict[tuple[tuple[str | int, ...], str], list[str]] = {}
    for item in items:
        for loc, template, extra in checks:
            try:
                render(template, {**item.fields, **extra} if extra else item.fields)
            except Exception as exc:  # jinja raises several types; all mean "does not fit"
                bad.setdefault((loc, str(exc)), []).append(item.id)
                break
        else:
            good.append(item)
    severity: Literal["error", "warning"] = "warning" if skip_bad else "error"
    for (loc, msg), ids in bad.items():
        more = f" and {len(ids) - 3} more" if len(ids) > 3 else ""
        dropped = "; these items are skipped" if skip_bad else ""
        chk.add(loc, f"{msg} (item {', '.join(map(repr, ids[:3]))}{more}){dropped}", severity)
    return good if skip_bad else items


def _check_few_shot(prompt: PromptSpec, shots: list[Item], chk: _Checker) -> None:
    fs = prompt.few_shot
    if fs is None:
        return
    user = fs.template or prompt.template or ""
    where = ("prompt", "few_shot")
    for loc, template in ((where + ("template",), user), (where + ("answer",), fs.answer)):
        for shot in shots:
            try:
                render(template, shot.fields)
            except Exception as exc:  # as in _check_templates
                chk.add(loc, f"few-shot example {shot.id!r}: {exc}")
                break


def _without_shots(items: list[Item], shots: list[Item]) -> tuple[list[Item], list[str]]:
    """Items minus any that is also a few-shot example (its answer would be in its own prompt)."""
    if not shots:
        return items, []
    shown = {json.dumps(s.fields, sort_keys=True, default=str) for s in shots}
    keep, leaked = [], []
    for item in items:
        if json.dumps(item.fields, sort_keys=True, default=str) in shown:
            leaked.append(item.id)
        else:
            keep.append(item)
    return keep, leaked


def _hashable(spec: SuiteSpec) -> dict[str, Any]:
    """The spec minus metadata and file locations: only what changes results is hashed."""
    data = spec.model_dump(mode="json", exclude=set(METADATA))
    few_shot = data["prompt"].get("few_shot") or {}
    for ds in (data["dataset"], few_shot.get("dataset") or {}):
        ds.pop("path", None)
        if ds.get("hf") and Path(ds["hf"]["name"]).is_absolute():  # a local dataset folder
            ds["hf"]["name"] = Path(ds["hf"]["name"]).name
    return data


def suite_version(spec: SuiteSpec, items: list[Item], shots: list[Item], grader: Grader) -> str:
    payload = json.dumps(
        [
            _hashable(spec),
            content_digest([(i.id, i.fields) for i in items]),
            content_digest([(s.id, s.fields) for s in shots]),
            grader.fingerprint(),
        ],
        sort_keys=True,
        default=str,
    )
    return hashlib.sha256(payload.encode()).hexdigest()[:12]


def _quiet(model: type[BaseModel], raw: Any) -> Any:
    """A section validated on its own (its errors are already reported), or None."""
    try:
        return model.model_validate(raw)
    except ValidationError:
        return None


def _load(path: Path, config: "Config | None") -> tuple[Suite | None, list[Problem]]:
    """Check every part that can be checked, even when another part is broken."""
    try:
        raw, prov = resolve_includes(path)
    except SuiteError as exc:
        return None, exc.problems
    chk = _Checker(path, prov)
    spec = _spec(raw, chk)
    grader = None
    if isinstance(raw.get("grader"), dict):
        grader = _grader(raw, GraderContext(config=config, base_dir=path.parent), chk)
    dataset = spec.dataset if spec else _quiet(DatasetSpec, raw.get("dataset"))
    prompt = spec.prompt if spec else _quiet(PromptSpec, raw.get("prompt"))
    generations = _generations(spec, config, chk) if spec else {}
    items: list[Item] = []
    skipped: list[str] = []
    shots: list[Item] = []
    if dataset is not None:
        items, skipped, _ = _items(dataset, path.parent, chk, ("dataset",))
        if prompt is not None:
            shots = _few_shot(prompt, dataset, path.parent, chk)
            _check_few_shot(prompt, shots, chk)
            kept = _check_templates(prompt, dataset.skip_bad_rows, grader, items, chk)
            kept_ids = {i.id for i in kept}
            skipped += [f"item {i.id!r}: a template does not render" for i in items if i.id not in kept_ids]
            items, leaked = _without_shots(kept, shots)
            skipped += [f"item {i!r}: it is a few-shot example" for i in leaked]
    if not chk.errors and spec is not None and grader is not None and not items:
        chk.add(("dataset",), "no item is left after dropping the bad ones")
    problems = sorted(chk.problems, key=lambda p: (str(p.file), p.line or 0))
    if chk.errors or spec is None or grader is None:
        return None, problems
    version = suite_version(spec, items, shots, grader)
    return Suite(spec, path, items, grader, version, shots, generations, skipped, problems), problems


def check_suite(path: str | Path, config: "Config | None" = None) -> list[Problem]:
    """Every problem of a suite file, errors and warnings; what `routeopt suites validate` shows.

    The suite loads when none has severity "error".
    """
    return _load(Path(path).resolve(), config)[1]


def load_suite(path: str | Path, config: "Config | None" = None) -> Suite:
    """Parse, validate and load one suite file; SuiteError lists every problem with its line.

    `config` gives graders that need it (the judge) the config's candidates, and lets
    per-candidate overrides be checked against the candidate names.
    """
    path = Path(path).resolve()
    suite, problems = _load(path, config)
    if suite is None:
        raise SuiteError([p for p in problems if p.severity == "error"])
    return suite


def discover_suites(folder: str | Path, names: list[str] | None = None) -> list[Path]:
    """Suite files in a folder (sorted), optionally filtered by suite file stem.

    Files whose name starts with `_` are bases for `include:` and are not suites of their own.
    """
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
