"""The spec's steps for many requests at once, to the same bits as the one-request path.

A gateway decides one request at a time (`RoutingPolicy.decide`); checking ~2,000 conformance
vectors that way costs ~100 numpy calls per request, far more than the 300 ms a cold load may
take. This module computes the same layers for a whole batch in a few dozen array operations:
the requests' cut bytes are laid end to end with a separator, word hashes use global positions
(a word's hash is the same at any offset), n-grams that would cross a request are dropped, and
every sum the spec orders is taken over a padded matrix whose padding is -0.0 (the one value
whose addition changes nothing), so each request's sum is still left to right. Tests check it
against the one-request path on every conformance input; the runtime's self-check also runs a
sample of the vectors through the one-request path itself.
"""

from __future__ import annotations

import functools
import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar, copy_context
from typing import TYPE_CHECKING, Callable, Iterable, Iterator, NamedTuple, Sequence, TypeVar, cast

import numpy as np

from routeopt.router_training.policy.features import (
    _ALNUM,
    _CLASS,
    _FLAG_MATRIX,
    _LOWER,
    _P,
    _POW,
    _POW_INV,
    _normalised,
    STAT_NAMES,
    FeatureSpec,
    cut,
    mix,
    statistics,
)
from routeopt.router_training.policy.numerics import (
    TF_TABLE,
    TF_TABLE_SIZE,
    ln1p_int,
    ordered_row_sum,
    sigmoid,
)
from routeopt.router_training.policy.scorer import LinearScorer

if TYPE_CHECKING:
    from routeopt.router_training.policy.routing import RoutingPolicy

_CELLS = 1 << 21  # padded-matrix elements per group: bounds the memory of a batch
_POOL_NAME = "routeopt-batch"
_T = TypeVar("_T")
_R = TypeVar("_R")
_BLOCK_BYTES = 1 << 18  # characters of text whose text steps are computed at once


class BatchText(NamedTuple):
    """The "Bytes" step of n requests; `cut` is their cut bytes end to end."""

    raw: list[bytes]
    utf8_len: np.ndarray
    n_chars: np.ndarray
    newlines: np.ndarray
    questions: np.ndarray
    cut: np.ndarray
    offsets: np.ndarray  # (n + 1,) into cut


def batch_text(texts: Sequence[str]) -> BatchText:
    raw, chars, parts = [], [], []
    for t in texts:
        b, c = _normalised(t)
        raw.append(b)
        chars.append(c)
        parts.append(cut(b))
    lens = np.array([len(p) for p in parts], dtype=np.int64)
    return BatchText(
        raw,
        np.array([len(b) for b in raw], dtype=np.int64),
        np.array(chars, dtype=np.int64),
        np.array([b.count(b"\n") for b in raw], dtype=np.int64),
        np.array([b.count(b"?") for b in raw], dtype=np.int64),
        np.frombuffer(b"".join(parts), dtype=np.uint8),
        np.concatenate(([0], np.cumsum(lens))),
    )


class BatchFeatures(NamedTuple):
    """Every feature layer of n requests. Text layers are computed once per distinct text
    (`text_of[i]` is request i's), each variable-length part with offsets; rows are per request."""

    text: BatchText
    word_offsets: np.ndarray
    words: np.ndarray  # uint64
    lengths: np.ndarray
    bucket_offsets: np.ndarray
    buckets: np.ndarray
    counts: np.ndarray
    text_values: np.ndarray
    stats: np.ndarray  # (distinct texts, 9)
    text_of: np.ndarray  # (n,)
    suite_pos: np.ndarray  # (n,)
    row_offsets: np.ndarray  # the sparse rows [suite | text | stats] of the n requests, end to end
    ids: np.ndarray
    vals: np.ndarray


