from __future__ import annotations

from pathlib import Path

import pytest

from evals.atomic import atomic_write, atomic_writer


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
