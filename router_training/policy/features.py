"""Request features a gateway can compute in microseconds with numpy alone.

Three blocks, concatenated: the suite label (one-hot; an unknown or missing suite is all zeros),
hashed text n-grams (lower-cased words, word bigrams, character n-grams; sub-linear tf x idf,
L2-normalised), and a few length/structure statistics. Hashing is vectorised over the prompt's
UTF-8 bytes with wrap-around uint64 arithmetic, so it is deterministic across processes
(Python's `hash()` is salted per process and would not be).

Every step is the one docs/policy-format.md specifies ("Bytes" and "Features"), in its order:
text -> bytes (lone surrogates become U+FFFD) -> the head/tail cut -> byte classes and
lower-casing -> word hashes -> n-gram keys -> buckets -> tf-idf -> statistics. Floats follow the
spec's operation order (routeopt.router_training.policy.numerics), so other runtimes reproduce them exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields
from typing import Any, NamedTuple, Sequence, cast

import numpy as np

from routeopt.router_training.policy.numerics import TF_TABLE, TF_TABLE_SIZE, ln1p_int, ordered_sum

_P = np.uint64(1099511628211)  # FNV prime: odd, hence invertible modulo 2**64
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_MIX1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX2 = np.uint64(0xC4CEB9FE1A85EC53)
_GOLDEN = 0x9E3779B97F4A7C15
BUCKET_SALT = 7
MAX_BYTES = 8192  # longer prompts keep their head and tail: routing signal sits there
_MAX_BYTES = MAX_BYTES
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
    "log_chars",
    "log_words",
    "log_lines",
    "digit_frac",
    "upper_frac",
    "punct_frac",
    "code_frac",
    "mean_word_len",
    "question_marks",
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


def mix(h: np.ndarray, salt: int = BUCKET_SALT) -> np.ndarray:
    """A murmur-style finaliser, so nearby polynomial hashes spread over all buckets."""
    with np.errstate(over="ignore"):
        h = h ^ np.uint64(salt * _GOLDEN % 2**64)
        h = h ^ (h >> np.uint64(33))
        h = h * _MIX1
        h = h ^ (h >> np.uint64(33))
        h = h * _MIX2
        return cast(np.ndarray, h ^ (h >> np.uint64(33)))


_SHIFT = np.uint64(33)
_BUCKET_SALT_WORD = np.uint64(BUCKET_SALT * _GOLDEN % 2**64)


def _bucket_mix(keys: np.ndarray) -> np.ndarray:
    """`mix(keys)` for a uint64 array, the steps done in place on one new array (numpy's integer
    arrays wrap around silently: only scalar arithmetic needs `errstate`)."""
    h = keys ^ _BUCKET_SALT_WORD
    h ^= h >> _SHIFT
    h *= _MIX1
    h ^= h >> _SHIFT
    h *= _MIX2
    h ^= h >> _SHIFT
    return h


_mix = mix


def _normalised(text: str) -> tuple[bytes, int]:
    """(UTF-8 bytes, code points) of the text with each unpaired surrogate replaced by U+FFFD
    (as WHATWG's TextEncoder does) and a high surrogate followed by a low one read as the
    character they denote."""
    try:
        return text.encode("utf-8"), len(text)
    except (
        UnicodeEncodeError
    ):  # surrogates: fix their 3-byte forms (no codec lookup: gateways may be sandboxed)
        raw = text.encode("utf-8", "surrogatepass")
        pairs = len(_PAIR.findall(raw))
        return _SURROGATE.sub(_fix_surrogate, raw), len(text) - pairs


_PAIR = re.compile(rb"\xed[\xa0-\xaf][\x80-\xbf]\xed[\xb0-\xbf][\x80-\xbf]")
_SURROGATE = re.compile(_PAIR.pattern + rb"|\xed[\xa0-\xbf][\x80-\xbf]")


def _fix_surrogate(m: re.Match[bytes]) -> bytes:
    """A high+low pair's two 3-byte forms -> the character's 4 bytes; a lone one -> U+FFFD."""
    b = m.group()
    if len(b) == 3:
        return b"\xef\xbf\xbd"
    hi = 0xD000 | (b[1] & 0x3F) << 6 | b[2] & 0x3F
    lo = 0xD000 | (b[4] & 0x3F) << 6 | b[5] & 0x3F
    return chr(0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)).encode("utf-8")


def text_bytes(text: str) -> bytes:
    """The spec's bytes of a text (prompt, suite, request id): UTF-8, lone surrogates as U+FFFD."""
    return _normalised(text)[0]


class PromptBytes(NamedTuple):
    """The spec's "Bytes" step: full UTF-8 length, code points, the cut bytes, and the two
    counts taken over the whole text."""

    utf8_len: int
    n_chars: int
    cut: np.ndarray  # uint8, at most MAX_BYTES
    newlines: int
    questions: int


def cut(raw: bytes) -> bytes:
    """The first and last MAX_BYTES / 2 bytes of a longer text (a character may be split)."""
    if len(raw) <= _MAX_BYTES:
        return raw
    half = _MAX_BYTES // 2
    return raw[:half] + raw[-half:]


def prompt_bytes(prompt: str) -> PromptBytes:
    raw, n_chars = _normalised(prompt)
    return PromptBytes(
        len(raw), n_chars, np.frombuffer(cut(raw), dtype=np.uint8), raw.count(b"\n"), raw.count(b"?")
    )


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


def _word_hashes(b: np.ndarray, classes: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Hashes sum(byte_j * P**j) mod 2**64 of alphanumeric runs (words) and their lengths, via
    prefix sums and inverse powers mod 2**64. `classes`: `_CLASS` of the bytes, when known (of the
    bytes before lower-casing too: A-Z and a-z are both alphanumeric)."""
    n = len(b)
    padded = np.zeros(n + 2, dtype=np.uint8)
    np.bitwise_and(_CLASS.take(b) if classes is None else classes, _ALNUM, out=padded[1:-1])
    change = (padded[1:] != padded[:-1]).nonzero()[0]  # alternating word starts and ends
    starts, ends = change[0::2], change[1::2]
    if len(starts) == 0:
        return np.empty(0, dtype=np.uint64), np.empty(0, dtype=np.int64)
    s = np.zeros(n + 1, dtype=np.uint64)  # prefix sums; integer arrays wrap around silently
    np.multiply(b, _POW[:n], out=s[1:])
    np.cumsum(s[1:], out=s[1:])
    h = s.take(ends)
    h -= s.take(starts)
    h *= _POW_INV.take(starts)
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
        if self.n_buckets < 1 or self.n_buckets & (self.n_buckets - 1):
            raise ValueError(f"n_buckets must be a power of two, got {self.n_buckets}")
        if any(not 1 <= n <= 7 for n in self.char_ngrams):
            raise ValueError(f"char_ngrams must be lengths 1 to 7, got {list(self.char_ngrams)}")

    @property
    def n_features(self) -> int:
        return len(self.suites) + self.n_buckets + len(STAT_NAMES) + (EMBEDDING_DIM if self.embeddings else 0)

    def _cached(self, name: str, value: object) -> np.ndarray:
        cached = self.__dict__.get(name)
        if cached is None:
            cached = np.asarray(value, dtype=np.float64)
            object.__setattr__(self, name, cached)
        return cached

    @property
    def idf_array(self) -> np.ndarray:
        return self._cached("_idf_array", self.idf)

    @property
    def stat_mean_array(self) -> np.ndarray:
        return self._cached("_stat_mean_array", self.stat_mean)

    @property
    def stat_std_array(self) -> np.ndarray:
        return self._cached("_stat_std_array", self.stat_std)

    @property
    def suite_positions(self) -> dict[str, int]:
        cached = self.__dict__.get("_suite_positions")
        if cached is None:
            cached = {s: i for i, s in enumerate(self.suites)}
            object.__setattr__(self, "_suite_positions", cached)
        return cached

    @property
    def stat_columns(self) -> np.ndarray:
        """The statistics' column ids (after the suites and the buckets)."""
        cached = self.__dict__.get("_stat_columns")
        if cached is None:
            cached = np.arange(len(STAT_NAMES)) + len(self.suites) + self.n_buckets
            object.__setattr__(self, "_stat_columns", cached)
        return cached

    def suite_position(self, suite: str | None) -> int:
        """The suite's one-hot column, or -1 (no suite, the empty string, or unknown)."""
        return self.suite_positions.get(suite, -1) if suite else -1

    def to_dict(self) -> dict[str, Any]:
        """Format 2's features.json (idf rounded to 5 decimals, as that format stored it)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}  # asdict would copy idf value by value
        d["suites"] = list(self.suites)
        d["char_ngrams"] = list(self.char_ngrams)
        d["idf"] = None if self.idf is None else [round(v, 5) for v in self.idf]
        for k in ("stat_mean", "stat_std"):
            d[k] = None if d[k] is None else list(d[k])
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "FeatureSpec":
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


_ONE, _TWO = np.uint64(1), np.uint64(2)


def ngram_keys(b: np.ndarray, words: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """The 64-bit key of every n-gram: words + 1, bigrams w1 * P + w2 + 2, then char n-grams."""
    chars = _char_hashes(b, spec.char_ngrams)
    n = len(words)
    n_bigrams = n - 1 if spec.word_bigrams and n > 1 else 0
    keys = np.empty(n + n_bigrams + sum(len(c) for c in chars), dtype=np.uint64)
    np.add(words, _ONE, out=keys[:n])
    if n_bigrams:  # integer arrays wrap around silently
        bigrams = keys[n : n + n_bigrams]
        np.multiply(words[:-1], _P, out=bigrams)
        bigrams += words[1:]
        bigrams += _TWO
    at = n + n_bigrams
    for c in chars:
        keys[at : at + len(c)] = c
        at += len(c)
    return keys


def _bucket_ids(b: np.ndarray, words: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    h = _bucket_mix(ngram_keys(b, words, spec))
    h &= np.uint64(spec.n_buckets - 1)
    return h.astype(np.intp)


def lowered(cut_bytes: np.ndarray) -> np.ndarray:
    """ASCII A-Z to a-z; every other byte (all of UTF-8's multi-byte ones) as it is."""
    return _LOWER.take(cut_bytes)


def bucket_counts(ids: np.ndarray, n_buckets: int) -> tuple[np.ndarray, np.ndarray]:
    """Distinct bucket ids in ascending order and how often each occurs (np.unique's answer: a
    short list is sorted and its runs counted, a long one counted per bucket)."""
    n = len(ids)
    if n * 8 < n_buckets:
        if n == 0:
            return np.unique(ids, return_counts=True)
        ids = np.sort(ids)
        first = np.empty(n + 1, dtype=bool)  # where each run starts, and the end
        first[0] = first[n] = True
        np.not_equal(ids[1:], ids[:-1], out=first[1:n])
        at = first.nonzero()[0]
        return ids.take(at[:-1]), at[1:] - at[:-1]
    counts = np.bincount(ids, minlength=n_buckets)
    distinct = (counts != 0).nonzero()[0]
    return distinct, counts.take(distinct)


_FLAG_MATRIX = np.array(
    [[(c & f) > 0 for f in (_DIGIT, _UPPER, _PUNCT, _CODE)] for c in range(32)], dtype=np.float64
)


def statistics(
    class_counts: np.ndarray,
    size: np.ndarray,
    n_chars: np.ndarray,
    n_words: np.ndarray,
    newlines: np.ndarray,
    questions: np.ndarray,
    word_chars: np.ndarray,
) -> np.ndarray:
    """The nine statistics of n texts (n, 9) on their raw scale, the one implementation for one
    request and for many: logs of the counts, the digit/upper/punct/code shares of the cut bytes
    (`class_counts` (n, 4) over `size`, the cut's length or 1), and the mean word length."""
    raw = np.stack((n_chars, n_words, newlines, questions), axis=1)
    logs = TF_TABLE.take(raw) if raw.size and raw.max() < TF_TABLE_SIZE else ln1p_int(raw)  # same bits
    mean_len = np.where(
        n_words > 0, word_chars / np.maximum(n_words, 1), 0.0
    )  # integer sums: exact in doubles
    return np.column_stack(
        (logs[:, 0], logs[:, 1], logs[:, 2], class_counts / size[:, None], mean_len, logs[:, 3])
    )


def _stats(
    pb: PromptBytes, lengths: np.ndarray, spec: "FeatureSpec", classes: np.ndarray | None = None
) -> np.ndarray:
    """`request_stats` of one request from its numpy layers (class counts over the cut bytes
    before lower-casing; `classes`: their `_CLASS`, when known)."""
    if classes is None:
        classes = _CLASS.take(pb.cut)
    counts = np.bincount(classes, minlength=32) @ _FLAG_MATRIX  # exact integers
    return np.array(
        request_stats(
            pb.n_chars,
            len(lengths),
            pb.newlines,
            pb.questions,
            int(lengths.sum()),
            [int(v) for v in counts.tolist()],
            max(len(pb.cut), 1),
            spec,
        )
    )


def _ln1p(n: int) -> float:
    return float(TF_TABLE.item(n)) if n < TF_TABLE_SIZE else float(ln1p_int(np.array([n]))[0])


def request_stats(
    n_chars: int,
    n_words: int,
    newlines: int,
    questions: int,
    word_chars: int,
    class_counts: Sequence[int],
    size: int,
    spec: "FeatureSpec",
) -> list[float]:
    """`statistics` of one request with Python's floats, standardised when the spec scales
    them, for both engines of the one-request path: the same IEEE operations on the same
    integers (all exact below 2**53), so the same bits, without thirty array calls on nine
    numbers."""
    digit, upper, punct, code = class_counts
    raw = [
        _ln1p(n_chars),
        _ln1p(n_words),
        _ln1p(newlines),
        digit / size,
        upper / size,
        punct / size,
        code / size,
        word_chars / n_words if n_words > 0 else 0.0,
        _ln1p(questions),
    ]
    if spec.stat_mean is None or spec.stat_std is None:
        return raw
    return [(x - m) / d for x, m, d in zip(raw, spec.stat_mean, spec.stat_std)]


def tf_idf(counts: np.ndarray, distinct: np.ndarray, spec: FeatureSpec) -> np.ndarray:
    """ln(1 + count) x idf per distinct bucket (ascending ids), divided by the L2 norm summed in
    that order."""
    if len(counts) and counts.max() >= TF_TABLE_SIZE:
        x = ln1p_int(counts)
    else:
        x = TF_TABLE.take(counts)
    if spec.idf is not None:
        x *= spec.idf_array.take(distinct)
    norm = math.sqrt(ordered_sum(x * x))  # IEEE sqrt: correctly rounded, as np.sqrt
    if norm > 0:
        x /= norm
    return x


class FeatureLayers(NamedTuple):
    """Each step's output for one request, as the conformance vectors record them."""

    text: PromptBytes
    words: np.ndarray  # uint64 word hashes, in text order
    lengths: np.ndarray
    buckets: np.ndarray  # distinct bucket ids, ascending
    counts: np.ndarray
    text_values: np.ndarray
    stats: np.ndarray  # standardised when the spec has scaling
    suite_pos: int
    ids: np.ndarray
    vals: np.ndarray


def feature_layers(prompt: str, suite: str | None, spec: FeatureSpec) -> FeatureLayers:
    """One request through the spec's steps, keeping every intermediate result."""
    pb = prompt_bytes(prompt)
    classes = _CLASS.take(pb.cut)
    b = lowered(pb.cut)
    words, lengths = _word_hashes(b, classes)
    distinct, counts = bucket_counts(_bucket_ids(b, words, spec), spec.n_buckets)
    x = tf_idf(counts, distinct, spec)
    stats = _stats(pb, lengths, spec, classes)
    n_suites = len(spec.suites)
    pos = spec.suite_position(suite)
    head, n_text = (1 if pos >= 0 else 0), len(distinct)
    ids = np.empty(head + n_text + len(stats), dtype=np.intp)
    vals = np.empty(len(ids), dtype=np.float64)
    if head:
        ids[0], vals[0] = pos, 1.0
    np.add(distinct, n_suites, out=ids[head : head + n_text])
    ids[head + n_text :] = spec.stat_columns
    vals[head : head + n_text] = x
    vals[head + n_text :] = stats
    return FeatureLayers(pb, words, lengths, distinct, counts, x, stats, pos, ids, vals)


def request_features(
    prompt: str, suite: str | None, spec: FeatureSpec, embedding: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """One request as a sparse row (column ids, values) of [suite one-hot | text | stats | emb].

    Text is sub-linear tf (x idf once fitted), L2-normalised; stats are standardised once fitted.
    The embedding block exists only when the spec asks for it (computed here unless given).
    """
    layers = feature_layers(prompt, suite, spec)
    all_ids, all_vals = layers.ids, layers.vals
    if spec.embeddings:
        if embedding is None:
            from routeopt.router_training.policy.embeddings import embed

            embedding = embed([prompt])[0]
        start = len(spec.suites) + spec.n_buckets + len(STAT_NAMES)
        all_ids = np.concatenate((all_ids, np.arange(start, start + EMBEDDING_DIM)))
        all_vals = np.concatenate((all_vals, embedding))
    return all_ids, all_vals


def n_chars(prompt: str) -> int:
    """The prompt's length in code points after the spec's text normalisation (the cost model's
    and the statistics' length): len(prompt) unless it holds surrogates."""
    return _normalised(prompt)[1]
