"""What every grader shares: the `Grade`, the `Grader` base model, the registry and the builder.

Every grader is a pydantic model (its YAML parameters, validated) with an async `grade`, found
through one registry that raises on duplicate names and, on a miss, names the graders that exist.
Graders that need more than their parameters (the judge needs the config's candidates, a custom
grader the suite's folder) get it from an explicit `GraderContext` when the suite is loaded.
Graders of other distributions register through the `routeopt.graders` entry point group.

Graders that call a model (the judge) are bound by the runner to its call path (`bind`), so
their calls share the candidates' limits, breaker, budget and retries and are recorded. Graders
pickle without their runtime state (locks, clients, loaded functions), which they rebuild on
first use, so suites travel to workers in other processes (Dask).
"""

from __future__ import annotations

import asyncio
import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, ClassVar, Protocol

from jinja2 import StrictUndefined, Template, TemplateSyntaxError
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, ValidationError

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate, Config
    from routeopt.evals.providers.base import Completion, Request

Loc = tuple[str | int, ...]


@dataclass(frozen=True)
class Grade:
    score: float
    passed: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.score <= 1.0) or math.isnan(self.score):
            raise ValueError(f"grader score must be in [0, 1], got {self.score}")


@dataclass(frozen=True)
class GraderContext:
    """What a grader may need beyond its YAML: the config (judge candidates), the suite folder."""

    config: "Config | None" = None
    base_dir: Path | None = None


class ModelCall(Protocol):
    """How a grader calls a model when the runner lends it its call path: one request to one
    candidate of the config, with that candidate's limits, breaker, spend cap and retries, the
    cost recorded on the outcome row of the item being graded. Raises `ProviderError` (the
    last error, or budget/circuit_open/auth) when it gives up."""

    async def __call__(self, candidate: "Candidate", request: "Request") -> "Completion": ...


_ENV = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)


@functools.lru_cache(maxsize=4096)
def _compiled(template: str) -> Template:
    return _ENV.from_string(template)


def render(template: str, item: dict[str, Any]) -> str:
    """Render a Jinja2 template over an item's fields; a missing field raises.

    Templates are compiled once: a suite renders the same few templates for every item.
    """
    return _compiled(template).render(**item)


def lookup(row: dict[str, Any], dotted: str) -> Any:
    """A value by dotted path (`answers.text.0`); KeyError names the missing part.

    Graders read item fields this way, and datasets map their columns the same way.
    """
    value: Any = row
    for part in dotted.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.lstrip("-").isdigit() and -len(value) <= int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(part)
    return value


def template_error(template: str) -> str | None:
    """Why a template does not parse (with its line), or None when it does."""
    try:
        _ENV.parse(template)
    except TemplateSyntaxError as exc:
        return f"template syntax error on its line {exc.lineno}: {exc.message}"
    return None


class Grader(BaseModel):
    """Base class: subclasses declare `type` and implement `grade`."""

    model_config = ConfigDict(extra="forbid", populate_by_name=True)
    type: str
    # Private attributes that are runtime state: left out when pickled, rebuilt on first use.
    _RUNTIME_STATE: ClassVar[tuple[str, ...]] = ()

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        raise NotImplementedError

    def bind(self, call: ModelCall) -> "Grader":
        """This grader with its model calls made through `call`; one that calls no model
        returns itself. The runner binds a copy per (suite, candidate) pair."""
        return self

    def __getstate__(self) -> dict[Any, Any]:
        state = super().__getstate__()
        private = state.get("__pydantic_private__")
        if private and self._RUNTIME_STATE:
            kept = {k: v for k, v in private.items() if k not in self._RUNTIME_STATE}
            state = {**state, "__pydantic_private__": kept}
        return state

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        private = self.__pydantic_private__
        if private is not None:
            for name in self._RUNTIME_STATE:
                if name not in private:
                    attr = self.__private_attributes__[name]
                    factory = attr.default_factory
                    private[name] = factory() if factory is not None else copy.deepcopy(attr.default)

    def setup(self, context: GraderContext) -> None:
        """Resolve what needs context (a candidate, a function); raise ValueError if it cannot."""

    def fingerprint(self) -> str:
        """Anything beyond the YAML that changes grades (custom code, the judge model)."""
        return ""

    async def aclose(self) -> None:
        """Release clients opened on the running event loop (the judge's provider)."""

    def expected(self, item: dict[str, Any]) -> str:
        target = getattr(self, "target", None)
        if target is None:
            raise ValueError(f"{self.type} grader needs `target`")
        return render(target, item)