def _words(bt: BatchText) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Word hashes (text order), lengths, owning request and (n + 1) offsets.

    Each request's bytes are followed by one separator (never alphanumeric), so a word never
    spans two requests; sum(byte_i P**i) over positions i within the request, times P**-start,
    is the word's hash. Texts are cut to `MAX_BYTES`, so the powers come from the tables the
    one-request path uses, whatever the batch's length."""
    n, b = len(bt.offsets) - 1, np.take(_LOWER, bt.cut)
    sep = bt.offsets[1:] + np.arange(n)  # where each request's separator goes in the laid-out buffer
    first = bt.offsets[:-1] + np.arange(n)  # where each request's bytes start in it
    buf = np.zeros(len(b) + n, dtype=np.uint8)
    alnum = np.zeros(len(buf) + 2, dtype=np.uint8)
    keep = np.ones(len(buf), dtype=bool)
    keep[sep] = False
    buf[keep] = b
    alnum[1:-1] = np.where(keep, np.take(_CLASS, buf) & _ALNUM, 0)
    change = (alnum[1:] != alnum[:-1]).nonzero()[0]
    starts, ends = change[0::2], change[1::2]
    owner = np.searchsorted(sep, starts)
    local = np.arange(len(buf))
    local -= np.repeat(first, sep - first + 1)
    terms = np.take(_POW, local)
    del local
    s = np.empty(len(buf) + 1, dtype=np.uint64)  # prefix sums in place: the widest arrays here
    s[0] = 0
    with np.errstate(over="ignore"):
        terms *= buf
        np.cumsum(terms, out=s[1:])
        h = (np.take(s, ends) - np.take(s, starts)) * np.take(_POW_INV, starts - first[owner])
    return h, ends - starts, owner, np.searchsorted(owner, np.arange(n + 1))


def _keys(
    bt: BatchText, words: np.ndarray, owner: np.ndarray, spec: FeatureSpec
) -> tuple[np.ndarray, np.ndarray]:
    """Every n-gram key and its request: words + 1, bigrams within a request, char n-grams
    whose bytes all belong to one request."""
    keys, reqs = [words + np.uint64(1)], [owner]
    if spec.word_bigrams and len(words) > 1:
        same = owner[:-1] == owner[1:]
        with np.errstate(over="ignore"):
            keys.append((words[:-1] * _P + words[1:] + np.uint64(2))[same])
        reqs.append(owner[:-1][same])
    if spec.char_ngrams and len(bt.cut):
        b = np.take(_LOWER, bt.cut)
        buf = np.concatenate((b, np.zeros(8, dtype=np.uint8)))
        as_words = np.ndarray(shape=(len(b),), dtype="<u8", buffer=buf, strides=(1,))
        req = np.repeat(np.arange(len(bt.offsets) - 1), np.diff(bt.offsets))
        for n in spec.char_ngrams:
            ok = np.arange(len(b)) + n <= bt.offsets[1:][req]
            keys.append(((as_words & np.uint64((1 << (8 * n)) - 1)) | np.uint64(n << 56))[ok])
            reqs.append(req[ok])
    return np.concatenate(keys), np.concatenate(reqs)


def _groups(lens: np.ndarray, width: int) -> Iterator[tuple[np.ndarray, int, np.ndarray, np.ndarray]]:
    """Requests in groups of similar length, each small enough to pad: (group, longest, row,
    col) with row/col the padded cell of each element."""
    order = np.argsort(lens, kind="stable")
    start, n = 0, len(lens)
    while start < n:
        rest = np.maximum(lens[order[start:]], 1)  # ascending, so the cells needed rise with the count
        take = max(1, int(np.count_nonzero(rest * np.arange(1, len(rest) + 1) * width <= _CELLS)))
        group = order[start : start + take]
        longest = max(int(lens[group].max()), 1)
        counts = lens[group]
        col = np.repeat(np.arange(len(group)), counts)
        first = np.concatenate(([0], np.cumsum(counts)[:-1]))
        row = np.arange(len(col)) - np.repeat(first, counts)
        yield group, longest, row, col
        start += take


def _sources(offsets: np.ndarray, group: np.ndarray, row: np.ndarray, col: np.ndarray) -> np.ndarray:
    return cast(np.ndarray, offsets[group][col] + row)


