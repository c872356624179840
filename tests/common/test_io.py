from __future__ import annotations

from datetime import datetime, timezone
from pathlib import Path

import numpy as np
import pytest

from routeopt.common.io import atomic_write, atomic_writer, jsonable


def test_replaces_whole_file_and_leaves_no_temporaries(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "f.json"
    atomic_write(target, b"old")
    atomic_write(target, "new text")
    assert target.read_text() == "new text"
    assert sorted(p.name for p in target.parent.iterdir()) == ["f.json"]


def test_failure_mid_write_keeps_the_old_file(tmp_path: Path) -> None:
    target = tmp_path / "f.txt"
    atomic_write(target, "complete")
    with pytest.raises(RuntimeError):
        with atomic_writer(target, "w") as fh:
            fh.write("half of a")
            raise RuntimeError("crash")
    assert target.read_text() == "complete"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.txt"]


def test_jsonable_gives_plain_json_values() -> None:
    now = datetime(2026, 1, 31, 12, 0, tzinfo=timezone.utc)
    got = jsonable(
        {
            "x": np.float32(0.5),
            "y": (np.int64(2),),
            "z": float("inf"),
            1: now,
            "a": np.arange(3),
            "b": np.bool_(True),
            "n": np.float64("nan"),
            "o": Path("p"),
        }
    )
    assert got == {
        "x": 0.5,
        "y": [2],
        "z": None,
        "1": "2026-01-31T12:00:00Z",
        "a": [0, 1, 2],
        "b": True,
        "n": None,
        "o": "p",
    }