GRADERS: dict[str, type[Grader]] = {}
ENTRY_POINT_GROUP = "routeopt.graders"


def register_grader(name: str) -> Callable[[type[Grader]], type[Grader]]:
    def deco(cls: type[Grader]) -> type[Grader]:
        if name in GRADERS:
            raise ValueError(f"grader {name!r} is registered twice")
        GRADERS[name] = cls
        return cls

    return deco


def _grader_class(name: str) -> type[Grader] | None:
    """A registered grader, or one another distribution declares under `routeopt.graders`
    (e.g. `my_grader = "my_pkg.graders:MyGrader"`), loaded on first use."""
    if name not in GRADERS:
        from importlib.metadata import entry_points

        for ep in entry_points(group=ENTRY_POINT_GROUP, name=name):
            cls = ep.load()
            if not (isinstance(cls, type) and issubclass(cls, Grader)):
                raise TypeError(f"entry point {ep.value!r} ({ENTRY_POINT_GROUP}) is not a Grader subclass")
            register_grader(name)(cls)
    return GRADERS.get(name)


def pydantic_message(error: Any, model: type[BaseModel] | None = None) -> str:
    """A pydantic error's message without its "Value error, " prefix; for an unknown field of
    `model`, with the field it was probably meant to be (`routeopt.common.fields.did_you_mean`)."""
    from routeopt.common.fields import did_you_mean

    msg = str(error["msg"]).removeprefix("Value error, ")
    if model is not None and error.get("type") == "extra_forbidden":
        msg += did_you_mean(model, error["loc"])
    return msg


class GraderSpecError(ValueError):
    """A grader spec with problems; `problems` holds (location inside the spec, message)."""

    def __init__(self, problems: list[tuple[Loc, str]]):
        self.problems = problems
        super().__init__("; ".join(f"{'.'.join(map(str, loc)) or 'grader'}: {m}" for loc, m in problems))


def _build(spec: Any, context: GraderContext, loc: Loc, problems: list[tuple[Loc, str]]) -> Grader | None:
    if not isinstance(spec, dict) or "type" not in spec:
        problems.append((loc, "grader needs a `type`"))
        return None
    cls = _grader_class(spec["type"])
    if cls is None:
        problems.append(
            (loc + ("type",), f"unknown grader {spec['type']!r}; known graders: {sorted(GRADERS)}")
        )
        return None
    try:
        grader = cls.model_validate(spec)
    except ValidationError as err:
        problems.extend((loc + tuple(e["loc"]), pydantic_message(e, cls)) for e in err.errors())
        return None
    if isinstance(grader, Combinator):
        children = [_build(c, context, loc + ("graders", i), problems) for i, c in enumerate(grader.graders)]
        grader._children = [c for c in children if c is not None]
    try:
        grader.setup(context)
    except ValueError as exc:
        problems.append((loc, str(exc)))
    return grader


def build_grader(spec: dict[str, Any], context: GraderContext | None = None) -> Grader:
    """Validate a grader spec from YAML into a grader; GraderSpecError lists every problem."""
    problems: list[tuple[Loc, str]] = []
    grader = _build(spec, context or GraderContext(), (), problems)
    if problems or grader is None:
        raise GraderSpecError(problems)
    return grader


class Combinator(Grader):
    """Base for graders made of other graders (`graders:` is a list of grader specs)."""

    graders: list[dict[str, Any]] = Field(min_length=1)
    _children: list[Grader] = PrivateAttr(default_factory=list)

    def fingerprint(self) -> str:
        return "|".join(c.fingerprint() for c in self._children)

    def bind(self, call: ModelCall) -> "Grader":
        children = [c.bind(call) for c in self._children]
        if all(new is old for new, old in zip(children, self._children)):
            return self
        bound = self.model_copy()
        bound._children = children
        return bound

    async def aclose(self) -> None:
        for child in self._children:
            await child.aclose()

    async def _grades(self, response: str, item: dict[str, Any]) -> list[Grade]:
        return list(await asyncio.gather(*(c.grade(response, item) for c in self._children)))

    def _reason(self, grades: list[Grade]) -> str | None:
        parts = [f"{c.type}: {g.reason}" for c, g in zip(self._children, grades) if g.reason and not g.passed]
        return "; ".join(parts) or None
