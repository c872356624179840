"""Where the router benchmarks find the shared outcome sets: ../shared/data beside the checkout
(a worktree under /work/wt/NAME finds the one beside its parent folder)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def data_dir() -> Path:
    for cand in (ROOT.parent / "shared" / "data", ROOT.parent.parent / "shared" / "data"):
        if cand.is_dir():
            return cand
    return ROOT.parent / "shared" / "data"
