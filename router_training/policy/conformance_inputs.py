"""The requests every policy's conformance vectors run: hostile text, then synthetic prompts.

Vectors hold no training prompt (a policy travels to every gateway; prompts may be private).
The hostile list covers what breaks text pipelines: empty and whitespace-only text, NUL and
control bytes, unpaired surrogates, combining marks, emoji and other astral characters,
right-to-left scripts, CJK, the Turkish dotted I and final sigma, 1 MB prompts, and prompts
whose UTF-8 length lands on the head/tail cut exactly or one byte either side, with multi-byte
characters split by it. The synthetic prompts are seeded mixes of questions, code, lists and
prose in several scripts, 1 to ~20,000 characters long, so decisions spread over candidates.

A text is stored as prefix + pattern x repeat + suffix (so a 1 MB prompt costs a few bytes), each
part as generalised UTF-8 (a lone surrogate as its 3-byte form): docs/policy-format.md,
"Conformance vectors".
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

MB = 1 << 20
N_SYNTHETIC = 960  # texts; every text is asked twice, under two suites
_HALF = 4096


@dataclass(frozen=True)
class VectorInput:
    """One request of the vectors: text = prefix + pattern * repeat + suffix."""

    prefix: str
    pattern: str = ""
    repeat: int = 0
    suffix: str = ""
    suite: str | None = None
    request_id: str = ""

    @property
    def text(self) -> str:
        return self.prefix + self.pattern * self.repeat + self.suffix


def _exact(n_bytes: int, filler: str = "a") -> VectorInput:
    """An ASCII text of exactly n bytes with distinct head and tail words."""
    head, tail = "head words start here ", " and the tail ends here?"
    return VectorInput(head, filler, n_bytes - len(head) - len(tail), tail)


def hostile() -> list[VectorInput]:
    """Texts chosen to break byte handling, hashing and the cut (before suites are assigned)."""
    texts = [
        "",
        " ",
        "\t",
        "\n",
        "   \t\n\r\n   ",
        "\x00",
        "a\x00b",
        "\x00" * 17,
        "\x1b[31mred\x1b[0m \x7f",
        "\ufeffBOM first",
        "\ud800",
        "abc\udfff",
        "\udc00\ud800",
        "x\ud83d",
        "\ud83d\ude00 pair in halves",
        "e\u0301 e\u0301\u0301 Z\u0351\u0352\u0353\u0354\u0355",
        "😀",
        "👩‍👩‍👧‍👦 family",
        "🇺🇸🇯🇵 flags",
        "𠀀𠀁𠀂 astral CJK",
        "\U0010ffff\uffff\ufffe",
        "مرحبا بالعالم؟",
        "שלום עולם",
        "\u202eevil\u202c text",
        "日本語のテキストです。",
        "这是一个中文句子吗？",
        "한국어 문장입니다",
        "İstanbul ıi İI",
        "ΟΔΟΣ οδος ΣΊΣΥΦΟΣ",
        "straße STRASSE",
        "Ǆ ǅ ǆ",
        "ß" * 9,
        "?" * 40,
        "\n" * 300,
        "9" * 500,
        "A" * 9000,
        "def f(x):\n    return {x[0]: [1, 2]};  # code?\n",
        "SELECT * FROM t WHERE a = 'b';",
        "What is 2 + 2?",
        "UPPER CASE QUESTION?",
        "mixed CASE and 123 digits, punctuation!!!",
    ]
    out = [VectorInput(t) for t in texts]
    out += [
        VectorInput("", "a", MB),
        VectorInput("", "word ", MB // 5),
        VectorInput("", "日本語", MB // 9),
        VectorInput("start ", "😀 text ", MB // 9, " end?"),
        VectorInput("", "\x00", MB),
        VectorInput("Question: ", "The quick brown fox jumps over 13 lazy dogs? ", 23000, " Answer:"),
    ]
    out += [_exact(n) for n in (_HALF * 2 - 1, _HALF * 2, _HALF * 2 + 1, _HALF * 2 + 2)]
    out += [
        VectorInput("", "é", _HALF),  # exactly 8192 bytes: no cut
        VectorInput("a", "é", _HALF),  # 8193: the head ends inside an é
        VectorInput("ab", "€", 2730),  # 8192 with 3-byte characters
        VectorInput("", "€", 2731),  # 8193: both halves split a €
        VectorInput("x", "😀", 2048),  # 8193: split emoji
        VectorInput("ab", "😀", 2048, "c"),  # 8195
        VectorInput("word" * 1000, "", 0, "tail" * 1100),  # one word across the junction
        VectorInput("spaces", " ", 8186),  # 8192
        VectorInput("spaces", " ", 8187),  # 8193
    ]
    return out


_WORDS = (
    "the of and to in is that for it as with was on be by this are or from at which an have not "
    "they has but what all were when there can been one would will more if no out so said who "
    "about up them some could time into two only other than then its now like over also after "
    "first well way even new because any these give most us question answer choose option "
    "correct following sentence complete best explain why how many number sum product list "
    "string return function python value array sort reverse count words letters odd even "
    "prime integer decimal fraction percent total average difference true false yes no maybe "
    "water energy cell plant animal light heat force motion earth moon sun planet rock soil "
    "weather rain ice gas liquid solid mass speed experiment scientist student teacher class "
    "because therefore however although premise hypothesis entails contradiction neutral"
).split()
_FOREIGN = (
    "¿Cuál es la respuesta?",
    "Quelle est la réponse ?",
    "Was ist die Antwort?",
    "Какой ответ правильный?",
    "ما هو الجواب الصحيح؟",
    "正しい答えはどれですか？",
    "正确答案是什么？",
    "정답은 무엇입니까?",
    "Doğru cevap hangisi?",
    "Ποια είναι η σωστή απάντηση;",
    "सही उत्तर क्या है?",
)
_CODE = (
    "def solve(nums):\n    total = 0\n    for n in nums:\n        if n % 2 == 0:\n            total += n\n"
    "    return total\n",
    "assert solve([1, 2, 3, 4]) == 6\n",
    "for (let i = 0; i < n; i++) { out[i] = a[i] * 2; }\n",
    "SELECT name, COUNT(*) FROM users GROUP BY name HAVING COUNT(*) > 1;\n",
)


# The draws' populations as arrays once: `rng.choice` on a tuple converts it on every call.
_WORD_ARRAY, _CODE_ARRAY, _FOREIGN_ARRAY = np.array(_WORDS), np.array(_CODE), np.array(_FOREIGN)
_ENDS, _END_P = np.array(["?", ".", "!", ":", ";", ",", ""]), [0.3, 0.4, 0.05, 0.1, 0.05, 0.05, 0.05]
_SEPARATORS, _SEPARATOR_P = np.array([" ", "\n", "\n\n"]), [0.6, 0.3, 0.1]


def _sentence(rng: np.random.Generator) -> str:
    words = rng.choice(_WORD_ARRAY, size=int(rng.integers(3, 18))).tolist()
    if rng.random() < 0.3:
        words.insert(
            int(rng.integers(0, len(words) + 1)), str(int(rng.integers(0, 10 ** int(rng.integers(1, 7)))))
        )
    text = " ".join(words)
    if rng.random() < 0.2:
        text = text.capitalize()
    return text + str(rng.choice(_ENDS, p=_END_P))


def _piece(rng: np.random.Generator) -> str:
    kind = rng.random()
    if kind < 0.62:
        return _sentence(rng)
    if kind < 0.74:
        letters = "ABCD"
        return "\n".join(f"{letters[i]}) {_sentence(rng)}" for i in range(int(rng.integers(2, 5))))
    if kind < 0.86:
        return str(rng.choice(_CODE_ARRAY))
    if kind < 0.95:
        return str(rng.choice(_FOREIGN_ARRAY))
    return "".join(chr(int(c)) for c in rng.integers(0x20, 0x2FFF, size=int(rng.integers(1, 12))))


def _prompt(rng: np.random.Generator, n_pieces: int) -> str:
    sep = str(rng.choice(_SEPARATORS, p=_SEPARATOR_P))
    return sep.join(_piece(rng) for _ in range(n_pieces))


def synthetic(n: int = N_SYNTHETIC, seed: int = 2301) -> list[VectorInput]:
    """Seeded prompts of 1 to 16 pieces; every 32nd repeats a middle part (up to ~20,000
    characters, so the cut meets realistic text)."""
    return list(_synthetic(n, seed))


@functools.lru_cache(maxsize=4)
def _synthetic(n: int, seed: int) -> tuple[VectorInput, ...]:
    """`synthetic`, made once per process: every policy saved or checked asks for the same."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        pieces = int(np.exp(rng.uniform(0, np.log(16))))
        if i % 32 == 31:
            out.append(
                VectorInput(
                    _prompt(rng, 3) + " ",
                    _prompt(rng, 2) + " ",
                    int(rng.integers(5, 120)),
                    " " + _prompt(rng, 3),
                )
            )
        else:
            out.append(VectorInput(_prompt(rng, pieces)))
    return tuple(out)