def segment_sums(values: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """Per segment (and per trailing column), its values added left to right: padding is -0.0,
    the one number whose addition changes no sum."""
    values = np.asarray(values, dtype=np.float64)
    n, lens, tail = len(offsets) - 1, np.diff(offsets), values.shape[1:]
    out = np.zeros((n, *tail))
    for group, longest, row, col in _groups(lens, int(np.prod(tail)) if tail else 1):
        pad = np.full((longest, len(group), *tail), -0.0)
        pad[row, col] = values[_sources(offsets, group, row, col)]
        out[group] = ordered_row_sum(pad.reshape(longest, -1)).reshape(len(group), *tail)
    return out


def segment_dot(vals: np.ndarray, ids: np.ndarray, offsets: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """Per sparse row, sum over its entries in order of value x weights[id] (the scorer's r).

    Step j adds every row's j-th term at once: with the rows longest first, the rows that still
    have a j-th term are a prefix, the first step assigns (the first term taken as is) and each
    later one adds, so every row is summed strictly left to right, with no padding and, per step,
    arrays of at most rows x width (a quarter faster than padded groups on the self-check)."""
    n, lens, width = len(offsets) - 1, np.diff(offsets), weights.shape[1]
    order = np.argsort(-lens, kind="stable")
    starts, by_length = offsets[:-1][order], lens[order]
    longest = int(by_length[0]) if n else 0
    alive = np.searchsorted(-by_length, -np.arange(longest), side="left")  # rows longer than j
    acc = np.zeros((n, width))
    for j in range(longest):
        src = starts[: alive[j]] + j
        term = vals[src][:, None] * np.take(weights, ids[src], axis=0)
        if j == 0:
            acc[: alive[j]] = term
        else:
            acc[: alive[j]] += term
    out = np.empty_like(acc)
    out[order] = acc
    return out


def _stats(bt: BatchText, lengths: np.ndarray, word_offsets: np.ndarray) -> np.ndarray:
    """`features.statistics` of the batch's texts."""
    n = len(bt.offsets) - 1
    counts = _class_counts(bt) @ _FLAG_MATRIX
    n_words = np.diff(word_offsets)
    word_chars = np.bincount(np.repeat(np.arange(n), n_words), weights=lengths, minlength=n)
    size = np.maximum(np.diff(bt.offsets), 1).astype(np.float64)
    return statistics(counts, size, bt.n_chars, n_words, bt.newlines, bt.questions, word_chars)


def _class_counts(bt: BatchText, block: int = 1 << 24) -> np.ndarray:
    """Per text, how many of its cut bytes fall in each of the 32 classes, counted `block` bytes
    of texts at a time (a per-byte index of a whole large batch would take 8 bytes per byte)."""
    n = len(bt.offsets) - 1
    counts = np.zeros((n, 32), dtype=np.int64)
    lo = 0
    while lo < n:
        hi = min(max(int(np.searchsorted(bt.offsets, bt.offsets[lo] + block, side="right")) - 1, lo + 1), n)
        req = np.repeat(np.arange(hi - lo), np.diff(bt.offsets[lo : hi + 1]))
        cls = np.take(_CLASS, bt.cut[bt.offsets[lo] : bt.offsets[hi]])
        counts[lo:hi] = np.bincount(req * 32 + cls, minlength=32 * (hi - lo)).reshape(hi - lo, 32)
        lo = hi
    return counts


def _distinct(texts: Sequence[str]) -> tuple[list[str], np.ndarray]:
    first: dict[str, int] = {}
    text_of = np.array([first.setdefault(t, len(first)) for t in texts], dtype=np.int64)
    return list(first), text_of


class TextLayers(NamedTuple):
    """The text steps of distinct texts: what depends on a text and the spec's hashing only
    (raw statistics and term counts; no idf, scaling or suite)."""

    text: BatchText
    word_offsets: np.ndarray
    words: np.ndarray
    lengths: np.ndarray
    bucket_offsets: np.ndarray
    buckets: np.ndarray
    counts: np.ndarray
    stats: np.ndarray

    def take(self, idx: np.ndarray) -> "TextLayers":
        """The layers of texts `idx`, as `text_layers` of those texts alone computes them."""
        t = self.text
        (cut,), cut_offsets = _gather((t.cut,), t.offsets, idx)
        (words, lengths), word_offsets = _gather((self.words, self.lengths), self.word_offsets, idx)
        (buckets, counts), bucket_offsets = _gather((self.buckets, self.counts), self.bucket_offsets, idx)
        text = BatchText(
            [t.raw[i] for i in idx] if t.raw else [],  # layers kept without their bytes have none
            t.utf8_len[idx],
            t.n_chars[idx],
            t.newlines[idx],
            t.questions[idx],
            cut,
            cut_offsets,
        )
        return TextLayers(
            text, word_offsets, words, lengths, bucket_offsets, buckets, counts, self.stats[idx]
        )


def _gather(
    values: tuple[np.ndarray, ...], offsets: np.ndarray, idx: np.ndarray
) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """Segments `idx` of arrays sharing `offsets`, end to end in that order, and their offsets;
    slice by slice, so no index as long as the values is made."""
    lens = np.diff(offsets)[idx]
    new = np.concatenate(([0], np.cumsum(lens)))
    spans = [(int(offsets[i]), int(offsets[i + 1])) for i in idx]
    out = tuple(np.concatenate([v[a:b] for a, b in spans]) if spans else v[:0].copy() for v in values)
    return out, new


def _shifted(offsets: list[np.ndarray]) -> np.ndarray:
    """Offsets of consecutive blocks as one."""
    bases = np.cumsum([0] + [int(o[-1]) for o in offsets[:-1]])
    return np.concatenate([np.zeros(1, dtype=np.int64)] + [o[1:] + base for o, base in zip(offsets, bases)])


def _concat(parts: list["TextLayers"]) -> "TextLayers":
    """The layers of consecutive blocks of texts as one (the arrays joined a core each)."""
    if len(parts) == 1:
        return parts[0]
    ts = [p.text for p in parts]
    joined = [
        [t.utf8_len for t in ts],
        [t.n_chars for t in ts],
        [t.newlines for t in ts],
        [t.questions for t in ts],
        [t.cut for t in ts],
        [p.words for p in parts],
        [p.lengths for p in parts],
        [p.buckets for p in parts],
        [p.counts for p in parts],
        [p.stats for p in parts],
    ]
    utf8_len, n_chars, newlines, questions, cut, words, lengths, buckets, counts, stats = parallel_map(
        np.concatenate, joined
    )
    text = BatchText(
        [r for t in ts for r in t.raw],
        utf8_len,
        n_chars,
        newlines,
        questions,
        cut,
        _shifted([t.offsets for t in ts]),
    )
    return TextLayers(
        text,
        _shifted([p.word_offsets for p in parts]),
        words,
        lengths,
        _shifted([p.bucket_offsets for p in parts]),
        buckets,
        counts,
        stats,
    )


def text_layers(unique: Sequence[str], spec: FeatureSpec) -> TextLayers:
    """The text steps of distinct texts, computed together (reused, with `reuse_text_layers`)
    a block of about `_BLOCK_BYTES` of text at a time, a block per core: every step is per
    text, so blocks give the same bits, and the hashing's arrays (several times the text's
    bytes) stay bounded."""
    memo = _MEMO.get()
    if memo is not None:
        return memo.layers(unique, spec)
    return _concat(parallel_map(lambda span: _text_block(unique[span[0] : span[1]], spec), _spans(unique)))


def _spans(unique: Sequence[str]) -> list[tuple[int, int]]:
    """Consecutive ranges of texts of about `_BLOCK_BYTES` each."""
    sizes = np.fromiter((len(t) for t in unique), dtype=np.int64, count=len(unique))
    ends = np.searchsorted(
        np.cumsum(sizes), np.arange(1, int(sizes.sum()) // _BLOCK_BYTES + 1) * _BLOCK_BYTES
    )
    bounds = [0, *sorted({int(e) + 1 for e in ends if e + 1 < len(unique)}), len(unique)]
    return list(zip(bounds[:-1], bounds[1:]))


def _without_words(L: TextLayers) -> TextLayers:
    """L without its bytes and words (left empty, offsets at zero), its buckets and counts in
    32 bits: the statistics, character counts and buckets that training reads, in a fraction
    of the memory."""
    none = np.zeros(len(L.stats) + 1, dtype=np.int64)
    return L._replace(
        text=L.text._replace(raw=[], cut=L.text.cut[:0].copy(), offsets=none),
        word_offsets=none,
        words=L.words[:0].copy(),
        lengths=L.lengths[:0].copy(),
        buckets=L.buckets.astype(np.int32),
        counts=L.counts.astype(np.int32),
    )


def _text_block(unique: Sequence[str], spec: FeatureSpec) -> TextLayers:
    bt = batch_text(unique)
    words, lengths, owner, word_offsets = _words(bt)
    keys, reqs = _keys(bt, words, owner, spec)
    comb = reqs.astype(np.int64) * spec.n_buckets + (mix(keys) & np.uint64(spec.n_buckets - 1)).astype(
        np.int64
    )
    uniq, counts = np.unique(comb, return_counts=True)
    bucket_offsets = np.searchsorted(uniq // spec.n_buckets, np.arange(len(unique) + 1))
    stats = _stats(bt, lengths, word_offsets)
    return TextLayers(bt, word_offsets, words, lengths, bucket_offsets, uniq % spec.n_buckets, counts, stats)


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity where the system says)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@functools.lru_cache(maxsize=1)
def _pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=available_cores(), thread_name_prefix=_POOL_NAME)


if hasattr(os, "register_at_fork"):  # a forked worker has none of the pool's threads: a new pool
    os.register_at_fork(after_in_child=_pool.cache_clear)


def parallel_map(fn: Callable[[_T], _R], items: Iterable[_T]) -> list[_R]:
    """`[fn(x) for x in items]`, a core per item where there are several: numpy releases the
    GIL in the array steps, so each item's work runs while another's does. The results are
    those of the plain loop, whatever the number of threads; called from one of the pool's own
    threads, it is the plain loop (a nested wait on the pool could wait forever)."""
    items = list(items)
    nested = threading.current_thread().name.startswith(_POOL_NAME)
    if len(items) < 2 or available_cores() < 2 or nested:
        return [fn(x) for x in items]
    runs = [(copy_context(), x) for x in items]  # each item sees the caller's context variables
    return list(_pool().map(lambda run: run[0].run(fn, run[1]), runs))


# Work over fewer array elements than this (a design's non-zeros, a frame's cells) runs on one
# thread: on a few hundred requests, threads cost more in start-up and in contention for the
# interpreter than their array steps overlap (training a small fleet took 2 to 3 times the CPU).
MIN_THREADED_SIZE = 1 << 20


def concurrently(fn: Callable[[_T], _R], items: Iterable[_T], size: int) -> list[_R]:
    """`[fn(x) for x in items]`, each item on a thread of its own: for a few long, independent
    pieces of work (cross-fitting folds) whose array steps release the GIL, so one piece's
    serial steps run while the others' products do. Their products still share the pool's
    cores (`parallel_map`). `size` is how many array elements the work streams over: below
    `MIN_THREADED_SIZE` it is the plain loop. The results are those of the plain loop; the
    first error is raised."""
    items = list(items)
    if len(items) < 2 or available_cores() < 2 or size < MIN_THREADED_SIZE:
        return [fn(x) for x in items]
    with ThreadPoolExecutor(max_workers=len(items), thread_name_prefix="routeopt-fold") as pool:
        futures = [pool.submit(copy_context().run, fn, x) for x in items]
        return [f.result() for f in futures]


class _LayerMemo:
    """Text layers of a fixed set of texts, computed once per hashing and taken from after.
    They are kept without their bytes and words (`_without_words`): what training reads of
    them, at a third of the memory; the layers taken from here have those empty."""

    def __init__(self, texts: Sequence[str]):
        self.texts = texts
        self.made: dict[tuple[int, tuple[int, ...], bool], tuple[TextLayers, dict[str, int]]] = {}
        self.lock = threading.Lock()  # blocks built on several threads compute the layers once

    def _made(self, spec: FeatureSpec) -> tuple[TextLayers, dict[str, int]]:
        """The layers of every text under this spec's hashing (computed on first use) and each
        text's position in them."""
        key = (spec.n_buckets, spec.char_ngrams, spec.word_bigrams)
        with self.lock:
            if key not in self.made:
                every, _ = _distinct(self.texts)
                blocks = parallel_map(
                    lambda span: _without_words(_text_block(every[span[0] : span[1]], spec)), _spans(every)
                )
                self.made[key] = (_concat(blocks), {t: i for i, t in enumerate(every)})
            return self.made[key]

    def layers(self, unique: Sequence[str], spec: FeatureSpec) -> TextLayers:
        made, index = self._made(spec)
        idx = [index.get(t, -1) for t in unique]
        if -1 in idx:
            token = _MEMO.set(None)
            try:
                return text_layers(unique, spec)
            finally:
                _MEMO.reset(token)
        taken = made.take(np.array(idx, dtype=np.int64))
        return taken._replace(**{f: getattr(taken, f).astype(np.int64) for f in _NARROW})

    def counts(self, texts: Sequence[str], spec: FeatureSpec) -> tuple[np.ndarray, np.ndarray] | None:
        """`text_counts` of `texts` read off the layers of every text, without taking a copy of
        them; None when a text is not among the memo's."""
        made, index = self._made(spec)
        idx = np.array([index.get(t, -1) for t in texts], dtype=np.int64)
        if len(idx) and idx.min() < 0:
            return None
        per_text = np.bincount(idx, minlength=len(index)).astype(np.float64)
        return made.stats[idx], document_counts(made, per_text, spec.n_buckets)


def document_counts(layers: TextLayers, per_text: np.ndarray, n_buckets: int) -> np.ndarray:
    """Per bucket, how many requests have it, where `per_text[i]` requests have text i: what a
    spec's idf is fitted on. Whole counts in float64, so any order of adding them is exact."""
    weights = np.repeat(per_text, np.diff(layers.bucket_offsets))
    return np.bincount(layers.buckets, weights=weights, minlength=n_buckets)


def text_counts(texts: Sequence[str], spec: FeatureSpec, block: int = 8192) -> tuple[np.ndarray, np.ndarray]:
    """Each text's raw statistics (len(texts), 9) and each bucket's document frequency over
    them: what a spec's idf and scaling are fitted on. Within `reuse_text_layers` holding every
    text, read off its layers; else computed `block` texts at a time."""
    memo = _MEMO.get()
    counted = memo.counts(texts, spec) if memo is not None else None
    if counted is not None:
        return counted
    stats, df = np.zeros((len(texts), len(STAT_NAMES))), np.zeros(spec.n_buckets)
    for lo in range(0, len(texts), block):
        unique, text_of = _distinct(texts[lo : lo + block])
        layers = text_layers(unique, spec)
        stats[lo : lo + len(text_of)] = layers.stats[text_of]
        per_text = np.bincount(text_of, minlength=len(unique)).astype(np.float64)
        df += document_counts(layers, per_text, spec.n_buckets)
    return stats, df


_NARROW = ("lengths", "buckets", "counts")  # int64 layers whose values fit 32 bits
_MEMO: ContextVar[_LayerMemo | None] = ContextVar("routeopt_text_layers", default=None)


@contextmanager
def reuse_text_layers(texts: Sequence[str]) -> Iterator[None]:
    """Within this block, the text steps of `texts` are computed once (per hashing) and every
    batch of them is taken from that: training computes a spec, a design matrix and held-out
    predictions from the same prompts several times. The batches carry no bytes or words
    (empty): conformance vectors, which record them, are not computed within it."""
    token = _MEMO.set(_LayerMemo(texts))
    try:
        yield
    finally:
        _MEMO.reset(token)


def batch_features(texts: Sequence[str], suites: Sequence[str | None], spec: FeatureSpec) -> BatchFeatures:
    """`features.feature_layers` of every request, computed together."""
    unique, text_of = _distinct(texts)
    L = text_layers(unique, spec)
    counts, buckets, bucket_offsets = L.counts, L.buckets, L.bucket_offsets
    x = ln1p_int(counts) if len(counts) and counts.max() >= TF_TABLE_SIZE else np.take(TF_TABLE, counts)
    if spec.idf is not None:
        x = x * np.take(spec.idf_array, buckets)
    norm = np.sqrt(segment_sums(x * x, bucket_offsets))
    per = np.repeat(norm, np.diff(bucket_offsets))
    x = np.where(per > 0, x / np.where(per > 0, per, 1.0), x)
    stats = L.stats
    if spec.stat_mean is not None:
        stats = (stats - spec.stat_mean_array) / spec.stat_std_array
    pos = np.array([spec.suite_position(s) for s in suites], dtype=np.int64)
    rows = _rows(pos, text_of, buckets, bucket_offsets, x, stats, spec)
    return BatchFeatures(
        L.text,
        L.word_offsets,
        L.words,
        L.lengths,
        bucket_offsets,
        buckets,
        counts,
        x,
        stats,
        text_of,
        pos,
        *rows,
    )


def _rows(
    pos: np.ndarray,
    text_of: np.ndarray,
    buckets: np.ndarray,
    offsets: np.ndarray,
    x: np.ndarray,
    stats: np.ndarray,
    spec: FeatureSpec,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The sparse rows end to end: [suite] + text + 9 statistics per request, in column order."""
    s, n_stats = len(spec.suites), stats.shape[1]
    has = (pos >= 0).astype(np.int64)
    n_text = np.diff(offsets)[text_of]
    lens = has + n_text + n_stats
    row_offsets = np.concatenate(([0], np.cumsum(lens)))
    ids, vals = np.empty(row_offsets[-1], dtype=np.int64), np.empty(row_offsets[-1])
    head = row_offsets[:-1][has == 1]
    ids[head], vals[head] = pos[has == 1], 1.0
    within = np.arange(int(n_text.sum())) - np.repeat(np.cumsum(n_text) - n_text, n_text)
    src = np.repeat(offsets[:-1][text_of], n_text) + within
    text_at = np.repeat(row_offsets[:-1] + has, n_text) + within
    ids[text_at], vals[text_at] = buckets[src] + s, x[src]
    stat_at = (row_offsets[1:] - n_stats)[:, None] + np.arange(n_stats)
    ids[stat_at], vals[stat_at] = s + spec.n_buckets + np.arange(n_stats), stats[text_of]
    return row_offsets, ids, vals


def batch_scores(policy: "RoutingPolicy", feats: BatchFeatures) -> tuple[np.ndarray, np.ndarray]:
    """Logits (n, K) and topics (n,) of every request, as `Scorer.score` computes them one by one."""
    scorer, n_suites = policy.scorer, len(policy.spec.suites)
    n = len(feats.suite_pos)
    slope_row = np.where(feats.suite_pos >= 0, feats.suite_pos, n_suites)
    if not isinstance(scorer, LinearScorer):
        rows = [
            scorer.score(feats.ids[a:b], feats.vals[a:b], int(slope_row[i]))
            for i, (a, b) in enumerate(zip(feats.row_offsets[:-1], feats.row_offsets[1:]))
        ]
        return np.array([r[0] for r in rows]).reshape(n, -1), np.array([r[1] for r in rows], dtype=np.int64)
    r = segment_dot(feats.vals, feats.ids, feats.row_offsets, scorer.weights)
    k = len(scorer.bias)
    out, slope, d = r[:, :k] + scorer.bias, scorer.slopes[slope_row], r[:, k] + scorer.difficulty_bias
    topic = np.full(n, -1, dtype=np.int64)
    if scorer.centroids is not None:
        z = r[:, k + 1 :]
        norm = np.sqrt(ordered_row_sum((z * z).T)) if n else np.zeros(0)
        unit = np.where(norm[:, None] > 0, z / np.where(norm > 0, norm, 1.0)[:, None], z)
        g = scorer.centroids.shape[0]
        sims = ordered_row_sum(
            (unit.T[:, :, None] * scorer.centroids.T[:, None, :]).reshape(unit.shape[1], -1)
        )
        topic = np.argmax(sims.reshape(n, g) - scorer._half_norms, axis=1)
        topic_bias, topic_slopes, topic_difficulty = scorer.topic_arrays()
        out, slope, d = out + topic_bias[topic], slope + topic_slopes[topic], d + topic_difficulty[topic]
    return out + d[:, None] * slope, topic


def batch_predict(
    policy: "RoutingPolicy",
    texts: Sequence[str],
    suites: Sequence[str | None],
) -> tuple[BatchFeatures, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(features, logits, topics, probabilities, costs) of many requests: `score_request` at once."""
    feats = batch_features(texts, suites, policy.spec)
    z, topic = batch_scores(policy, feats)
    p = sigmoid(policy.platt[0] * z + policy.platt[1])
    c = policy.cost_model.predict(feats.text.n_chars[feats.text_of], feats.suite_pos, topic)
    return feats, z, topic, p, c
