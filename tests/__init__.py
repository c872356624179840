"""routeopt's tests; `tests/` mirrors the package tree."""

from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
