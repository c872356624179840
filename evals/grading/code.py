"""The `code` grader: the response's program runs against the item's unit tests in the sandbox
(`routeopt.evals.grading.sandbox`); the score is the fraction of tests that pass, as the tests' own
process saw it (`routeopt.evals.grading.harness`), never as the program reports it.
"""

from __future__ import annotations

import asyncio
import re
import threading
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from routeopt.evals.grading.base import Grade, Grader, GraderContext, register_grader, render
from routeopt.evals.grading.sandbox import Verdict, isolation, run_tests


_CODE_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.S)


def extract_code(response: str) -> str:
    """The program in a response: its python (or unlabelled) fenced blocks, else the whole text."""
    fenced = _CODE_FENCE.findall(response)
    blocks = [body for lang, body in fenced if lang.lower() in ("", "python", "py", "python3")]
    return "\n\n".join(blocks) if blocks else response


@register_grader("code")
class CodeGrader(Grader):
    """Runs the response's program against the item's unit tests; score is the fraction passed."""

    type: Literal["code"] = "code"
    language: Literal["python"] = "python"
    tests_field: str = Field(default="tests", description="item field: a test string or a list of them")
    prelude: str | None = Field(default=None, description="template prepended to the program")
    extract: Literal["auto", "raw"] = "auto"
    timeout_s: float = Field(default=10.0, gt=0, le=600)
    memory_mb: int = Field(default=512, ge=64)
    network: Literal["isolated", "allow"] = "isolated"
    max_parallel: int = Field(default=2, ge=1, le=64)
    sandbox: Literal["bubblewrap", "none"] = Field(
        default="bubblewrap", description="`none` runs programs unisolated: only for programs you trust"
    )
    _slots: threading.BoundedSemaphore = PrivateAttr()
    _RUNTIME_STATE = ("_slots",)

    def model_post_init(self, __context: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_parallel)

    def setup(self, context: GraderContext) -> None:
        """Fail at suite load, not at the first item, where programs cannot be isolated."""
        if self.sandbox == "bubblewrap":
            why = isolation(self.network == "allow")
            if isinstance(why, str):
                raise ValueError(f"the code grader cannot isolate programs on this machine: {why}")

    def __setstate__(self, state: dict[Any, Any]) -> None:
        super().__setstate__(state)
        self._slots = threading.BoundedSemaphore(self.max_parallel)  # per copy in a worker

    def _tests(self, item: dict[str, Any]) -> list[str]:
        tests = item.get(self.tests_field)
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(tests, list) or not tests or not all(isinstance(t, str) for t in tests):
            raise ValueError(
                f"item field {self.tests_field!r} must be a test string or a non-empty list of them"
            )
        return tests

    def _run_blocking(self, code: str, tests: list[str]) -> Verdict:
        with self._slots:
            return run_tests(
                code,
                tests,
                timeout_s=self.timeout_s,
                memory_mb=self.memory_mb,
                network=self.network == "allow",
                sandbox=self.sandbox == "bubblewrap",
            )

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        tests = self._tests(item)
        code = extract_code(response) if self.extract == "auto" else response
        if self.prelude:
            code = render(self.prelude, item) + "\n" + code
        run = await asyncio.to_thread(self._run_blocking, code, tests)
        return Grade(run.score, run.passed, run.reason())
