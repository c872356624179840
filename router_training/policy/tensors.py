"""The safetensors container, read and written with numpy and the standard library.

A policy's large arrays travel as raw little-endian bytes, not JSON numbers: 8 bytes of header
length (little-endian u64), a JSON header naming each tensor's dtype, shape and byte range, and
the data. This is the format of Hugging Face's `safetensors` (files written here load there), but
a gateway must not need that package or torch, so this module implements the few rules the spec
states ("Container"): offsets cover the data exactly, in order, without gaps or overlaps; every
tensor starts aligned to its element size; the header is padded with spaces to a multiple of 8.
"""

from __future__ import annotations

import json
import math
import struct
from typing import Any, Mapping

import numpy as np

DTYPES: dict[str, str] = {
    "F64": "<f8",
    "F32": "<f4",
    "I64": "<i8",
    "U64": "<u8",
    "I32": "<i4",
    "U32": "<u4",
    "I16": "<i2",
    "U16": "<u2",
    "I8": "i1",
    "U8": "u1",
}
_NAMES = {np.dtype(v).str.lstrip("<|"): k for k, v in DTYPES.items()}
MAX_HEADER = 1 << 24


class ContainerError(ValueError):
    """Bytes that are not a well-formed container; the message names the tensor or field."""


def _dtype_name(a: np.ndarray) -> str:
    name = _NAMES.get(a.dtype.str.lstrip("<>|="))
    if name is None:
        raise ContainerError(f"dtype {a.dtype} cannot be stored; use one of {sorted(DTYPES)}")
    return name


def dumps(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    """The container's bytes: widest element types first, so every tensor is aligned."""
    arrays = {k: np.ascontiguousarray(v) for k, v in tensors.items()}
    order = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k))
    header: dict[str, Any] = {"__metadata__": dict(metadata)} if metadata else {}
    chunks, offset = [], 0
    for name in order:
        a = arrays[name]
        data = a.astype(np.dtype(DTYPES[_dtype_name(a)]), copy=False).tobytes()
        header[name] = {
            "dtype": _dtype_name(a),
            "shape": list(a.shape),
            "data_offsets": [offset, offset + len(data)],
        }
        chunks.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=True).encode("ascii")
    text += b" " * (-(8 + len(text)) % 8)
    return struct.pack("<Q", len(text)) + text + b"".join(chunks)


def loads(data: bytes, where: str) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """(tensors, metadata) of container bytes; read-only views, checked as the spec says."""
    if len(data) < 8:
        raise ContainerError(f"{where}: {len(data)} bytes is too short for a safetensors header")
    (size,) = struct.unpack("<Q", data[:8])
    if size > min(MAX_HEADER, len(data) - 8):
        raise ContainerError(
            f"{where}: header length {size} runs past the file ({len(data)} bytes; truncated?)"
        )
    try:
        header = json.loads(data[8 : 8 + size].decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ContainerError(f"{where}: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise ContainerError(f"{where}: header must be a JSON object")
    metadata = header.pop("__metadata__", {}) or {}
    if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
        raise ContainerError(f"{where}: __metadata__ must map names to strings")
    body = memoryview(data)[8 + size :]
    spans = sorted((_span(name, entry, where), name) for name, entry in header.items())
    tensors, end = {}, 0
    for (begin, stop, dtype, shape), name in spans:
        if begin != end:
            raise ContainerError(
                f"{where}: tensor {name!r} starts at byte {begin}, expected {end} (gap or overlap)"
            )
        if stop > len(body):
            raise ContainerError(f"{where}: tensor {name!r} ends at byte {stop} of {len(body)} (truncated)")
        if begin % np.dtype(dtype).itemsize:
            raise ContainerError(f"{where}: tensor {name!r} is not aligned to its element size")
        tensors[name] = np.frombuffer(body[begin:stop], dtype=dtype).reshape(shape)
        end = stop
    if end != len(body):
        raise ContainerError(
            f"{where}: {len(body) - end} bytes after the last tensor (or the file is truncated)"
        )
    return tensors, metadata


def _span(name: str, entry: object, where: str) -> tuple[int, int, str, tuple[int, ...]]:
    if not isinstance(entry, dict) or entry.get("dtype") not in DTYPES:
        raise ContainerError(f"{where}: tensor {name!r}: dtype must be one of {sorted(DTYPES)}")
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape
    ):
        raise ContainerError(f"{where}: tensor {name!r}: shape must be a list of non-negative integers")
    if not (
        isinstance(offsets, list)
        and len(offsets) == 2
        and all(isinstance(o, int) and o >= 0 for o in offsets)
    ):
        raise ContainerError(f"{where}: tensor {name!r}: data_offsets must be [begin, end]")
    dtype = DTYPES[entry["dtype"]]
    if offsets[1] - offsets[0] != math.prod(shape) * np.dtype(dtype).itemsize:
        raise ContainerError(f"{where}: tensor {name!r}: {offsets[1] - offsets[0]} bytes for shape {shape}")
    return offsets[0], offsets[1], dtype, tuple(shape)


def require(
    tensors: Mapping[str, np.ndarray], name: str, dtype: str, shape: tuple[int | None, ...], where: str
) -> np.ndarray:
    """The tensor `name` with the dtype and shape the policy's header implies (None: any size)."""
    a = tensors.get(name)
    if a is None:
        raise ContainerError(f"{where}: tensor {name!r} is missing")
    if _dtype_name(a) != dtype and not (dtype == "F64|F32" and _dtype_name(a) in ("F64", "F32")):
        raise ContainerError(f"{where}: tensor {name!r} is {_dtype_name(a)}, expected {dtype}")
    if len(a.shape) != len(shape) or any(w is not None and w != g for w, g in zip(shape, a.shape)):
        raise ContainerError(f"{where}: tensor {name!r} has shape {list(a.shape)}, expected {list(shape)}")
    return a
