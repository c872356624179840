"""The two programs the code grader runs for each item, each in its own sandbox, joined by one socket.

`program` loads the model's program and answers requests on its objects (call `add`, get an
attribute, iterate); it holds nothing that decides a grade. `checker` runs the unit tests: the
names the program defines are proxies in the tests' namespace, every answer crosses the socket as
plain data (numbers, strings, lists, dicts, ...), the tests compare it in the checker's own
interpreter, and the verdict goes to a file descriptor that only the checker holds. Whatever the
program does to its own interpreter (patch builtins or `exec`, override `__eq__`, exit early, print
or write fake reports, kill its parent) changes only the answers it gives, never the checks.

An object that is not plain data stays in the program and is reached through a proxy: its
methods, attributes, items, length, truth and iteration are the program's to answer, but it is
never compared with the tests' data (that would let an object that "equals everything" pass);
two of the program's objects compare by the program's own `__eq__`.

Runs as `python -I -c <this file's text> program|checker ...`: standard library only, no project
imports, and the same text on both sides so that both speak one wire format.
"""

from __future__ import annotations

import binascii
import builtins
import importlib
import json
import numbers
import operator
import os
import resource
import sys

MAX_MESSAGE = 8 * 1024 * 1024
MAX_DEPTH = 64
_COMPARE = {
    "eq": operator.eq,
    "ne": operator.ne,
    "lt": operator.lt,
    "le": operator.le,
    "gt": operator.gt,
    "ge": operator.ge,
}


def set_limits(memory_mb: int, cpu_s: int, max_procs: int, fsize: int) -> None:
    """Limits set by this trusted prologue inside the sandbox (so RLIMIT_NPROC counts the sandbox's
    own user namespace, not every process of the runner's user)."""
    for which, value in (
        (resource.RLIMIT_AS, memory_mb * 1024 * 1024),
        (resource.RLIMIT_CPU, cpu_s),
        (resource.RLIMIT_NPROC, max_procs),
        (resource.RLIMIT_FSIZE, fsize),
        (resource.RLIMIT_CORE, 0),
        (resource.RLIMIT_NOFILE, 256),
    ):
        resource.setrlimit(which, (value, value))
    if hasattr(sys, "set_int_max_str_digits"):
        sys.set_int_max_str_digits(100_000)


# -- the wire format: JSON values, with tagged objects for what JSON lacks ---------------------


