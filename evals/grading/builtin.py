"""The built-in graders: exact match, regex, numeric, multiple choice, substrings, JSON, and the
combinators `all`, `any` and `weighted`. Each registers itself in `routeopt.evals.grading.base`'s registry.
"""

from __future__ import annotations

import json
import math
import re
import unicodedata
from typing import Any, Literal

import jsonschema
from pydantic import Field, PrivateAttr, field_validator

from routeopt.evals.grading.base import (
    Combinator,
    Grade,
    Grader,
    GraderContext,
    lookup,
    register_grader,
    render,
)


Normalization = Literal["strip", "lower", "collapse_whitespace", "strip_punctuation", "nfkc"]
_PUNCT = re.compile(r"[^\w\s]", re.UNICODE)


_ORDER: tuple[Normalization, ...] = ("nfkc", "lower", "strip_punctuation", "collapse_whitespace", "strip")


def normalize(text: str, steps: list[Normalization]) -> str:
    """Apply the chosen steps in one fixed order (listing order does not matter), so that
    normalising twice changes nothing: ["strip", "strip_punctuation"] on "! a" gives "a"."""
    chosen = set(steps)
    for step in _ORDER:
        if step not in chosen:
            continue
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

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, v: str) -> str:
        try:
            re.compile(v)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from None
        return v

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


def extract_choice(response: str, letters: str) -> str | None:
    """The choice letter a response commits to, or None when there is none or it is ambiguous.

    Tries, in order: "answer is (B)" / "Answer: B" (last one wins, models restate), a reply that
    is only a letter, a letter marked as an option ("(B)", "B)" or "B." at a line start), and a
    single distinct standalone capital letter.
    """
    cls = f"[{re.escape(letters)}]"
    any_case = f"[{re.escape(letters)}{re.escape(letters.lower())}]"
    # "Answer: b" and "answer is (b)" may be lower case; "answer is a ..." is English, not option A
    stated = re.findall(
        rf"(?i:answer)\s*(?:(?i:is)\s*)?"
        rf"(?::\s*\(?({any_case})\)?|[:\-]?\s*\(({any_case})\)|[:\-]?\s*({cls}))(?!\w)",
        response,
    )
    if stated:
        return next(g for g in stated[-1] if g).upper()
    bare = re.fullmatch(rf"\s*\(?({cls})\)?[.:]?\s*", response)
    if bare:
        return bare.group(1)
    marked = re.findall(rf"(?m)(?:^\s*|\()({cls})\)|^\s*({cls})[.:]\s", response)
    if marked:
        return next(a or b for a, b in marked)
    alone = set(re.findall(rf"\b({cls})\b", response))
    return alone.pop() if len(alone) == 1 else None


@register_grader("multiple_choice")
class MultipleChoice(Grader):
    """Extract the chosen letter and compare it with the target letter (or 0-based index)."""

    type: Literal["multiple_choice"] = "multiple_choice"
    target: str = Field(description="template of the right letter, or its 0-based index")
    letters: str = Field(default="ABCD", pattern=r"^[A-Z]{2,26}$")
    target_is_index: bool = False
    choices: list[str] | None = Field(
        default=None,
        description="templates of the option texts, in letter order: a reply that "
        "is exactly one option's text (not its letter) counts as that letter",
    )

    def setup(self, context: GraderContext) -> None:
        if self.choices is not None and len(self.choices) != len(self.letters):
            raise ValueError(f"choices has {len(self.choices)} entries for {len(self.letters)} letters")

    def _by_text(self, response: str, item: dict[str, Any]) -> str | None:
        if not self.choices:
            return None
        said = normalize(response, list(_ORDER))
        for letter, template in zip(self.letters, self.choices):
            if said == normalize(render(template, item), list(_ORDER)):
                return letter
        return None

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        want = self.expected(item).strip()
        if self.target_is_index:
            if not want.isdigit() or int(want) >= len(self.letters):
                raise ValueError(f"target index {want!r} is not in 0..{len(self.letters) - 1}")
            want = self.letters[int(want)]
        want = want.upper()
        if want not in self.letters:
            raise ValueError(f"target {want!r} is not one of the letters {self.letters}")
        got = extract_choice(response, self.letters) or self._by_text(response, item)
        if got is None:
            return Grade(0.0, False, f"no unambiguous choice among {self.letters} in response")
        if got == want:
            return Grade(1.0, True)
        return Grade(0.0, False, f"chose {got}, expected {want}")


class _Substrings(Grader):
    target: str | list[str] = Field(description="template(s) of the text to look for")
    case_sensitive: bool = False

    def _found(self, response: str, item: dict[str, Any]) -> list[tuple[str, bool]]:
        targets = [self.target] if isinstance(self.target, str) else self.target
        hay = response if self.case_sensitive else response.lower()
        out = []
        for t in targets:
            needle = render(t, item)
            out.append((needle, (needle if self.case_sensitive else needle.lower()) in hay))
        return out


@register_grader("contains")
class Contains(_Substrings):
    """The response contains all (or any) of the given strings; score is the fraction found."""

    type: Literal["contains"] = "contains"
    mode: Literal["all", "any"] = "all"

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        found = self._found(response, item)
        hits = sum(ok for _, ok in found)
        passed = hits == len(found) if self.mode == "all" else hits > 0
        missing = [n for n, ok in found if not ok]
        return Grade(hits / len(found), passed, None if passed else f"missing {missing}")


