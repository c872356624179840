"""The hot loops of the features and the linear scorer in WebAssembly, run by wasmtime.

The JavaScript runtime assembles these loops (gateways/js/scripts/kernel.mjs) and runs them in
V8; kernel.wasm here is the same module, byte for byte (a test holds it to what the JavaScript
build writes; `node gateways/js/scripts/python-kernel.mjs` refreshes it). The module does the
spec's word hashing, bucketing, tf-idf row (sections 4.1-4.6) and, for a linear scorer, the rest
of the request's scoring: row sums, nearest topic, logits, calibrated probabilities and costs
(5.1-5.4, 6; `ScoreTable` lays the policy's numbers out for it). In numpy these cost a few dozen
array calls per request on arrays of a few hundred elements; in Python's floats, a loop per
number. A decision makes two calls into the module (`fill_row`, `scores`); a tree scorer's
decision calls `sigmoids` for its probabilities.

wasmtime is an optional extra (`routeopt[fast]`, `routeopt-gateway[fast]`), pinned to the
major version whose private C entry points `_Call` uses. Without it the numpy steps run; where it
will not import, is another major version, or the module will not instantiate, `Kernel.create`
warns once and returns None; a call that fails later hands the policy to the numpy steps for
good (`RoutingPolicy._score`), with one warning.
Both give the same bits: the tests run every conformance vector through each. Calls go through
wasmtime's unchecked C entry point with their arguments laid out once, since its checked Python
call costs ~100x the kernel's own work on a short prompt.

One instance per policy: its memory holds the policy's weights and one request's buffers, which
numpy views read and write in place. A decision holds the kernel's lock; a thread that finds it
held takes the numpy path instead of waiting.
"""

from __future__ import annotations

import ctypes
import logging
import math
import os
import threading
from dataclasses import dataclass
from importlib import resources
from importlib.metadata import version
from typing import Any

import numpy as np

from routeopt.router_training.policy.features import (
    _ALNUM,
    _CLASS,
    MAX_BYTES,
    STAT_NAMES,
    FeatureSpec,
    _normalised,
    cut,
    request_stats,
)
from routeopt.router_training.policy.numerics import TF_TABLE, ln1p_int
from routeopt.router_training.policy.scorer import CostModel, LinearScorer

log = logging.getLogger(__name__)

ENGINES = ("webassembly", "numpy")
WASMTIME_MAJOR = 51  # the `fast` extra's pin: `_Call` uses this major's private C entry points
_OUT, _NIBBLES, _TABLES_END = 0, 16, 128  # the counts' and class tables' addresses (kernel.mjs TABLES)
_TF = 4096  # counts below this take their ln1p from the kernel's table
_PAGE = 65536


def default_engine() -> str:
    """$ROUTEOPT_ENGINE (webassembly or numpy), else webassembly: it falls back where it cannot run."""
    engine = os.environ.get("ROUTEOPT_ENGINE", "webassembly").strip().lower() or "webassembly"
    if engine not in ENGINES:
        raise ValueError(f"ROUTEOPT_ENGINE is {engine!r}; use one of {', '.join(ENGINES)}")
    return engine


def class_nibbles() -> bytes:
    """The byte classes as `words` tests 16 bytes at once: per class (digit, upper, punct, code,
    alphanumeric) a table by a byte's low nibble of the high nibbles it has in the class, then
    the bit of each high nibble (bytes >= 0x80 are alphanumeric only; the loop tests their sign)."""
    out = bytearray(96)
    for i, c in enumerate((1, 2, 4, 8, _ALNUM)):
        for b in range(128):
            if _CLASS[b] & c:
                out[16 * i + (b & 15)] |= 1 << (b >> 4)
    for h in range(8):
        out[80 + h] = 1 << h
    if any(int(c) != _ALNUM for c in _CLASS[128:]):
        raise ValueError("byte classes: the kernel assumes bytes >= 0x80 are alphanumeric only")
    return bytes(out)


