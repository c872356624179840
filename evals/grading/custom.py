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
from types import ModuleType
from typing import Any, Callable, Literal

from pydantic import Field, PrivateAttr

from routeopt.evals.grading.base import Grade, Grader, GraderContext, register_grader


def _module_name(path: Path) -> str:
    return "routeopt_custom_" + hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:12]


def _file_module(path: Path, source: str | None) -> ModuleType:
    """A module from a .py file, or from its source shipped with a pickled grader (a worker in
    another process or machine, where the file may not exist)."""
    if source is not None:
        module = ModuleType(_module_name(path))
        module.__file__ = str(path)
        exec(compile(source, str(path), "exec"), module.__dict__)
        return module
    if not path.is_file():
        raise ValueError(f"file not found: {path}")
    spec = importlib.util.spec_from_file_location(_module_name(path), path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _load_function(
    ref: str, base_dir: Path | None, source: str | None = None
) -> tuple[Callable[..., Any], str, str | None]:
    """Resolve "module:function" or "path/to/file.py:function" (relative to the suite folder).

    Returns the function, a hash of its module's source, and a file module's source text (what
    a pickled copy carries to rebuild the function elsewhere)."""
    target, sep, name = ref.rpartition(":")
    if not sep or not target or not name.isidentifier():
        raise ValueError(f"function {ref!r} must look like 'module:function' or 'file.py:function'")
    text: str | None = None
    try:
        if target.endswith(".py"):
            path = Path(target)
            path = path if path.is_absolute() or base_dir is None else base_dir / path
            module = _file_module(path, source)
            text = source if source is not None else path.read_text()
        else:
            module = importlib.import_module(target)
    except ValueError as exc:
        raise ValueError(f"function {ref!r}: {exc}") from None
    except Exception as exc:  # the user's module failing to import is the user's error to see
        raise ValueError(f"function {ref!r}: cannot import {target!r}: {type(exc).__name__}: {exc}") from None
    fn = getattr(module, name, None)
    if not callable(fn):
        raise ValueError(f"function {ref!r}: {target!r} has no callable {name!r}")
    try:
        digest = inspect.getsource(module) if source is None else source
    except (OSError, TypeError):
        digest = ref
    return fn, hashlib.sha256(digest.encode()).hexdigest()[:16], text


@register_grader("custom")
class Custom(Grader):
    """A Python function `fn(response, item, **params)` returning a Grade, a bool or a score."""

    type: Literal["custom"] = "custom"
    function: str
    params: dict[str, Any] = {}
    threshold: float = Field(default=1.0, ge=0, le=1, description="pass mark for a float score")
    _fn: Callable[..., Any] | None = PrivateAttr(default=None)
    _source_hash: str = PrivateAttr(default="")
    _source: str | None = PrivateAttr(default=None)
    _base_dir: Path | None = PrivateAttr(default=None)
    _RUNTIME_STATE = ("_fn",)

    def setup(self, context: GraderContext) -> None:
        self._base_dir = context.base_dir
        self._fn, self._source_hash, self._source = _load_function(self.function, context.base_dir)

    def fingerprint(self) -> str:
        return self._source_hash

    def _function(self) -> Callable[..., Any]:
        """The function, rebuilt after unpickling (from the shipped source for a file, by
        import for a module, which must then be the version the suite was versioned with)."""
        if self._fn is None:
            if not self._source_hash:
                raise RuntimeError("custom grader was not set up; build it with build_grader")
            fn, digest, _ = _load_function(self.function, self._base_dir, self._source)
            if digest != self._source_hash and self._source is None:
                raise RuntimeError(
                    f"custom grader {self.function!r}: this process imports a different version "
                    "of its module than the one the suite was loaded with; install the same code"
                )
            self._fn = fn
        return self._fn

    async def grade(self, response: str, item: dict[str, Any]) -> Grade:
        result = self._function()(response, item, **self.params)
        if inspect.isawaitable(result):
            result = await result
        if isinstance(result, Grade):
            return result
        if isinstance(result, bool):
            return Grade(float(result), result)
        if isinstance(result, (int, float)):
            return Grade(float(result), float(result) >= self.threshold)
        raise TypeError(f"{self.function} returned {type(result).__name__}; expected Grade, bool or float")
