"""Grading: turn a model's response to an item into a score in [0, 1] and a pass/fail.

Owns the grader registry and base model (`base`), the built-in graders (`builtin`), the `judge`
grader, `custom` graders referenced as "module:function" from YAML, the `code` grader, the
`sandbox` that runs untrusted programs and the `harness` (program and checker) that runs inside
it. Importing this package registers every built-in grader; graders of other distributions come
in through the `routeopt.graders` entry point group.
May import `routeopt.evals.providers` (the judge calls a candidate) and `routeopt.evals.config`; never the suite
format, the runner or the store, which sit above it.
"""

from routeopt.evals.grading import builtin, code, custom, judge  # noqa: F401  (each registers its graders)
from routeopt.evals.grading.base import (
    GRADERS,
    Grade,
    Grader,
    GraderContext,
    GraderSpecError,
    ModelCall,
    build_grader,
    lookup,
    pydantic_message,
    register_grader,
    render,
    template_error,
)

__all__ = [
    "GRADERS",
    "Grade",
    "Grader",
    "GraderContext",
    "GraderSpecError",
    "ModelCall",
    "build_grader",
    "lookup",
    "pydantic_message",
    "register_grader",
    "render",
    "template_error",
]
