"""LLM-as-judge: a rubric sent to a judge candidate from the config, which replies with a score.

The judge is an ordinary candidate of `routeopt.yaml`, so any provider works as a judge. The
candidate comes from the config passed explicitly when the suite is loaded, never from a global.
Under the runner the judge is bound to the runner's call path (`Grader.bind`): its calls share
the judge candidate's limits and breaker, are budgeted against it, retried like any call, and
their cost is recorded on the graded item's row. Unbound (a grader called directly) it calls
the candidate's provider itself, with its own few retries. A judge reply without a parseable
score raises: that says nothing about the graded answer, so the runner records it as a grader
error, not as a fail.
"""

from __future__ import annotations

import asyncio
import json
import re
import weakref
from typing import TYPE_CHECKING, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from routeopt.evals.grading.base import Grade, Grader, GraderContext, ModelCall, register_grader, render
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request

if TYPE_CHECKING:
    from routeopt.evals.config import Candidate
    from routeopt.evals.providers.base import Provider

DEFAULT_SYSTEM = "You are a strict, fair grader. Judge only what the rubric asks; do not answer the task."
FORMAT = "\n\nEnd your reply with one line of the form `SCORE: <number from {lo:g} to {hi:g}>`."


@register_grader("judge")
class Judge(Grader):
    """Scores a response with a judge model; passes when the normalised score >= threshold."""

    type: Literal["judge"] = "judge"
    candidate: str = Field(description="name of the judge candidate in the config")
    rubric: str = Field(description="template over the item's fields and `response`")
    system: str | None = DEFAULT_SYSTEM
    min_score: float = 0.0
    max_score: float = 10.0
    threshold: float = Field(default=0.7, ge=0, le=1, description="on the 0..1 normalised score")
    score_pattern: str = r"(?i)score\s*[:=]\s*\**\s*(-?\d+(?:\.\d+)?)"
    append_format: bool = True
    max_tokens: int = Field(default=256, ge=1)
    retries: int = Field(
        default=2,
        ge=0,
        le=10,
        description="unbound only; the runner retries with the judge candidate's max_retries",
    )
    _candidate: "Candidate | None" = PrivateAttr(default=None)
    _providers: "weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Provider]" = PrivateAttr(
        default_factory=weakref.WeakKeyDictionary
    )
    _call: ModelCall | None = PrivateAttr(default=None)
    _RUNTIME_STATE = ("_providers", "_call")

    @field_validator("score_pattern")
    @classmethod
    def _one_group(cls, v: str) -> str:
        try:
            if re.compile(v).groups < 1:
                raise ValueError("score_pattern needs one capture group around the number")
        except re.error as exc:
            raise ValueError(f"score_pattern is not a valid regular expression: {exc}") from None
        return v

    @model_validator(mode="after")
    def _range(self) -> "Judge":
        if self.max_score <= self.min_score:
            raise ValueError("max_score must be greater than min_score")
        return self

    def setup(self, context: GraderContext) -> None:
        if context.config is None:
            raise ValueError(
                f"judge candidate {self.candidate!r} needs the config's candidates: load the suite "
                "with load_suite(path, config=...) (CLI: --config)"
            )
        names = [c.name for c in context.config.candidates]
        if self.candidate not in names:
            raise ValueError(f"judge candidate {self.candidate!r} is not in the config; it has {names}")
        self._candidate = context.config.candidate(self.candidate)

    def fingerprint(self) -> str:
        c = self._candidate
        if c is None:
            return ""
        return json.dumps([c.provider, c.model, c.variant, c.base_url])

    def bind(self, call: ModelCall) -> "Judge":
        bound = self.model_copy()
        bound._call, bound._providers = call, weakref.WeakKeyDictionary()
        return bound

    def _provider(self) -> "Provider":
        """One provider per event loop: clients are bound to the loop that made them."""
        from routeopt.evals.providers import make_provider

        loop = asyncio.get_running_loop()
        provider = self._providers.get(loop)
        if provider is None:
            assert self._candidate is not None
            provider = self._providers[loop] = make_provider(self._candidate)
        return provider

    async def aclose(self) -> None:
        provider = self._providers.pop(asyncio.get_running_loop(), None)
        if provider is not None:
            await provider.aclose()

    def request(self, response: str, item: dict[str, Any]) -> Request:
        prompt = render(self.rubric, {**item, "response": response})
        if self.append_format:
            prompt += FORMAT.format(lo=self.min_score, hi=self.max_score)
        messages = [Message("user", prompt)]
        if self.system:
            messages.insert(0, Message("system", self.system))
        return Request(tuple(messages), GenerationSettings(max_tokens=self.max_tokens, temperature=0.0))

    async def _ask(self, request: Request) -> str:
        if self._call is not None:  # the runner's path retries; its ProviderError is recorded
            assert self._candidate is not None
            return (await self._call(self._candidate, request)).text
        for attempt in range(self.retries + 1):
            try:
                return (await self._provider().generate(request)).text
            except ProviderError as exc:
                if not exc.retryable or attempt == self.retries:
                    raise RuntimeError(f"judge {self.candidate!r} failed: {exc}") from None
                await asyncio.sleep(max(0.5 * 2**attempt, exc.retry_after_s or 0.0))
        raise AssertionError("unreachable")

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        if self._candidate is None:
            raise RuntimeError("judge grader was not set up; build it with build_grader(spec, context)")
        reply = await self._ask(self.request(response, item))
        found = re.findall(self.score_pattern, reply)
        if not found:
            raise ValueError(f"judge reply has no score matching {self.score_pattern!r}: {reply[:200]!r}")
        raw = float(found[-1] if isinstance(found[-1], str) else found[-1][0])
        if not self.min_score <= raw <= self.max_score:
            raise ValueError(f"judge score {raw:g} is outside {self.min_score:g}..{self.max_score:g}")
        score = (raw - self.min_score) / (self.max_score - self.min_score)
        summary = " ".join(reply.split())[:200]
        return Grade(score, score >= self.threshold, f"judge {raw:g}/{self.max_score:g}: {summary}")
