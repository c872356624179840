"""The checker/program protocol: plain data crosses exactly, hostile replies are refused, and honest
programs that use classes, generators, exceptions and in-place updates still pass."""

from __future__ import annotations

import json
import os
import socket
import threading

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from routeopt.evals.grading import build_grader, harness
from routeopt.evals.grading.sandbox import isolation

needs_isolation = pytest.mark.skipif(isinstance(isolation(False), str), reason="no sandbox isolation here")

hashable = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.binary()
    | st.decimals(allow_nan=False)
    | st.fractions()
    | st.complex_numbers(allow_nan=False),
    lambda inner: st.tuples(inner, inner) | st.frozensets(inner, max_size=3),
    max_leaves=8,
)
plain = st.recursive(
    hashable,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(hashable, inner, max_size=4)
        | st.sets(hashable, max_size=4)
        | st.tuples(inner, inner)
        | st.binary().map(bytearray)
    ),
    max_leaves=20,
)


def no_refs(obj: object) -> object:
    raise AssertionError(f"plain data needed no proxy, got {obj!r}")


def same(a: object, b: object) -> bool:
    """Equal and of exactly the same types all the way down (a tuple is not a list)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return a == b


@settings(max_examples=300, deadline=None)
@given(plain)
def test_plain_data_crosses_the_wire_exactly(value: object) -> None:
    wire = json.loads(json.dumps(harness.encode(value, no_refs)))
    assert same(harness.decode(wire, no_refs), value)


def test_subclasses_cross_as_their_plain_value() -> None:
    class Sly(int):
        def __eq__(self, other: object) -> bool:
            return True

        __hash__ = int.__hash__

    class Name(str):
        pass

    wire = json.loads(json.dumps(harness.encode([Sly(3), Name("x")], no_refs)))
    decoded = harness.decode(wire, no_refs)
    assert decoded == [3, "x"] and [type(v) for v in decoded] == [int, str] and decoded[0] != 4


@pytest.mark.parametrize(
    "wire",
    [
        {"$eval": "1"},
        {"$tuple": [1], "$set": [2]},
        {"$fraction": [1, 0]},
        {"$bytes": "not base64!"},
        {"$dict": [[[1], 2]]},
    ],
)
def test_malformed_values_are_refused(wire: object) -> None:
    with pytest.raises(harness._PROTOCOL_ERRORS):
        harness.decode(wire, no_refs)


def test_nesting_and_message_size_are_capped() -> None:
    deep: object = 1
    for _ in range(harness.MAX_DEPTH + 2):
        deep = [deep]
    with pytest.raises(ValueError, match="nested deeper"):
        harness.decode(deep, no_refs)
    ours, theirs = socket.socketpair()
    flood = threading.Thread(
        target=lambda: (theirs.sendall(b"[" * (harness.MAX_MESSAGE + 10)), theirs.close())
    )
    flood.start()
    fd = ours.detach()
    with pytest.raises(ValueError, match="over 8 MiB"):
        harness.Channel(fd).recv()
    flood.join()
    os.close(fd)


PROGRAM = """
import math
from collections import Counter, namedtuple
from fractions import Fraction
from decimal import Decimal
Point = namedtuple("Point", "x y")
class Insufficient(ValueError):
    pass
class Stack:
    def __init__(self):
        self.items = []
    def push(self, x):
        self.items.append(x)
        return self
    def pop(self):
        if not self.items:
            raise IndexError("empty")
        return self.items.pop()
    def __len__(self):
        return len(self.items)
    def __eq__(self, other):
        return isinstance(other, Stack) and self.items == other.items
class Account:
    def __init__(self, b):
        self.balance = b
    def withdraw(self, n):
        if n > self.balance:
            raise Insufficient("no money")
        self.balance -= n
def words(t):
    return Counter(t.split())
def squares(n):
    for i in range(n):
        yield i * i
def sort_in_place(xs):
    xs.sort()
def area(r):
    return math.pi * r * r
def exact():
    return Fraction(1, 3), Decimal("1.10"), 2 ** 200, float("nan"), b"xy", {(1, 2): {3}}
def bye():
    raise SystemExit(3)
def decode_it(raw):
    return raw.decode("ascii")
LIMIT = 10
"""
HONEST_TESTS = [
    "s = Stack(); s.push(1).push(2); assert s.pop() == 2 and len(s) == 1",
    "assert Stack().push(1) == Stack().push(1) and Stack().push(1) != Stack().push(2)",
    "a = Account(5)\ntry:\n    a.withdraw(10)\n    assert False\nexcept Insufficient:\n    pass\nassert a.balance == 5",
    "try:\n    Account(1).withdraw(2)\nexcept ValueError as e:\n    assert str(e) == 'no money'",
    "assert words('a b a') == {'a': 2, 'b': 1} and Point(1, 2) == (1, 2)",
    "assert isinstance(Stack(), Stack) and not isinstance(3, Stack)\nassert issubclass(Insufficient, ValueError)",
    "assert list(squares(4)) == [0, 1, 4, 9] and sum(squares(3)) == 5",
    "xs = [3, 1, 2]; sort_in_place(xs); assert xs == [1, 2, 3]",
    "assert abs(area(1) - math.pi) < 1e-9 and LIMIT == 10",
    "try:\n    decode_it(b'\\xff')\nexcept ValueError:\n    pass\nassert decode_it(b'ok') == 'ok'",
    "f, d, big, nan, raw, nested = exact()\n"
    "assert (f, d, big, raw, nested) == (Fraction(1, 3), Decimal('1.10'), 2 ** 200, b'xy', {(1, 2): {3}})\n"
    "assert nan != nan",
]


@needs_isolation
async def test_honest_programs_keep_their_python_semantics() -> None:
    grader = build_grader({"type": "code", "timeout_s": 10})
    tests = [
        "from fractions import Fraction\nfrom decimal import Decimal\n" + HONEST_TESTS[-1],
        *HONEST_TESTS[:-1],
        "Stack().pop()",
        "bye()",
        "try:\n    bye()\nexcept Exception:\n    pass",
    ]
    g = await grader.grade(PROGRAM, {"tests": tests})
    assert g.reason == (
        "3/14 tests failed: test 11 `Stack().pop()`: IndexError: empty; test 12 `bye()`: SystemExit: 3; "
        "test 13 `try: bye() except Exception: pass`: SystemExit: 3"
    )