@dataclass(frozen=True)
class ScoreTable:
    """A linear scorer's, its calibration's and its cost model's numbers, laid out as the
    module's `scores` reads them (kernel.mjs): `data` (float64) and where each part starts in
    it, in doubles."""

    data: np.ndarray
    at: dict[str, int]
    k: int
    n_topics: int
    rank: int

    @classmethod
    def of(cls, scorer: LinearScorer, platt: np.ndarray, cost: CostModel) -> "ScoreTable":
        parts: list[np.ndarray] = []
        at: dict[str, int] = {}

        def put(name: str, *arrays: Any) -> None:
            at[name] = sum(len(x) for x in parts)
            parts.extend(np.ravel(np.asarray(a, dtype=np.float64)) for a in arrays)

        put("bias", scorer.bias)
        put("slopes", scorer.slopes)
        put("dbias", [scorer.difficulty_bias])
        put("platt", platt)
        n_topics = rank = 0
        if scorer.centroids is not None:
            n_topics, rank = scorer.centroids.shape
            put("topics", scorer.centroids, scorer._half_norms, *scorer.topic_arrays())
        put("coef", cost.coef)
        put("floor", cost.floor)
        if cost.topic_coef is not None and n_topics:
            put("tcoef", cost.topic_coef)
        return cls(np.concatenate(parts), at, len(scorer.bias), n_topics, rank)


