"""The safetensors container: round trips, and a clear error for every malformed file."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest

from routeopt.router_training.policy.tensors import ContainerError, dumps, loads, require

TENSORS = {
    "a.f64": np.arange(5, dtype=np.float64),
    "b.f32": np.ones((2, 3), np.float32),
    "c.u8": np.arange(3, dtype=np.uint8),
    "d.i32": np.array([-1, 2], np.int32),
    "e.empty": np.zeros(0),
}


def test_round_trip_is_exact_and_aligned() -> None:
    data = dumps(TENSORS, {"format": "x"})
    (size,) = struct.unpack("<Q", data[:8])
    assert (8 + size) % 8 == 0
    got, meta = loads(data, "t")
    assert meta == {"format": "x"} and set(got) == set(TENSORS)
    for k, v in TENSORS.items():
        assert got[k].dtype == v.dtype and np.array_equal(got[k], v)
    header = json.loads(data[8 : 8 + size])
    for k, v in header.items():
        if k != "__metadata__":
            assert v["data_offsets"][0] % np.dtype(TENSORS[k].dtype).itemsize == 0


def _with_header(header: dict, body: bytes) -> bytes:
    text = json.dumps(header).encode()
    return struct.pack("<Q", len(text)) + text + body


@pytest.mark.parametrize(
    "blob, match",
    [
        (b"\x01\x02", "too short"),
        (struct.pack("<Q", 10**9) + b"{}", "runs past the file"),
        (struct.pack("<Q", 3) + b"{x}", "not JSON"),
        (_with_header({"a": {"dtype": "F99", "shape": [1], "data_offsets": [0, 8]}}, b"\0" * 8), "dtype"),
        (
            _with_header({"a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 8]}}, b"\0" * 8),
            "8 bytes for shape",
        ),
        (
            _with_header({"a": {"dtype": "F64", "shape": [1], "data_offsets": [8, 16]}}, b"\0" * 16),
            "expected 0",
        ),
        (
            _with_header({"a": {"dtype": "F64", "shape": [2], "data_offsets": [0, 16]}}, b"\0" * 8),
            "truncated",
        ),
        (
            _with_header({"a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]}}, b"\0" * 9),
            "after the last",
        ),
        (
            _with_header(
                {
                    "a": {"dtype": "U8", "shape": [1], "data_offsets": [0, 1]},
                    "b": {"dtype": "F64", "shape": [1], "data_offsets": [1, 9]},
                },
                b"\0" * 9,
            ),
            "aligned",
        ),
        (_with_header({"a": {"dtype": "U8", "shape": [-1], "data_offsets": [0, 1]}}, b"\0"), "shape"),
    ],
)
def test_malformed_containers_are_named_errors(blob: bytes, match: str) -> None:
    with pytest.raises(ContainerError, match=match):
        loads(blob, "arrays.safetensors")


def test_require_checks_dtype_and_shape() -> None:
    got, _ = loads(dumps(TENSORS), "t")
    assert require(got, "b.f32", "F64|F32", (2, None), "t").shape == (2, 3)
    with pytest.raises(ContainerError, match="is F64, expected U8"):
        require(got, "a.f64", "U8", (5,), "t")
    with pytest.raises(ContainerError, match="shape"):
        require(got, "a.f64", "F64", (4,), "t")
    with pytest.raises(ContainerError, match="missing"):
        require(got, "zzz", "F64", (4,), "t")