def encode(value, ref, depth: int = 0):
    """Plain data as JSON; anything else through `ref` (a proxy id, or a TypeError)."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value is nested deeper than {MAX_DEPTH} levels")
    down = depth + 1
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, str):
        return str.__str__(value)  # an exact str, whatever subclass the program made
    if isinstance(value, int):
        return int.__index__(value)
    if isinstance(value, float):
        return float.__float__(value)
    if isinstance(value, (list, tuple, set, frozenset)):
        items = [encode(v, ref, down) for v in value]
        kind = next(k for k in (list, tuple, frozenset, set) if isinstance(value, k))
        return items if kind is list else {"$" + kind.__name__: items}
    if isinstance(value, dict):
        return {"$dict": [[encode(k, ref, down), encode(v, ref, down)] for k, v in value.items()]}
    if isinstance(value, (bytes, bytearray)):
        kind = "$bytearray" if isinstance(value, bytearray) else "$bytes"
        return {kind: binascii.b2a_base64(bytes(value), newline=False).decode("ascii")}
    decimal, fractions = sys.modules.get("decimal"), sys.modules.get("fractions")  # none if never imported
    if decimal and isinstance(value, decimal.Decimal):
        return {"$decimal": str(value)}
    if fractions and isinstance(value, fractions.Fraction):
        return {"$fraction": [value.numerator, value.denominator]}
    if isinstance(value, numbers.Complex) and not isinstance(value, numbers.Real):
        return {"$complex": [complex(value).real, complex(value).imag]}
    if isinstance(value, numbers.Integral):  # numpy integers and the like
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    return ref(value)


_TAGS = {"$tuple": tuple, "$set": set, "$frozenset": frozenset}


def decode(obj, ref, depth: int = 0):
    """The inverse of `encode`; `ref` turns {"$ref": id, "$type": name} into an object."""
    if depth > MAX_DEPTH:
        raise ValueError(f"the value is nested deeper than {MAX_DEPTH} levels")
    down = depth + 1
    if obj is None or type(obj) in (bool, int, float, str):
        return obj
    if type(obj) is list:
        return [decode(v, ref, down) for v in obj]
    if type(obj) is dict and "$ref" in obj:
        return ref(obj)
    if type(obj) is not dict or len(obj) != 1:
        raise ValueError("malformed value")
    ((tag, body),) = obj.items()
    if tag in _TAGS:
        return _TAGS[tag](decode(v, ref, down) for v in body)
    if tag == "$dict":
        return {decode(k, ref, down): decode(v, ref, down) for k, v in body}
    if tag in ("$bytes", "$bytearray"):
        raw = binascii.a2b_base64(body.encode("ascii"))
        return bytearray(raw) if tag == "$bytearray" else raw
    if tag == "$decimal":
        return importlib.import_module("decimal").Decimal(str(body))
    if tag == "$fraction":
        return importlib.import_module("fractions").Fraction(int(body[0]), int(body[1]))
    if tag == "$complex":
        return complex(float(body[0]), float(body[1]))
    raise ValueError(f"unknown tag {tag[:20]!r}")


class Channel:
    """Newline-delimited JSON over a stream socket, one message per line, lines capped in size.
    (Plain file objects on the descriptor: the socket module would add to every start-up.)"""

    def __init__(self, fd: int):
        self.rfile = open(fd, "rb", closefd=False)
        self.wfile = open(fd, "wb", buffering=0, closefd=False)

    def send(self, message: dict) -> None:
        data = memoryview(json.dumps(message, separators=(",", ":")).encode() + b"\n")
        while data:
            data = data[self.wfile.write(data) :]

    def recv(self) -> dict:
        line = self.rfile.readline(MAX_MESSAGE + 1)
        if not line:
            raise EOFError
        if len(line) > MAX_MESSAGE:
            raise ValueError(f"a message over {MAX_MESSAGE >> 20} MiB")
        message = json.loads(line)
        if type(message) is not dict:
            raise ValueError("a message that is not an object")
        return message


def _text(exc: BaseException) -> str:
    try:
        detail = str(exc)
    except BaseException:
        detail = ""
    return (type(exc).__name__ + (": " + detail if detail else ""))[:300]


# -- the program's side -------------------------------------------------------------------------


class _Objects:
    """The program's objects the checker holds proxies to, by id."""

    def __init__(self) -> None:
        self.by_id: list = []

    def ref(self, value) -> dict:
        self.by_id.append(value)
        return {"$ref": len(self.by_id) - 1, "$type": type(value).__name__[:100]}

    def get(self, ref) -> object:
        ident = ref.get("$ref") if type(ref) is dict else None
        if type(ident) is not int or not 0 <= ident < len(self.by_id):
            raise ValueError("unknown object")
        return self.by_id[ident]


def _export(value, objects: _Objects):
    """A name the program defines: its exception classes and modules by name, the rest as values."""
    if isinstance(value, type) and issubclass(value, BaseException):
        return {"$exception": [c.__name__ for c in value.__mro__]}
    if isinstance(value, type(sys)):
        return {"$module": str(getattr(value, "__name__", "")), "proxy": objects.ref(value)}
    try:  # small data by value; a program's 1 GB table stays where it is, behind a proxy
        if not hasattr(value, "__len__") or len(value) <= 1000:
            small = encode(value, objects.ref)
            if len(json.dumps(small)) <= 64 * 1024:
                return small
    except Exception:
        pass
    return objects.ref(value)


