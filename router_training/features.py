"""Request features a gateway can compute in microseconds with numpy alone.

Three blocks, concatenated: the suite label (one-hot; an unknown or missing suite is all zeros),
hashed text n-grams (lower-cased words, word bigrams, character n-grams; sub-linear tf x idf,
L2-normalised), and a few length/structure statistics. Hashing is vectorised over the prompt's
UTF-8 bytes with wrap-around uint64 arithmetic, so it is deterministic across processes
(Python's `hash()` is salted per process and would not be).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Sequence

import numpy as np

_P = np.uint64(1099511628211)  # FNV prime: odd, hence invertible modulo 2**64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_MAX_BYTES = 8192  # longer prompts keep their head and tail: routing signal sits there
_DIGIT, _UPPER, _PUNCT, _CODE, _ALNUM = 1, 2, 4, 8, 16
_CLASS = np.zeros(256, dtype=np.uint8)
_CLASS[48:58] |= _DIGIT | _ALNUM
_CLASS[65:91] |= _UPPER | _ALNUM
_CLASS[97:123] |= _ALNUM
_CLASS[128:256] |= _ALNUM
_CLASS[[ord(c) for c in "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"]] |= _PUNCT
_CLASS[[ord(c) for c in "{}()[];=<>_"]] |= _CODE
_LOWER = np.arange(256, dtype=np.uint8)
_LOWER[65:91] += 32

EMBEDDING_DIM = 384
STAT_NAMES: tuple[str, ...] = (
    "log_chars", "log_words", "log_lines", "digit_frac", "upper_frac", "punct_frac",
    "code_frac", "mean_word_len", "question_marks",
)


def _powers(base: np.uint64, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    with np.errstate(over="ignore"):
        out[1:] = base
        np.cumprod(out, out=out)
    return out


_POW = _powers(_P, _MAX_BYTES + 1)
_POW_INV = _powers(_P_INV, _MAX_BYTES + 1)


def _mix(h: np.ndarray, salt: int) -> np.ndarray:
    """A murmur-style finaliser, so nearby polynomial hashes spread over all buckets."""
    with np.errstate(over="ignore"):
        h = h ^ np.uint64(salt * 0x9E3779B97F4A7C15 % 2**64)
        h = h ^ (h >> np.uint64(33))
        h = h * _MIX1
        h = h ^ (h >> np.uint64(33))
        h = h * _MIX2
        return h ^ (h >> np.uint64(33))


def _to_bytes(prompt: str) -> np.ndarray:
    """The prompt's UTF-8 bytes (head and tail when long), with ASCII letters kept as-is."""
    raw = prompt.encode("utf-8", "replace")
    if len(raw) > _MAX_BYTES:
        half = _MAX_BYTES // 2
        raw = raw[:half] + raw[-half:]
    return np.frombuffer(raw, dtype=np.uint8)


def _char_hashes(b: np.ndarray, ns: tuple[int, ...]) -> list[np.ndarray]:
    """Character n-grams (n <= 7) read as overlapping little-endian uint64 words: no loops."""
    if not ns or len(b) == 0:
        return []
    buf = np.concatenate((b, np.zeros(8, dtype=np.uint8)))
    words = np.ndarray(shape=(len(b),), dtype="<u8", buffer=buf, strides=(1,))
    out = []
    for n in ns:
        if len(b) >= n:
            mask = np.uint64((1 << (8 * n)) - 1)
            out.append((words[: len(b) - n + 1] & mask) | np.uint64(n << 56))
    return out


