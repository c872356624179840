"""The `custom` grader: a Python function named in YAML as "module:function" or "file.py:function".

Custom code is named explicitly, never found by import magic. A file path is relative to the
suite file, and the source of the function's module is part of the suite version, so editing
the grader re-versions the suite.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import inspect
from pathlib import Path
from typing import Any, Callable, Literal

from pydantic import Field, PrivateAttr

from evals.grading.base import Grade, Grader, GraderContext, register_grader


def _load_function(ref: str, base_dir: Path | None) -> tuple[Callable[..., Any], str]:
    """Resolve "module:function" or "path/to/file.py:function" (relative to the suite folder)."""
    target, sep, name = ref.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"function {ref!r} must look like 'module:function' or 'file.py:function'")
    try:
        if target.endswith(".py"):
            path = Path(target)
            path = path if path.is_absolute() or base_dir is None else base_dir / path
            if not path.is_file():
                raise ValueError(f"function {ref!r}: file not found: {path}")
            mod_name = "routeopt_custom_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]
            spec = importlib.util.spec_from_file_location(mod_name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(target)
    except ValueError:
        raise
    except Exception as exc:  # the user's module failing to import is the user's error to see
        raise ValueError(f"function {ref!r}: cannot import {target!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"function {ref!r}: {target!r} has no callable {name!r}")
    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ref
    return fn, hashlib.sha256(source.encode()).hexdigest()[:16]


@register_grader("custom")
class Custom(Grader):
    """A Python function `fn(response, item, **params)` returning a Grade, a bool or a score."""

    type: Literal["custom"] = "custom"
    function: str
    params: dict[str, Any] = {}
    threshold: float = Field(default=1.0, ge=0, le=1, description="pass mark for a float score")
    _fn: Callable[..., Any] | None = PrivateAttr(default=None)
    _source_hash: str = PrivateAttr(default="")

    def setup(self, context: GraderContext) -> None:
        self._fn, self._source_hash = _load_function(self.function, context.base_dir)

    def fingerprint(self) -> str:
        return self._source_hash

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        if self._fn is None:
            raise RuntimeError("custom grader was not set up; build it with build_grader")
        result = self._fn(response, item, **self.params)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Grade):
            return result
        if isinstance(result, bool):
            return Grade(float(result), result)
        if isinstance(result, (int, float)):
            return Grade(float(result), float(result) >= self.threshold)
        raise TypeError(f"{self.function} returned {type(result).__name__}; expected Grade, bool or float")
