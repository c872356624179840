"""Custom graders for the example suites, referenced from YAML as "example_graders.py:name"."""

from __future__ import annotations

from difflib import SequenceMatcher
from typing import Any


def char_similarity(response: str, item: dict[str, Any], field: str = "answer") -> float:
    """Similarity of the reply to the item's `field` in [0, 1] (1.0 is identical)."""
    return SequenceMatcher(None, response.strip().lower(), str(item[field]).lower()).ratio()
