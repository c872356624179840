"""Graders: turn a model's response to an item into a score in [0, 1] and a pass/fail.

Every grader is a pydantic model (its YAML parameters, validated) with an async `grade`, found
through one registry that raises on duplicate names and, on a miss, names the graders that exist.
"""

from __future__ import annotations

import math
import re
import unicodedata
from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Literal

from jinja2 import StrictUndefined
from jinja2.sandbox import SandboxedEnvironment
from pydantic import BaseModel, ConfigDict, Field


@dataclass(frozen=True)
class Grade:
    score: float
    passed: bool
    reason: str | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.score <= 1.0) or math.isnan(self.score):
            raise ValueError(f"grader score must be in [0, 1], got {self.score}")


_ENV = SandboxedEnvironment(undefined=StrictUndefined, keep_trailing_newline=True)


def render(template: str, item: dict[str, Any]) -> str:
    """Render a Jinja2 template over an item's fields; a missing field raises."""
    return _ENV.from_string(template).render(**item)


class Grader(BaseModel):
    """Base class: subclasses declare `type` and implement `grade`."""

    model_config = ConfigDict(extra="forbid")
    type: str

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        raise NotImplementedError

    def expected(self, item: dict[str, Any]) -> str:
        target = getattr(self, "target", None)
        if target is None:
            raise ValueError(f"{self.type} grader needs `target`")
        return render(target, item)


GRADERS: dict[str, type[Grader]] = {}


def register_grader(name: str) -> Callable[[type[Grader]], type[Grader]]:
    def deco(cls: type[Grader]) -> type[Grader]:
        if name in GRADERS:
            raise ValueError(f"grader {name!r} is registered twice")
        GRADERS[name] = cls
        return cls

    return deco


def build_grader(spec: dict[str, Any]) -> Grader:
    """Validate a grader spec from YAML into a grader instance."""
    if not isinstance(spec, dict) or "type" not in spec:
        raise ValueError("grader needs a `type`")
    kind = spec["type"]
    try:
        cls = GRADERS[kind]
    except KeyError:
        raise ValueError(f"unknown grader {kind!r}; known graders: {sorted(GRADERS)}") from None
    return cls.model_validate(spec)


Normalization = Literal["strip", "lower", "collapse_whitespace", "strip_punctuation", "nfkc"]
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


def normalize(text: str, steps: list[Normalization]) -> str:
    for step in steps:
        if step == "strip":
            text = text.strip()
        elif step == "lower":
            text = text.lower()
        elif step == "collapse_whitespace":
            text = " ".join(text.split())
        elif step == "strip_punctuation":
            text = _PUNCT.sub("", text)
        elif step == "nfkc":
            text = unicodedata.normalize("NFKC", text)
    return text


@register_grader("exact_match")
class ExactMatch(Grader):
    type: Literal["exact_match"] = "exact_match"
    target: str = Field(description="Jinja2 template of the expected answer, e.g. '{{ answer }}'")
    normalize: list[Normalization] = ["strip"]

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        got = normalize(response, self.normalize)
        want = normalize(self.expected(item), self.normalize)
        if got == want:
            return Grade(1.0, True)
        return Grade(0.0, False, f"expected {want!r}, got {got[:200]!r}")


@register_grader("regex")
class RegexExtract(Grader):
    """Extract a capture group from the response, then compare it exactly with the target."""

    type: Literal["regex"] = "regex"
    pattern: str
    group: int | str = 1
    target: str
    normalize: list[Normalization] = ["strip"]
    last: bool = False

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        matches = list(re.finditer(self.pattern, response, flags=re.MULTILINE))
        if not matches:
            return Grade(0.0, False, f"pattern {self.pattern!r} not found in response")
        m = matches[-1] if self.last else matches[0]
        got = normalize(m.group(self.group) or "", self.normalize)
        want = normalize(self.expected(item), self.normalize)
        if got == want:
            return Grade(1.0, True)
        return Grade(0.0, False, f"extracted {got!r}, expected {want!r}")


_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


def parse_number(text: str, last: bool = True) -> float | None:
    found = _NUMBER.findall(text)
    if not found:
        return None
    raw = (found[-1] if last else found[0]).replace(",", "")
    try:
        return float(raw)
    except ValueError:
        return None


@register_grader("numeric")
class Numeric(Grader):
    """The (last) number in the response equals the target within absolute or relative tolerance."""

    type: Literal["numeric"] = "numeric"
    target: str
    abs_tol: float = Field(default=0.0, ge=0)
    rel_tol: float = Field(default=0.0, ge=0)
    last: bool = True

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        want_text = self.expected(item)
        want = parse_number(want_text)
        if want is None:
            raise ValueError(f"target {want_text!r} is not a number")
        got = parse_number(response, last=self.last)
        if got is None:
            return Grade(0.0, False, "no number in response")
        if math.isclose(got, want, rel_tol=self.rel_tol, abs_tol=self.abs_tol):
            return Grade(1.0, True)
        return Grade(0.0, False, f"got {got:g}, expected {want:g}")
