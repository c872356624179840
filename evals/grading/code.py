"""The `code` grader: the response's program runs against the item's unit tests in the sandbox
(`evals.grading.sandbox`); the score is the fraction of tests that pass.
"""

from __future__ import annotations

import asyncio
import re
import signal
import threading
from typing import Any, Literal

from pydantic import Field, PrivateAttr

from evals.grading.base import Grade, Grader, register_grader, render
from evals.grading.sandbox import RunResult, run_python_tests


_CODE_FENCE = re.compile(r"```[ \t]*([\w+-]*)[ \t]*\n(.*?)```", re.S)


def extract_code(response: str) -> str:
    """The program in a response: its python (or unlabelled) fenced blocks, else the whole text."""
    fenced = _CODE_FENCE.findall(response)
    blocks = [body for lang, body in fenced if lang.lower() in ("", "python", "py", "python3")]
    return "\n\n".join(blocks) if blocks else response


def _short(test: str) -> str:
    line = " ".join(test.split())
    return line if len(line) <= 60 else line[:57] + "..."


def _explain(result: RunResult, report: dict[str, Any] | None, timeout_s: float) -> str:
    if result.timed_out:
        return f"timed out after {timeout_s:g}s; the process group was killed"
    rc = result.returncode
    if rc is not None and rc < 0:
        sig = signal.Signals(-rc).name if -rc in signal.valid_signals() else str(-rc)
        hint = {signal.SIGXCPU: " (CPU limit)", signal.SIGXFSZ: " (file size limit)"}.get(-rc, "")
        return f"killed by {sig}{hint}"
    tail = result.stderr.strip().splitlines()[-1:] or ["no output"]
    return f"no test report (exit code {rc}): {tail[0][:300]}"


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
    _slots: threading.BoundedSemaphore = PrivateAttr()
    _RUNTIME_STATE = ("_slots",)

    def model_post_init(self, __context: Any) -> None:
        self._slots = threading.BoundedSemaphore(self.max_parallel)

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

    def _run_blocking(self, code: str, tests: list[str]) -> tuple[RunResult, dict[str, Any] | None]:
        with self._slots:
            return run_python_tests(
                code, tests, timeout_s=self.timeout_s, memory_mb=self.memory_mb,
                network=self.network == "allow",
            )

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        tests = self._tests(item)
        code = extract_code(response) if self.extract == "auto" else response
        if self.prelude:
            code = render(self.prelude, item) + "\n" + code
        result, report = await asyncio.to_thread(self._run_blocking, code, tests)
        if report is None:
            return Grade(0.0, False, _explain(result, report, self.timeout_s))
        if report["solution_error"]:
            return Grade(0.0, False, f"program raised {report['solution_error']}")
        results = report["results"]
        passed = sum(ok for ok, _ in results)
        failed = [f"test {i} `{_short(tests[i])}`: {msg}" for i, (ok, msg) in enumerate(results) if not ok]
        reason = f"{len(failed)}/{len(results)} tests failed: " + "; ".join(failed)[:500] if failed else None
        return Grade(passed / len(results), not failed, reason)