def _word_hashes(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Hashes of alphanumeric runs (words) and their lengths, via prefix sums mod 2**64."""
    padded = np.zeros(len(b) + 2, dtype=np.uint8)
    padded[1:-1] = np.take(_CLASS, b) & _ALNUM
    change = (padded[1:] != padded[:-1]).nonzero()[0]  # alternating word starts and ends
    starts, ends = change[0::2], change[1::2]
    if len(starts) == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    with np.errstate(over="ignore"):
        s = np.concatenate(([np.uint64(0)], np.cumsum(b.astype(np.uint64) * _POW[: len(b)])))
        h = (np.take(s, ends) - np.take(s, starts)) * np.take(_POW_INV, starts)
    return h, ends - starts


@dataclass(frozen=True)
class FeatureSpec:
    """Everything needed to recompute features exactly: saved inside every policy."""

    suites: tuple[str, ...] = ()
    n_buckets: int = 2**14
    char_ngrams: tuple[int, ...] = (4,)
    word_bigrams: bool = True
    idf: tuple[float, ...] | None = field(default=None, repr=False)
    stat_mean: tuple[float, ...] | None = None
    stat_std: tuple[float, ...] | None = None
    embeddings: bool = False  # append MiniLM sentence embeddings (the optional 'embeddings' extra)

    def __post_init__(self) -> None:
        if self.n_buckets & (self.n_buckets - 1):
            raise ValueError(f"n_buckets must be a power of two, got {self.n_buckets}")

    @property
    def n_features(self) -> int:
        return len(self.suites) + self.n_buckets + len(STAT_NAMES) + (EMBEDDING_DIM if self.embeddings else 0)

    @property
    def idf_array(self) -> np.ndarray:
        cached = self.__dict__.get("_idf_array")
        if cached is None:
            cached = np.asarray(self.idf, dtype=np.float64)
            object.__setattr__(self, "_idf_array", cached)
        return cached

    @property
    def stat_mean_array(self) -> np.ndarray:
        return np.asarray(self.stat_mean, dtype=np.float64)

    @property
    def stat_std_array(self) -> np.ndarray:
        return np.asarray(self.stat_std, dtype=np.float64)

    @property
    def suite_positions(self) -> dict[str, int]:
        cached = self.__dict__.get("_suite_positions")
        if cached is None:
            cached = {s: i for i, s in enumerate(self.suites)}
            object.__setattr__(self, "_suite_positions", cached)
        return cached

    def to_dict(self) -> dict:
        d = asdict(self)
        d["suites"] = list(self.suites)
        d["char_ngrams"] = list(self.char_ngrams)
        d["idf"] = None if self.idf is None else [round(v, 5) for v in self.idf]
        for k in ("stat_mean", "stat_std"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "FeatureSpec":
        idf = d.get("idf")
        return cls(
            suites=tuple(d["suites"]),
            n_buckets=int(d["n_buckets"]),
            char_ngrams=tuple(int(n) for n in d["char_ngrams"]),
            word_bigrams=bool(d["word_bigrams"]),
            idf=None if idf is None else tuple(float(v) for v in idf),
            stat_mean=_floats(d.get("stat_mean")),
            stat_std=_floats(d.get("stat_std")),
            embeddings=bool(d.get("embeddings", False)),
        )


def _floats(v: Sequence[float] | None) -> tuple[float, ...] | None:
    return None if v is None else tuple(float(x) for x in v)


def _bucket_ids(b: np.ndarray, words: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    parts = [words + np.uint64(1)]
    if spec.word_bigrams and len(words) > 1:
        with np.errstate(over="ignore"):
            parts.append(words[:-1] * _P + words[1:] + np.uint64(2))
    parts.extend(_char_hashes(b, spec.char_ngrams))
    return (_mix(np.concatenate(parts), 7) & np.uint64(spec.n_buckets - 1)).astype(np.intp)


def _lower(prompt: str) -> tuple[np.ndarray, np.ndarray]:
    raw = _to_bytes(prompt)
    return raw, np.take(_LOWER, raw)


def bucket_ids(prompt: str, spec: FeatureSpec) -> np.ndarray:
    """Hash bucket of every text n-gram of a prompt (with repeats: counts are term frequencies)."""
    _, b = _lower(prompt)
    return _bucket_ids(b, _word_hashes(b)[0], spec)


_FLAG_MATRIX = np.array([[(c & f) > 0 for f in (_DIGIT, _UPPER, _PUNCT, _CODE)] for c in range(32)],
                        dtype=np.float64)


def _stats(prompt: str, raw: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    n = max(len(raw), 1)
    frac = np.bincount(np.take(_CLASS, raw), minlength=32) @ _FLAG_MATRIX / n
    n_words = len(lengths)
    return np.array(
        [
            math.log1p(len(prompt)),
            math.log1p(n_words),
            math.log1p(prompt.count("\n")),
            *frac.tolist(),
            float(lengths.sum()) / n_words if n_words else 0.0,
            math.log1p(prompt.count("?")),
        ],
        dtype=np.float64,
    )


def text_stats(prompt: str) -> np.ndarray:
    """Length and structure statistics on their raw scale."""
    raw, b = _lower(prompt)
    return _stats(prompt, raw, _word_hashes(b)[1])


def request_features(
    prompt: str, suite: str | None, spec: FeatureSpec, embedding: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One request as a sparse row (column ids, values) of [suite one-hot | text | stats | emb].

    Text is sub-linear tf (x idf once fitted), L2-normalised; stats are standardised once fitted.
    The embedding block exists only when the spec asks for it (computed here unless given).
    """
    raw, b = _lower(prompt)
    words, lengths = _word_hashes(b)
    counts = np.bincount(_bucket_ids(b, words, spec), minlength=spec.n_buckets)
    ids = (counts != 0).nonzero()[0]  # faster than flatnonzero on ints
    x = np.log1p(np.take(counts, ids).astype(np.float64))
    if spec.idf is not None:
        x *= np.take(spec.idf_array, ids)
    norm = np.sqrt(x @ x)
    if norm > 0:
        x /= norm
    stats = _stats(prompt, raw, lengths)
    if spec.stat_mean is not None:
        stats = (stats - spec.stat_mean_array) / spec.stat_std_array
    n_suites = len(spec.suites)
    pos = spec.suite_positions.get(suite) if suite is not None else None
    head_ids = [pos] if pos is not None else []
    all_ids = np.concatenate((np.array(head_ids, dtype=np.intp), ids + n_suites,
                              np.arange(len(stats)) + n_suites + spec.n_buckets))
    all_vals = np.concatenate((np.ones(len(head_ids)), x, stats))
    if spec.embeddings:
        if embedding is None:
            from router_training.embeddings import embed

            embedding = embed([prompt])[0]
        start = n_suites + spec.n_buckets + len(STAT_NAMES)
        all_ids = np.concatenate((all_ids, np.arange(start, start + EMBEDDING_DIM)))
        all_vals = np.concatenate((all_vals, embedding))
    return all_ids, all_vals


def document_frequency(prompts: Sequence[str], spec: FeatureSpec) -> tuple[float, ...]:
    """Smoothed idf per bucket, learned from training prompts."""
    df = np.zeros(spec.n_buckets)
    for p in prompts:
        df[np.flatnonzero(np.bincount(bucket_ids(p, spec), minlength=spec.n_buckets))] += 1
    idf = np.log((1 + len(prompts)) / (1 + df)) + 1.0
    return tuple(float(v) for v in idf)
