"""The field a misspelt key of a validated file was probably meant to be ("did you mean").

routeopt.yaml, suites and graders are pydantic models that forbid unknown keys; pydantic says
`Extra inputs are not permitted` and stops there. `did_you_mean` walks the model's annotations to
the place of the unknown key and offers the closest field name there (`gradr` -> `grader`).
Standard library only: a model is anything with `model_fields` (pydantic's), so every layer,
the gateway's included, can use it.
"""

from __future__ import annotations

import difflib
import types
import typing
from typing import Any, Sequence


def _is_model(tp: Any) -> bool:
    return isinstance(tp, type) and isinstance(getattr(tp, "model_fields", None), dict)


def _descend(tp: Any, part: str | int) -> Any:
    """The type found at `part` inside `tp` (a model's field, a list's item, a dict's value)."""
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType, typing.Annotated):
        found = (_descend(a, part) for a in (args[:1] if origin is typing.Annotated else args))
        return next((f for f in found if f is not None), None)
    if origin in (list, tuple, set, frozenset):
        return args[0] if isinstance(part, int) and args else None
    if origin is dict:
        return args[1] if len(args) == 2 else None
    if _is_model(tp) and isinstance(part, str):
        field = tp.model_fields.get(part)
        return field.annotation if field is not None else None
    return None


def _field_names(tp: Any) -> list[str]:
    if _is_model(tp):
        return list(tp.model_fields)
    return [n for a in typing.get_args(tp) for n in _field_names(a)]


def did_you_mean(model: Any, loc: Sequence[str | int]) -> str:
    """'; did you mean 'grader'?' for an unknown key at `loc` (a pydantic error location) of
    `model`, when a field of the same place is spelt alike; '' when none is."""
    tp: Any = model
    for part in loc[:-1]:
        tp = _descend(tp, part)
        if tp is None:
            return ""
    if not loc or not isinstance(loc[-1], str):
        return ""
    close = difflib.get_close_matches(loc[-1], _field_names(tp), n=1, cutoff=0.6)
    return f"; did you mean {close[0]!r}?" if close else ""