_HOSTILE_SUITES: tuple[str | None, ...] = (None, "", "no-such-suite", "naïve suite ✓", "\ud800")
_HOSTILE_IDS = ("", " ", "ünïcödé-id", "\ud800", "id\x00nul", "x" * 300, "😀")


def vector_inputs(suites: tuple[str, ...], n_synthetic: int = N_SYNTHETIC) -> list[VectorInput]:
    """Hostile then synthetic texts, each asked twice (a 1 MB one once): under one of the
    policy's suites, and under another (known, missing, empty, unknown, a case variant), each
    time with its own request id for the exploration and canary draws."""
    texts = hostile() + synthetic(n_synthetic)
    others: list[str | None] = [*suites, *_HOSTILE_SUITES]
    if suites:
        others.append(suites[0].upper() if suites[0].upper() != suites[0] else suites[0] + "X")
    out: list[VectorInput] = []
    for i, t in enumerate(texts):
        first = suites[i % len(suites)] if suites else None
        huge = len(t.prefix) + len(t.pattern) * t.repeat + len(t.suffix) > 1 << 16
        for suite in (first,) if huge else (first, others[(i + 1) % len(others)]):
            n = len(out)
            rid = _HOSTILE_IDS[n] if n < len(_HOSTILE_IDS) else f"r{n}"
            out.append(VectorInput(t.prefix, t.pattern, t.repeat, t.suffix, suite, rid))
    return out


def wtf8(text: str) -> bytes:
    """Generalised UTF-8: a lone surrogate code point becomes its 3-byte form."""
    return text.encode("utf-8", "surrogatepass")


def from_wtf8(data: bytes) -> str:
    return data.decode("utf-8", "surrogatepass")