def _describe(exc: BaseException) -> dict:
    return {"mro": [c.__name__ for c in type(exc).__mro__][:20], "text": _text(exc)}


def _act(message: dict, objects: _Objects):
    """Carry out one request on the program's objects; returns the value and copied-back args."""
    op, target = message["op"], objects.get(message["ref"])
    arg = lambda name: decode(message[name], objects.get)  # noqa: E731
    if op == "call":
        args = [decode(a, objects.get) for a in message["args"]]
        kwargs = {k: decode(v, objects.get) for k, v in message["kwargs"]}
        value = target(*args, **kwargs)
        changed = [*enumerate(args), *kwargs.items()]
        mutable = (list, dict, set, bytearray)
        return value, [[k, encode(v, objects.ref)] for k, v in changed if isinstance(v, mutable)]
    actions = {
        "getattr": lambda: getattr(target, message["name"]),
        "setattr": lambda: setattr(target, message["name"], arg("value")),
        "getitem": lambda: target[arg("key")],
        "setitem": lambda: target.__setitem__(arg("key"), arg("value")),
        "delitem": lambda: target.__delitem__(arg("key")),
        "len": lambda: len(target),
        "bool": lambda: bool(target),
        "str": lambda: str(target),
        "repr": lambda: repr(target),
        "iter": lambda: iter(target),
        "next": lambda: next(target),
        "compare": lambda: _COMPARE[message["how"]](target, objects.get(message["other"])),
        "isinstance": lambda: isinstance(arg("value"), target),
        "issubclass": lambda: issubclass(arg("value"), target),
    }
    return actions[op](), []


def program_main(fd: int, memory_mb: int, cpu_s: int, max_procs: int, fsize: int) -> None:
    set_limits(memory_mb, cpu_s, max_procs, fsize)
    channel, objects = Channel(fd), _Objects()
    code = channel.recv()["code"]
    namespace = {"__name__": "solution", "__builtins__": builtins}
    try:
        exec(compile(code, "solution.py", "exec"), namespace)
        names = {
            k: _export(v, objects)
            for k, v in list(namespace.items())
            if not (k.startswith("__") and k.endswith("__"))
        }
    except BaseException as exc:
        channel.send({"raise": _describe(exc)})
        return
    channel.send({"names": names})
    while True:
        try:
            message = channel.recv()
        except EOFError:
            return
        try:
            value, after = _act(message, objects)
            reply = {"id": message.get("id"), "ok": encode(value, objects.ref), "after": after}
        except BaseException as exc:
            reply = {"id": message.get("id"), "raise": _describe(exc)}
        channel.send(reply)


# -- the checker's side -------------------------------------------------------------------------

_PROTOCOL_ERRORS = (
    OSError,
    ValueError,
    TypeError,
    LookupError,
    AttributeError,
    ArithmeticError,
    RecursionError,
    MemoryError,
)


class ProgramGone(BaseException):
    """The program exited, or broke the protocol; every later call fails the same way.
    A BaseException, so that a test's `except Exception` cannot swallow it."""


class ProgramExit(BaseException):
    """The program raised SystemExit, KeyboardInterrupt or GeneratorExit in a call."""