def _plan(
    spec: FeatureSpec, weights: np.ndarray | None, columns: int, table: ScoreTable | None = None
) -> dict[str, int]:
    """Where each buffer lies in the module's memory (16-byte aligned), as kernel.ts plans it
    (and, in Python only, the scorer's table and the `scores` output)."""
    at = _TABLES_END
    out: dict[str, int] = {}

    def take(name: str, size: int) -> None:
        nonlocal at
        out[name] = at
        at += -(-size // 16) * 16

    touched = min(spec.n_buckets, MAX_BYTES * 9)
    bits = max(1, round(math.log2(spec.n_buckets)))
    out["passes"] = -(-bits // 8)
    out["radix_bits"] = -(-bits // out["passes"])
    take("weights", 0 if weights is None else weights.nbytes)
    take("counts", 4 * spec.n_buckets)
    take("touched", 4 * (touched + 1))  # `buckets` writes one past the last touch
    take("sorted", 4 * touched)
    take("cut", MAX_BYTES)  # read 16 bytes at a time, and a word's last 8 at once
    take("lower", MAX_BYTES)
    take("bits", MAX_BYTES // 8 + 16)
    take("word_hi", 4 * (MAX_BYTES // 2 + 1))
    take("word_lo", 4 * (MAX_BYTES // 2 + 1))
    take("ids", 4 * (1 + touched + len(STAT_NAMES)))
    take("vals", 8 * (1 + touched + len(STAT_NAMES)))
    take("bucket_counts", 4 * touched)
    take("r", 8 * max(columns, 1))
    take("grams", len(spec.char_ngrams))
    take("tf", 8 * _TF)
    take("idf", 0 if spec.idf is None else 8 * len(spec.idf))
    take("digits", 4 << out["radix_bits"])
    take("table", 0 if table is None else table.data.nbytes)
    take("scores", 0 if table is None else 8 * 3 * table.k)
    take("args", 4 * 32)
    take("score_args", 4 * 22)
    out["end"] = at
    return out


class _Call:
    """One export called through wasmtime's unchecked entry point: the arguments live in one
    array of raw values laid out once (`set` changes one); the result overwrites the first."""

    def __init__(self, wasmtime: Any, store: Any, name: str, func: Any, args: list[int]) -> None:
        ffi = wasmtime._bindings
        self.name = name
        self._raw = (ffi.wasmtime_val_raw_t * max(len(args), 1))()
        for i, v in enumerate(args):
            self._raw[i].i32 = v
        self._first = args[0]
        self._len = len(self._raw)
        self._trap = ctypes.POINTER(ffi.wasm_trap_t)()
        self._fn = ffi._wasmtime_func_call_unchecked
        self._parts = (
            store._context(),
            ctypes.byref(func._func),
            self._raw,
            self._len,
            ctypes.byref(self._trap),
        )

    def set(self, i: int, v: int) -> None:
        self._raw[i].i32 = v
        if i == 0:
            self._first = v

    def __call__(self) -> int:
        raw = self._raw
        if self._fn(*self._parts) or self._trap:
            raise RuntimeError(f"its `{self.name}` call ended in an error or a trap")
        out = int(raw[0].i32)
        raw[0].i32 = self._first
        return out


class Kernel:
    """The module instantiated for one policy: `fill_row`, then `scores` (a linear scorer) or the
    scorer's own steps and `sigmoids`."""

    def __init__(
        self,
        wasmtime: Any,
        spec: FeatureSpec,
        weights: np.ndarray | None,
        columns: int,
        table: ScoreTable | None = None,
    ) -> None:
        engine = wasmtime.Engine()
        store = wasmtime.Store(engine)
        module = wasmtime.Module(engine, resources.files(__package__).joinpath("kernel.wasm").read_bytes())
        f64 = wasmtime.ValType.f64()
        ln1p = wasmtime.Func(
            store, wasmtime.FuncType([f64], [f64]), lambda n: float(ln1p_int(np.array([n]))[0])
        )
        exports = wasmtime.Instance(store, module, [ln1p]).exports(store)
        memory = exports["memory"]
        at = self.at = _plan(spec, weights, columns, table)
        grow = -(-at["end"] // _PAGE) - memory.data_len(store) // _PAGE
        if grow > 0:
            memory.grow(store, grow)
        address = ctypes.cast(memory.data_ptr(store), ctypes.c_void_p).value or 0
        self.memory = np.ctypeslib.as_array((ctypes.c_ubyte * memory.data_len(store)).from_address(address))
        self._keep = (store, exports, ln1p)  # the views above live as long as the store

        def view(name: str, dtype: type, n: int) -> np.ndarray:
            return self.memory[at[name] : at[name] + n * np.dtype(dtype).itemsize].view(dtype)

        touched = min(spec.n_buckets, MAX_BYTES * 9)
        self.memory[_NIBBLES : _NIBBLES + 96] = np.frombuffer(class_nibbles(), dtype=np.uint8)
        if weights is not None:
            self.memory[at["weights"] : at["weights"] + weights.nbytes] = np.frombuffer(
                weights.tobytes(), np.uint8
            )
        view("grams", np.uint8, len(spec.char_ngrams))[:] = spec.char_ngrams
        view("tf", np.float64, _TF)[:] = TF_TABLE[:_TF]
        if spec.idf is not None:
            view("idf", np.float64, len(spec.idf))[:] = spec.idf_array
        self.out = self.memory[_OUT : _OUT + 16].view(np.int32)
        self.cut_address = address + at["cut"]
        self.ids = view("ids", np.int32, 1 + touched + len(STAT_NAMES))
        self.vals = view("vals", np.float64, 1 + touched + len(STAT_NAMES))
        self.r = view("r", np.float64, max(columns, 1))
        self.lock = threading.Lock()
        self.columns = columns

        def call(name: str, *args: int) -> _Call:
            return _Call(wasmtime, store, name, exports[name], list(args))

        idf = at["idf"] if spec.idf is not None else 0
        # `features`: words' arguments, buckets', row's (kernel.mjs), then the two counts it leaves
        self.args = view("args", np.int32, 32)
        self.args[:30] = [
            at["cut"], 0, at["lower"], at["bits"], at["word_hi"], at["word_lo"],
            0, at["word_hi"], at["word_lo"], int(spec.word_bigrams), at["lower"], 0, at["grams"],
            len(spec.char_ngrams), spec.n_buckets - 1, at["counts"], at["touched"],
            0, at["counts"], at["touched"], at["sorted"], at["digits"], at["radix_bits"], at["passes"],
            at["tf"], idf, at["bucket_counts"], at["ids"], at["vals"], len(spec.suites),
        ]  # fmt: skip
        self._ids_at, self._vals_at = at["ids"], at["vals"]
        self._features = call("features", at["args"])
        self._sigmoids = call("sigmoids", at["r"], 0)
        self.table = table if weights is not None else None  # a table scores a linear scorer's weights
        if table is not None and weights is not None:
            view("table", np.float64, len(table.data))[:] = table.data
            self.score_out = view("scores", np.float64, 3 * table.k)

            def table_at(name: str) -> int:
                return at["table"] + 8 * table.at[name] if name in table.at else 0

            self._slopes, self._coef, self._row_bytes = table_at("slopes"), table_at("coef"), 8 * table.k
            # `score_row`: the weights' width, rowsums' arguments, then scores'
            self.score_args = view("score_args", np.int32, 22)
            self.score_args[:] = [
                int(weights.dtype == np.float64), at["weights"], columns, at["ids"], at["vals"], 0, at["r"],
                at["r"], table.k, table_at("bias"), 0, table_at("dbias"), table_at("platt"),
                table_at("topics"), table.n_topics, table.rank, self._coef, 0, table_at("floor"),
                table_at("tcoef"), 0, at["scores"],
            ]  # fmt: skip
            self._score_row = call("score_row", at["score_args"])

    @classmethod
    def create(
        cls,
        spec: FeatureSpec,
        weights: np.ndarray | None = None,
        engine: str | None = None,
        table: ScoreTable | None = None,
    ) -> "Kernel | None":
        """A kernel for the policy's features (and its linear scorer's (F, C) weights, and with
        `table` the rest of its scoring), or None where wasmtime is not installed, the module will
        not run, or the engine is numpy."""
        if (engine or default_engine()) != "webassembly" or spec.embeddings:
            return None
        try:
            import wasmtime
        except ModuleNotFoundError as exc:
            if exc.name == "wasmtime":
                return None  # the `fast` extra is not installed: numpy, as documented
            return _unavailable(exc)
        except Exception as exc:  # noqa: BLE001  (a broken install: its native library, say)
            return _unavailable(exc)
        try:
            major = int(version("wasmtime").split(".")[0])
            if major != WASMTIME_MAJOR:
                raise RuntimeError(
                    f"wasmtime {version('wasmtime')} is installed; the kernel calls private entry points "
                    f"of wasmtime {WASMTIME_MAJOR} (pip install 'routeopt[fast]' installs it)"
                )
            return cls(wasmtime, spec, weights, 0 if weights is None else weights.shape[1], table)
        except Exception as exc:  # noqa: BLE001  (any failure here means: use numpy)
            return _unavailable(exc)

    @staticmethod
    def failed(exc: BaseException) -> None:
        """Say once, for the policy whose kernel just failed a call, that numpy takes over."""
        log.warning(
            "the WebAssembly kernel failed (%s); this policy's decisions take the numpy steps from now on",
            exc,
        )

    def sigmoids(self, t: list[float]) -> list[float]:
        """Section 1's sigmoid of a few doubles (at most one per weight column), through `r`;
        the same bits as `numerics.sigmoid_list`, at a twentieth of its time."""
        n = len(t)
        self.r[:n] = t
        self._sigmoids.set(1, n)
        self._sigmoids()
        return self.r[:n].tolist()  # type: ignore[no-any-return]

    def scores(
        self, n: int, slope_row: int, suite_pos: int, n_chars: int
    ) -> tuple[list[float], list[float], list[float], int]:
        """5.1-5.4 and 6 after `fill_row` (a kernel with a `table`): the logits, calibrated
        probabilities and costs of the row's n entries, and its topic (-1 without topics)."""
        assert self.table is not None
        a = self.score_args
        a[5] = n
        a[10] = self._slopes + slope_row * self._row_bytes
        a[17] = self._coef + (2 + suite_pos) * self._row_bytes if suite_pos >= 0 else 0
        a[20] = n_chars
        topic = self._score_row()
        out = self.score_out.tolist()
        k = self.table.k
        return out[:k], out[k : 2 * k], out[2 * k :], topic

    def fill_row(self, prompt: str, suite: str | None, spec: FeatureSpec) -> tuple[int, int, int]:
        """One request through the spec's "Bytes" and "Features" steps (4.1-4.6 in one kernel
        call) into `ids` and `vals`: (the row's length, the suite's column or -1, the prompt's
        code points)."""
        raw, n_chars = _normalised(prompt)
        part = cut(raw)
        pos = spec.suite_position(suite)
        head = 1 if pos >= 0 else 0
        ctypes.memmove(self.cut_address, part, len(part))
        a = self.args
        a[1] = a[11] = len(part)
        a[27], a[28] = self._ids_at + 4 * head, self._vals_at + 8 * head
        self._features()
        n_words, nt = a[30:32].tolist()
        chars, digit_upper, punct_code, _ = self.out.tolist()
        classes = (digit_upper & 0xFFFF, digit_upper >> 16, punct_code & 0xFFFF, punct_code >> 16)
        stats = request_stats(
            n_chars, n_words, raw.count(b"\n"), raw.count(b"?"), chars, classes, max(len(part), 1), spec
        )
        if head:
            self.ids[0], self.vals[0] = pos, 1.0
        end = head + nt
        self.ids[end : end + len(stats)] = spec.stat_columns
        self.vals[end : end + len(stats)] = stats
        return end + len(stats), pos, n_chars


def _unavailable(exc: BaseException) -> "Kernel | None":
    """Warn that the numpy steps run in the kernel's place; None, for `Kernel.create` to return."""
    log.warning("the WebAssembly kernel is unavailable (%s); the numpy steps run instead", exc)
    return None