@register_grader("not_contains")
class NotContains(_Substrings):
    """The response contains none of the given strings; score is the fraction absent."""

    type: Literal["not_contains"] = "not_contains"

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        found = self._found(response, item)
        present = [n for n, ok in found if ok]
        score = 1 - len(present) / len(found)
        return Grade(score, not present, f"contains {present}" if present else None)


_FENCE = re.compile(r"```[ \t]*(?:json)?[ \t]*\n(.*?)```", re.S | re.I)


def extract_json(text: str) -> tuple[bool, Any]:
    """(found, value): the whole text as JSON, else a fenced block, else the first object/array."""
    try:
        return True, json.loads(text)
    except json.JSONDecodeError:
        pass
    for block in _FENCE.findall(text):
        try:
            return True, json.loads(block)
        except json.JSONDecodeError:
            continue
    decoder = json.JSONDecoder()
    starts = [i for i, ch in enumerate(text) if ch in "{["][:200]
    for i in starts:
        try:
            return True, decoder.raw_decode(text, i)[0]
        except json.JSONDecodeError:
            continue
    return False, None


def _same(got: Any, want: Any) -> bool:
    """JSON equality: 2 == 2.0, but true is not 1 and "2" is not 2."""
    if isinstance(got, bool) or isinstance(want, bool):
        return isinstance(got, bool) and isinstance(want, bool) and got == want
    if isinstance(got, (int, float)) and isinstance(want, (int, float)):
        return got == want
    return type(got) is type(want) and got == want


def _json_equal(got: Any, want: Any) -> bool:
    """`want` from YAML; a string (a rendered template) matches as JSON or as the same text."""
    if isinstance(want, str):
        try:
            if _same(got, json.loads(want)):
                return True
        except json.JSONDecodeError:
            pass
        return isinstance(got, str) and got.strip() == want.strip()
    return _same(got, want)


@register_grader("json")
class JsonGrader(Grader):
    """The response holds JSON that parses, validates against a schema and has expected fields.

    Score is the fraction of checks passed (parses, schema, each expected field); pass is all.
    """

    type: Literal["json"] = "json"
    json_schema: dict[str, Any] | None = Field(default=None, alias="schema")
    fields: dict[str, Any] = Field(
        default={}, description="dotted path in the JSON -> template or literal expected value"
    )

    _validator: Any = PrivateAttr(default=None)
    _RUNTIME_STATE = ("_validator",)  # rebuilt from the schema on first use

    def setup(self, context: GraderContext) -> None:
        if self.json_schema is not None:
            cls = jsonschema.validators.validator_for(self.json_schema)
            try:
                cls.check_schema(self.json_schema)
            except jsonschema.SchemaError as exc:
                raise ValueError(f"schema is not a valid JSON Schema: {exc.message}") from None
            self._validator = cls(self.json_schema)

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        found, value = extract_json(response)
        checks = 1 + (self.json_schema is not None) + len(self.fields)
        if not found:
            return Grade(0.0, False, "no JSON found in response")
        ok, failures = 1, []
        if self.json_schema is not None:
            if self._validator is None:
                self.setup(GraderContext())
            errors = sorted(self._validator.iter_errors(value), key=lambda e: list(map(str, e.path)))
            if errors:
                where = "/".join(map(str, errors[0].path)) or "(root)"
                failures.append(f"schema: {where}: {errors[0].message}"[:300])
            else:
                ok += 1
        for path, want in self.fields.items():
            want = render(want, item) if isinstance(want, str) else want
            try:
                got = lookup(value, path) if isinstance(value, dict) else lookup({"": value}, path)
            except KeyError:
                failures.append(f"{path}: missing")
                continue
            if _json_equal(got, want):
                ok += 1
            else:
                failures.append(f"{path}: got {got!r:.80}, expected {want!r:.80}")
        return Grade(ok / checks, not failures, "; ".join(failures) or None)


@register_grader("all")
class AllOf(Combinator):
    """Passes when every sub-grader passes; score is their mean."""

    type: Literal["all"] = "all"

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        grades = await self._grades(response, item)
        score = sum(g.score for g in grades) / len(grades)
        return Grade(score, all(g.passed for g in grades), self._reason(grades))


@register_grader("any")
class AnyOf(Combinator):
    """Passes when at least one sub-grader passes; score is the best."""

    type: Literal["any"] = "any"

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        grades = await self._grades(response, item)
        passed = any(g.passed for g in grades)
        return Grade(max(g.score for g in grades), passed, None if passed else self._reason(grades))


@register_grader("weighted")
class Weighted(Combinator):
    """Weighted mean of sub-grader scores; passes at `threshold` or above."""

    type: Literal["weighted"] = "weighted"
    weights: list[float] | None = None
    threshold: float = Field(default=0.5, ge=0, le=1)

    def setup(self, context: GraderContext) -> None:
        if self.weights is not None:
            if len(self.weights) != len(self.graders):
                raise ValueError(f"weights has {len(self.weights)} entries for {len(self.graders)} graders")
            if any(w < 0 for w in self.weights) or sum(self.weights) <= 0:
                raise ValueError("weights must be >= 0 with a positive sum")

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        grades = await self._grades(response, item)
        weights = self.weights or [1.0] * len(grades)
        score = sum(w * g.score for w, g in zip(weights, grades)) / sum(weights)
        score = min(1.0, max(0.0, score))
        passed = score >= self.threshold
        why = None if passed else self._reason(grades) or f"score {score:.2f} < {self.threshold}"
        return Grade(score, passed, why)