class Client:
    """The checker's end of the socket: one request, one reply, in order."""

    def __init__(self, channel: Channel):
        self.channel, self.gone, self.count = channel, None, 0
        self.exceptions: dict[str, type] = {}
        self.notes: list[str] = []

    def request(self, op: str, target: "Remote", **fields):
        if self.gone:
            raise ProgramGone(self.gone)
        self.count += 1
        try:
            self.channel.send({"op": op, "ref": {"$ref": target._Remote__id}, "id": self.count, **fields})
            reply = self.channel.recv()
            if reply.get("id") != self.count:
                raise ValueError("a reply to another request")
            if "raise" in reply:
                raised = self.exception(reply["raise"])
            else:
                return decode(reply["ok"], self.remote), list(reply.get("after") or [])
        except EOFError:
            self.gone = "the program exited"
        except _PROTOCOL_ERRORS as exc:
            self.gone = f"the program broke the protocol ({_text(exc)})"
        if self.gone:
            raise ProgramGone(self.gone)
        raise raised

    def remote(self, obj: dict) -> "Remote":
        if type(obj.get("$ref")) is not int:
            raise ValueError("malformed object reference")
        return Remote(self, obj["$ref"], str(obj.get("$type"))[:100])

    def exception(self, described: dict) -> BaseException:
        """An exception the program raised, as a class the tests can catch by name."""
        mro, text = [str(n) for n in described["mro"]], str(described["text"])
        message = text.split(": ", 1)[1] if ": " in text else ""
        for name in mro:
            cls = self.exceptions.get(name) or getattr(builtins, name, None)
            if not (isinstance(cls, type) and issubclass(cls, BaseException)):
                continue
            if not issubclass(cls, Exception):
                return ProgramExit(text)
            try:
                return cls(message)
            except Exception:  # UnicodeDecodeError and the like need more than a message
                continue
        return ProgramExit(text)

    def exception_class(self, name: str, mro: list) -> type:
        bases = [getattr(builtins, n, None) for n in mro]
        base = next((b for b in bases if isinstance(b, type) and issubclass(b, Exception)), Exception)
        cls = type(name, (base,), {"__module__": "solution"})
        self.exceptions[name] = cls
        return cls

    def encode_arg(self, value):
        def ref(obj):
            if isinstance(obj, Remote) and obj._Remote__client is self:
                return {"$ref": obj._Remote__id}
            raise TypeError(
                f"a test can pass the program only plain data or the program's own objects, "
                f"not a {type(obj).__name__}"
            )

        return encode(value, ref)


def _copy_back(original, value) -> None:
    """Make a test's list/dict/set argument show what the program did to it."""
    if isinstance(original, (list, bytearray)) and isinstance(value, (list, bytearray)):
        original[:] = value
    elif isinstance(original, (dict, set)) and type(value) is type(original):
        original.clear()
        original.update(value)


class Remote:
    """A proxy for an object that lives in the program."""

    __slots__ = ("_Remote__client", "_Remote__id", "_Remote__type")

    def __init__(self, client: Client, ident: int, type_name: str):
        object.__setattr__(self, "_Remote__client", client)
        object.__setattr__(self, "_Remote__id", ident)
        object.__setattr__(self, "_Remote__type", type_name)

    def _ask(self, op: str, **fields):
        return self.__client.request(op, self, **fields)[0]

    def __call__(self, *args, **kwargs):
        c = self.__client
        value, after = c.request(
            "call",
            self,
            args=[c.encode_arg(a) for a in args],
            kwargs=[[k, c.encode_arg(v)] for k, v in kwargs.items()],
        )
        for key, new in after:
            original = args[key] if type(key) is int and 0 <= key < len(args) else kwargs.get(key)
            _copy_back(original, decode(new, c.remote))
        return value

    def __getattr__(self, name):
        return self._ask("getattr", name=name)

    def __setattr__(self, name, value):
        self._ask("setattr", name=name, value=self.__client.encode_arg(value))

    def __getitem__(self, key):
        return self._ask("getitem", key=self.__client.encode_arg(key))

    def __setitem__(self, key, value):
        c = self.__client
        self._ask("setitem", key=c.encode_arg(key), value=c.encode_arg(value))

    def __delitem__(self, key):
        self._ask("delitem", key=self.__client.encode_arg(key))

    def __len__(self):
        return _typed(self._ask("len"), int, "len()")

    def __bool__(self):
        return _typed(self._ask("bool"), bool, "bool()")

    def __iter__(self):
        return self._ask("iter")

    def __next__(self):
        return self._ask("next")

    def __str__(self):
        return _typed(self._ask("str"), str, "str()")

    def __repr__(self):
        return _typed(self._ask("repr"), str, "repr()")

    def __hash__(self):
        return hash((Remote, self.__id))

    def __instancecheck__(self, value):  # isinstance(x, AProgramClass)
        return _typed(self._ask("isinstance", value=self.__client.encode_arg(value)), bool, "isinstance()")

    def __subclasscheck__(self, value):
        return _typed(self._ask("issubclass", value=self.__client.encode_arg(value)), bool, "issubclass()")

    def _compare(self, other, how: str):
        if isinstance(other, Remote) and other.__client is self.__client:
            return self._ask("compare", how=how, other={"$ref": other.__id})
        self.__client.notes.append(
            f"the program gave a {self.__type} object where the test compared it with a "
            f"{type(other).__name__}; only plain data compares with a test's values"
        )
        return NotImplemented

    def __eq__(self, other):
        return self._compare(other, "eq")

    def __ne__(self, other):
        return self._compare(other, "ne")

    def __lt__(self, other):
        return self._compare(other, "lt")

    def __le__(self, other):
        return self._compare(other, "le")

    def __gt__(self, other):
        return self._compare(other, "gt")

    def __ge__(self, other):
        return self._compare(other, "ge")


def _typed(value, kind: type, what: str):
    if type(value) is not kind:
        raise TypeError(f"the program's {what} gave a {type(value).__name__}, not a {kind.__name__}")
    return value


def _load(client: Client, code: str) -> dict:
    """The program's names as plain values, exception classes and proxies."""
    client.channel.send({"code": code})
    reply = client.channel.recv()
    if "raise" in reply:
        raise RuntimeError(str(reply["raise"]["text"]))
    names = {}
    stdlib = getattr(sys, "stdlib_module_names", ())
    for name, value in reply["names"].items():
        if type(name) is not str or hasattr(builtins, name) or name.startswith("__"):
            continue  # a program's `round` or `sorted` must not answer for the tests' built-ins
        if name in stdlib and _module(name) is not None:
            names[name] = _module(name)  # nor a program's class called `math` for the real one
        elif type(value) is dict and "$exception" in value:
            names[name] = client.exception_class(name, value["$exception"])
        elif type(value) is dict and "$module" in value:
            names[name] = _module(str(value["$module"])) or client.remote(value["proxy"])
        else:
            names[name] = decode(value, client.remote)
    return names


def _module(name: str):
    """The checker's own import of a module the program imported (a program's `math` could be
    anything), or None when it cannot be imported here."""
    if not name or name == "__main__" or name.startswith("."):
        return None
    try:
        return importlib.import_module(name)
    except BaseException:
        return None


def checker_main(fd: int, report_fd: int) -> None:
    spec = json.load(sys.stdin)
    set_limits(**spec["limits"])
    report = os.fdopen(report_fd, "w", buffering=1)
    client = Client(Channel(fd))
    emit = lambda **fields: report.write(json.dumps(fields) + "\n")  # noqa: E731
    try:
        names = _load(client, spec["code"])
    except RuntimeError as exc:
        return emit(load_error=f"program raised {exc}")
    except EOFError:
        return emit(load_error="the program exited before it finished loading")
    except _PROTOCOL_ERRORS as exc:
        return emit(load_error=f"the program broke the protocol while loading ({_text(exc)})")
    namespace = {"__name__": "tests", "__builtins__": builtins, **names}
    for i, test in enumerate(spec["tests"]):
        client.notes.clear()
        try:
            exec(compile(test, f"test_{i}", "exec"), namespace)
            emit(test=i, ok=True)
        except BaseException as exc:
            why = str(exc) if isinstance(exc, (ProgramGone, ProgramExit)) else _text(exc)
            why += f" ({client.notes[0]})" if client.notes else ""
            emit(test=i, ok=False, why=why[:400])
    emit(done=True)


if __name__ == "__main__":  # `probe`: the sandbox's interpreter can run this file
    role, numbers_ = sys.argv[1], [int(a) for a in sys.argv[2:]]
    if role != "probe":
        (program_main if role == "program" else checker_main)(*numbers_)
