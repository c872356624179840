"""A fake LLM server on 127.0.0.1 that speaks the real OpenAI and Anthropic wire protocols.

The real `openai` and `anthropic` SDKs talk to it over HTTP/1.1, so streaming, error mapping and
retries are exercised for real. It implements `POST /v1/chat/completions` (plain JSON and SSE
`data:` chunks with `stream_options.include_usage`, a final usage chunk and `data: [DONE]`) and
`POST /v1/messages` (plain JSON and the message_start ... message_stop event stream). With
`stream_as_json` it answers stream requests with the plain JSON body, as LiteLLM's proxy does.

The "model" is deterministic: an answer table keyed by the last user message, else
`default_answer` (arithmetic like "What is 3 + 4?" -> "7", otherwise "echo: <text>"), so tests can
check graded correctness. Token usage counts whitespace-separated words, so tests can tell reported
usage from the client's chars/4 estimate.

Prompt caching is reported in the real usage fields. OpenAI caches by itself: a request whose
system prompt (else first message) was seen before reports it in
`usage.prompt_tokens_details.cached_tokens`. Anthropic caches only up to blocks marked with
`cache_control`: the longest marked prefix seen before is a read (`cache_read_input_tokens`),
the rest up to the last mark is written (`cache_creation_input_tokens`), and `input_tokens`
counts only the remainder, as the Messages API does.

Faults are chosen per request, either by a prompt marker `[[fault:NAME]]` (always) or
`[[fault:NAME*N]]` (only the first N attempts of that prompt), or by a seeded mix of
probabilities that depends only on (seed, prompt, attempt number) - so a run is reproducible
whatever the order in which concurrent requests arrive. Every request is recorded as it arrived
(headers, credentials included, body, fault), so tests assert on what was sent: that a key
reached the server, and (searching every output for it) nowhere else.

Run it in its own process with `python -m tests.fake_llm --mix rate_limit=0.1 --seed 1`; it prints
`PORT <n>` and serves `GET /_fake/requests` so another process can read the records.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import re
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

from tests.fake_llm_wire import (
    _STATUS_FAULTS,
    _anthropic_events,
    _anthropic_plain,
    _Drop,
    _Http,
    _openai_events,
    _openai_plain,
    _read_request,
    _send_error,
    _send_json,
    _send_raw,
    _send_sse,
)

FAULTS: tuple[str, ...] = (
    "rate_limit",  # 429 with Retry-After
    "server_error",  # 500
    "unavailable",  # 503
    "overloaded",  # 529 (Anthropic's overload status)
    "auth",  # 401
    "bad_request",  # 400
    "drop",  # connection closed: before the response, or mid-stream after the first token
    "hang",  # no answer for `hang_s` (the client's timeout should fire first)
    "malformed",  # 200 with a body (or one SSE event) that is not JSON
    "truncated",  # stream ends cleanly without finish chunk / [DONE]; plain: body cut short
    "slow_first",  # `slow_first_s` before the first token, then a normal answer
    "empty",  # a complete answer with empty content
    "no_choices",  # 200 whose JSON has no choices / no content
)
MARKER = re.compile(r"\[\[fault:([a-z_]+)(?:\*(\d+))?\]\]")
_ARITH = re.compile(r"(-?\d+)\s*([-+*])\s*(-?\d+)")


def count_tokens(text: str) -> int:
    """The fake model's tokenizer: whitespace words (deliberately not chars/4)."""
    return len(text.split())


def default_answer(prompt: str) -> str:
    """Deterministic model: solve `a op b` if present, else echo the prompt."""
    m = _ARITH.search(prompt)
    if m:
        a, op, b = int(m.group(1)), m.group(2), int(m.group(3))
        return str(a + b if op == "+" else a - b if op == "-" else a * b)
    return f"echo: {MARKER.sub('', prompt).strip()}"


def fails_odd_answers(prompt: str) -> str:
    """A weak model: "0" where the right answer is odd; any other prompt (a preflight probe) as
    `default_answer`."""
    answer = default_answer(prompt)
    return "0" if answer.lstrip("-").isdigit() and int(answer) % 2 else answer


@dataclass
class FaultPlan:
    """Which fault (if any) a request gets: prompt markers first, else a seeded mix."""

    mix: dict[str, float] = field(default_factory=dict)
    seed: int = 0
    retry_after_s: float = 0.05
    retry_after_header: str = "retry-after"  # or "retry-after-ms"
    slow_first_s: float = 0.3
    hang_s: float = 30.0

    def __post_init__(self) -> None:
        unknown = set(self.mix) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        if sum(self.mix.values()) > 1.0 + 1e-9:
            raise ValueError("fault probabilities add up to more than 1")

    def choose(self, prompt: str, attempt: int) -> str | None:
        m = MARKER.search(prompt)
        if m:
            limit = int(m.group(2)) if m.group(2) else None
            return m.group(1) if limit is None or attempt <= limit else None
        if not self.mix:
            return None
        digest = hashlib.sha256(f"{self.seed}|{attempt}|{prompt}".encode()).digest()
        r = random.Random(digest).random()
        acc = 0.0
        for name, p in sorted(self.mix.items()):
            acc += p
            if r < acc:
                return name
        return None


@dataclass
class RecordedRequest:
    method: str
    path: str
    headers: dict[str, str]
    body: Any
    fault: str | None
    attempt: int
    t: float


def _prompt_of(path: str, body: dict) -> str:
    parts: list[str] = []
    system = body.get("system")
    if isinstance(system, str):
        parts.append(system)
    elif isinstance(system, list):
        parts.extend(b.get("text", "") for b in system if isinstance(b, dict))
    for msg in body.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, list):
            content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
        parts.append(str(content or ""))
    return "\n".join(parts)


def _parts(body: dict) -> list[tuple[str, bool]]:
    """(text, marked with cache_control) for the system blocks, then each message."""
    out: list[tuple[str, bool]] = []
    system = body.get("system")
    if isinstance(system, str):
        out.append((system, False))
    elif isinstance(system, list):
        out += [(b.get("text", ""), "cache_control" in b) for b in system if isinstance(b, dict)]
    for msg in body.get("messages") or []:
        content = msg.get("content")
        if isinstance(content, list):
            blocks = [b for b in content if isinstance(b, dict)]
            out.append(
                ("".join(b.get("text", "") for b in blocks), any("cache_control" in b for b in blocks))
            )
        else:
            out.append((str(content or ""), False))
    return out


def _marked_prefixes(body: dict) -> list[list[tuple[str, bool]]]:
    """The request's prefixes that end at a `cache_control` mark, shortest first."""
    parts = _parts(body)
    return [parts[: i + 1] for i, (_, marked) in enumerate(parts) if marked]


def _last_user(body: dict) -> str:
    for msg in reversed(body.get("messages") or []):
        if msg.get("role") == "user":
            content = msg.get("content")
            if isinstance(content, list):
                content = "".join(b.get("text", "") for b in content if isinstance(b, dict))
            return MARKER.sub("", str(content or "")).strip()
    return ""


class FakeLLM:
    """The server. Tests may change `faults`, `answers`, `usage`, delays, between calls."""

    def __init__(
        self,
        *,
        faults: FaultPlan | None = None,
        answers: dict[str, str] | None = None,
        answer_fn: Callable[[str], str] = default_answer,
        usage: bool = True,
        prompt_cache: bool = True,
        first_token_delay_s: float = 0.0,
        token_delay_s: float = 0.0,
        expect_api_key: str | None = None,
        stream_as_json: bool = False,
    ):
        self.faults = faults or FaultPlan()
        self.answers = dict(answers or {})
        self.answer_fn = answer_fn
        self.usage = usage
        self.prompt_cache = prompt_cache
        self.first_token_delay_s = first_token_delay_s
        self.token_delay_s = token_delay_s
        self.expect_api_key = expect_api_key
        # Answer stream requests with the plain JSON body (Content-Type: application/json), as
        # LiteLLM's proxy does for Anthropic; faults then act on that body.
        self.stream_as_json = stream_as_json
        self.port: int | None = None
        self._records: list[RecordedRequest] = []
        self._attempts: dict[str, int] = {}
        self._seen_prefixes: set[str] = set()
        self._lock = threading.Lock()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._server: asyncio.base_events.Server | None = None
        self._thread: threading.Thread | None = None
        self._conns: set[asyncio.Task] = set()

    # --- lifecycle -------------------------------------------------------------------------

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def openai_base_url(self) -> str:
        return self.url + "/v1"

    @property
    def anthropic_base_url(self) -> str:
        return self.url

    async def serve(self, port: int = 0) -> None:
        """Start listening on the running loop (for in-process or subprocess use)."""
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_server(self._on_conn, "127.0.0.1", port, backlog=1024)
        self.port = self._server.sockets[0].getsockname()[1]

    def start(self) -> "FakeLLM":
        """Serve from a daemon thread with its own event loop; returns once listening."""
        ready = threading.Event()

        def main() -> None:
            loop = asyncio.new_event_loop()
            asyncio.set_event_loop(loop)
            loop.run_until_complete(self.serve())
            ready.set()
            loop.run_forever()
            loop.close()

        self._thread = threading.Thread(target=main, name="fake-llm", daemon=True)
        self._thread.start()
        if not ready.wait(10):
            raise RuntimeError("fake LLM server did not start")
        return self

    def stop(self) -> None:
        loop = self._loop
        if loop is None or self._thread is None:
            return

        async def shutdown() -> None:
            assert self._server is not None
            self._server.close()
            for task in list(self._conns):
                task.cancel()
            await asyncio.gather(*self._conns, return_exceptions=True)
            loop.stop()

        asyncio.run_coroutine_threadsafe(shutdown(), loop)
        self._thread.join(10)

    def __enter__(self) -> "FakeLLM":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # --- records ---------------------------------------------------------------------------

    @property
    def requests(self) -> list[RecordedRequest]:
        with self._lock:
            return list(self._records)

    def settle(self, sent: int, timeout_s: float = 60.0) -> list[RecordedRequest]:
        """The records once the server has read `sent` requests (or `timeout_s` passed). A client
        that gave up on a call has still sent it, and on a busy machine this server's thread may
        read it only after the client has moved on: counts are compared after it catches up."""
        deadline = time.monotonic() + timeout_s
        while len(records := self.requests) < sent and time.monotonic() < deadline:
            time.sleep(0.05)
        return records

    def reset(self) -> None:
        with self._lock:
            self._records.clear()
            self._attempts.clear()
            self._seen_prefixes.clear()

    # --- HTTP/1.1 ----------------------------------------------------------------------------

    async def _on_conn(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._conns.add(task)
        try:
            while True:
                req = await _read_request(reader)
                if req is None:
                    break
                await self._dispatch(req, writer)
        except _Drop:
            writer.transport.abort()
            return
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.CancelledError):
            pass
        finally:
            self._conns.discard(task)
        writer.close()

    async def _dispatch(self, req: _Http, writer: asyncio.StreamWriter) -> None:
        if req.method == "GET" and req.path == "/_fake/requests":
            await _send_json(writer, 200, [asdict(r) for r in self.requests])
            return
        if req.method == "POST" and req.path == "/_fake/reset":
            self.reset()
            await _send_json(writer, 200, {"ok": True})
            return
        # The real routes only: a base URL with a wrong path gets the 404 a real server sends.
        kind = {"/v1/chat/completions": "openai", "/v1/messages": "anthropic"}.get(req.path.split("?")[0])
        if req.method != "POST" or kind is None:
            await _send_json(writer, 404, {"error": {"message": f"no route {req.path}"}})
            return
        try:
            body = json.loads(req.body or b"{}")
        except json.JSONDecodeError:
            await _send_error(writer, kind, 400, "bad_request", "request body is not JSON")
            return
        prompt = _prompt_of(req.path, body)
        with self._lock:
            attempt = self._attempts[prompt] = self._attempts.get(prompt, 0) + 1
        fault = self.faults.choose(prompt, attempt)
        with self._lock:
            self._records.append(
                RecordedRequest(req.method, req.path, dict(req.headers), body, fault, attempt, time.time())
            )
        if self.expect_api_key is not None and self._key(req) != self.expect_api_key:
            # Echo the key back, worse than real APIs do, so tests can check redaction.
            await _send_error(
                writer, kind, 401, "authentication_error", f"Incorrect API key provided: {self._key(req)}"
            )
            return
        await self._respond(writer, kind, body, fault)

    @staticmethod
    def _key(req: _Http) -> str | None:
        if "x-api-key" in req.headers:
            return req.headers["x-api-key"]
        auth = req.headers.get("authorization", "")
        return auth[7:] if auth.lower().startswith("bearer ") else None

    # --- the model -------------------------------------------------------------------------

    def _answer(self, body: dict) -> str:
        user = _last_user(body)
        return self.answers[user] if user in self.answers else self.answer_fn(user)

    def _complete(self, body: dict, kind: str, fault: str | None) -> tuple[list[str], str, dict]:
        """Token pieces, the finish reason and usage numbers for this request."""
        answer = "" if fault == "empty" else self._answer(body)
        stops = body.get("stop") or body.get("stop_sequences") or []
        stops = [stops] if isinstance(stops, str) else stops
        stopped = False
        for s in stops:
            if s and s in answer:
                answer, stopped = answer[: answer.index(s)], True
        pieces = re.findall(r"\S+\s*", answer) or ([answer] if answer else [])
        max_tokens = int(body.get("max_tokens") or body.get("max_completion_tokens") or 1 << 30)
        length = len(pieces) > max_tokens
        pieces = pieces[:max_tokens]
        if kind == "openai":
            finish = "length" if length else "stop"
        else:
            finish = "max_tokens" if length else "stop_sequence" if stopped else "end_turn"
        prompt = _prompt_of("", body)
        read, written = self._anthropic_cache(body) if kind == "anthropic" else (self._openai_cache(body), 0)
        usage = {"input": count_tokens(prompt), "cached": read, "written": written, "output": len(pieces)}
        return pieces, finish, usage

    def _openai_cache(self, body: dict) -> int:
        """Automatic caching: the system prompt (else first message) seen before is a read."""
        prefix = str(body.get("system") or (body.get("messages") or [{}])[0].get("content", ""))
        with self._lock:
            cached = count_tokens(prefix) if self.prompt_cache and prefix in self._seen_prefixes else 0
            self._seen_prefixes.add(prefix)
        return cached

    def _anthropic_cache(self, body: dict) -> tuple[int, int]:
        """(read, written) tokens: prefixes end at `cache_control` marks only."""
        if not self.prompt_cache:
            return 0, 0
        prefixes = ["\n".join(text for text, _ in parts) for parts in _marked_prefixes(body)]
        if not prefixes:
            return 0, 0
        with self._lock:
            hit = next((p for p in reversed(prefixes) if ("anthropic", p) in self._seen_prefixes), "")
            self._seen_prefixes.update(("anthropic", p) for p in prefixes)
        read = count_tokens(hit)
        return read, count_tokens(prefixes[-1]) - read

    async def _respond(self, writer: asyncio.StreamWriter, kind: str, body: dict, fault: str | None) -> None:
        plan = self.faults
        if fault in _STATUS_FAULTS:
            status, etype = _STATUS_FAULTS[fault]
            extra = {}
            if fault == "rate_limit":
                ra = plan.retry_after_s
                value = f"{ra * 1000:g}" if plan.retry_after_header == "retry-after-ms" else f"{ra:g}"
                extra = {plan.retry_after_header: value}
            await _send_error(writer, kind, status, etype, f"injected fault: {fault}", extra)
            return
        stream = bool(body.get("stream")) and not self.stream_as_json
        if fault == "drop" and not stream:
            raise _Drop()
        if fault == "hang":
            await asyncio.sleep(plan.hang_s)
            raise _Drop()
        delay = self.first_token_delay_s + (plan.slow_first_s if fault == "slow_first" else 0.0)
        try:
            pieces, finish, usage = self._complete(body, kind, fault)
        except Exception as exc:  # a test's answer_fn that does not fit this prompt: say so
            await _send_error(writer, kind, 500, "api_error", f"answer_fn failed: {exc!r}")
            return
        if not stream:
            if delay:
                await asyncio.sleep(delay)
            await self._respond_plain(writer, kind, body, fault, pieces, finish, usage)
            return
        events = (_openai_events if kind == "openai" else _anthropic_events)(
            body, pieces, finish, usage, self.usage
        )
        bad = (
            b'data: {"choices": [{"delta": {"content": "x"\n\n'
            if kind == "openai"
            else b'event: content_block_delta\ndata: {"type": "content_block_delta", "ind\n\n'
        )
        await _send_sse(writer, events, fault, delay, self.token_delay_s, bad)

    async def _respond_plain(self, writer, kind, body, fault, pieces, finish, usage) -> None:
        if fault == "malformed":
            await _send_raw(writer, 200, b'{"id": "x", "choices": [{"index": 0, "mess', "application/json")
            return
        payload = (_openai_plain if kind == "openai" else _anthropic_plain)(
            body, "".join(pieces), finish, usage, self.usage
        )
        if fault == "no_choices":
            payload.pop("choices" if kind == "openai" else "content", None)
            if kind == "openai":
                payload["choices"] = []
        data = json.dumps(payload).encode()
        if fault == "truncated":
            head = f"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: {len(data)}\r\n\r\n"
            writer.write(head.encode() + data[: len(data) // 2])
            await writer.drain()
            raise _Drop()
        await _send_raw(writer, 200, data, "application/json")


# --- a server in its own process ------------------------------------------------------------


class FakeLLMProcess:
    """The server in a subprocess (no shared GIL); records are read over HTTP."""

    def __init__(self, *args: str):
        self.args = args
        self.proc: subprocess.Popen | None = None
        self.port: int | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    openai_base_url = property(lambda self: self.url + "/v1")
    anthropic_base_url = property(lambda self: self.url)

    def start(self) -> "FakeLLMProcess":
        repo = Path(__file__).resolve().parents[1]
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(repo), os.environ.get("PYTHONPATH")])),
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "tests.fake_llm", *self.args],
            stdout=subprocess.PIPE,
            text=True,
            cwd=repo,
            env=env,
        )
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line.startswith("PORT "):
            self.stop()
            raise RuntimeError(f"fake LLM process did not start: {line!r}")
        self.port = int(line.split()[1])
        return self

    def requests(self) -> list[dict]:
        import httpx

        return httpx.get(self.url + "/_fake/requests", timeout=30).json()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def __enter__(self) -> "FakeLLMProcess":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _parse_mix(text: str) -> dict[str, float]:
    out = {}
    for part in filter(None, text.split(",")):
        name, _, p = part.partition("=")
        out[name.strip()] = float(p)
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="fake OpenAI/Anthropic server")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--mix", default="", help="e.g. rate_limit=0.1,drop=0.05")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-usage", action="store_true")
    ap.add_argument("--first-token-delay", type=float, default=0.0)
    ap.add_argument("--token-delay", type=float, default=0.0)
    ap.add_argument(
        "--stream-as-json",
        action="store_true",
        help="answer stream requests with one JSON body (as LiteLLM's proxy does)",
    )
    a = ap.parse_args(argv)
    server = FakeLLM(
        faults=FaultPlan(_parse_mix(a.mix), a.seed),
        usage=not a.no_usage,
        first_token_delay_s=a.first_token_delay,
        token_delay_s=a.token_delay,
        stream_as_json=a.stream_as_json,
    )

    async def run() -> None:
        await server.serve(a.port)
        print(f"PORT {server.port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


def write_arithmetic_suite(
    folder: Path,
    n: int,
    *,
    name: str = "arith",
    tags: Callable[[int], str] | None = None,
    temperature: float = 0.0,
    system: str | None = "Answer with the number only.",
) -> Path:
    """Write an n-item suite (jsonl + yaml) the fake model answers correctly; returns the yaml.

    `tags(i)` adds text to item i's prompt, e.g. a fault marker `[[fault:drop*1]]`.
    """
    folder.mkdir(parents=True, exist_ok=True)
    rows = [
        {"id": f"q{i:05d}", "a": i, "b": 2 * i + 1, "answer": 3 * i + 1, "tag": tags(i) if tags else ""}
        for i in range(n)
    ]
    (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    spec = {
        "name": name,
        "dataset": {"path": f"{name}.jsonl", "id_field": "id"},
        "prompt": {
            "template": "What is {{ a }} + {{ b }}? {{ tag }}",
            **({"system": system} if system else {}),
        },
        "generation": {"max_tokens": 16, "temperature": temperature},
        "grader": {"type": "numeric", "target": "{{ answer }}"},
    }
    path = folder / f"{name}.yaml"
    path.write_text(json.dumps(spec, indent=1))  # JSON is YAML
    return path


def write_two_model_config(
    path: Path,
    strong: "FakeLLM",
    weak: "FakeLLM",
    *,
    key_envs: tuple[str, str],
    weak_protocol: str = "anthropic",
    db: str = "out/routeopt.duckdb",
    out: str = "out",
    router: dict | None = None,
) -> Path:
    """A routeopt config (JSON is YAML) with a dear `strong` OpenAI candidate and a cheap `weak`
    one speaking `weak_protocol` (their keys' variables: `key_envs`), suites in `suites/` beside
    it; returns `path`."""
    weak_url = weak.anthropic_base_url if weak_protocol == "anthropic" else weak.openai_base_url
    cfg = {
        "candidates": [
            {
                "name": "strong",
                "provider": "openai",
                "model": "big",
                "base_url": strong.openai_base_url,
                "input_price_per_mtok": 10.0,
                "output_price_per_mtok": 30.0,
                "api_key_env": key_envs[0],
            },
            {
                "name": "weak",
                "provider": weak_protocol,
                "model": "small",
                "base_url": weak_url,
                "input_price_per_mtok": 0.5,
                "output_price_per_mtok": 1.5,
                "api_key_env": key_envs[1],
            },
        ],
        "suites_dir": "suites",
        "db_path": db,
        "registry_dir": f"{out}/registry",
        "cache_dir": f"{out}/cache",
        **({"router": router} if router else {}),
    }
    path.write_text(json.dumps(cfg))
    return path


# --- pytest fixtures (import them into conftest.py) -----------------------------------------

try:
    import pytest
except ImportError:  # pragma: no cover - the module also runs as a plain script
    pytest = None  # type: ignore[assignment]

if pytest is not None:

    @pytest.fixture
    def fake_llm() -> Iterator[FakeLLM]:
        """A fresh fake server in a thread, for one test."""
        with FakeLLM() as server:
            yield server

    @pytest.fixture
    def fake_llm_process() -> Iterator[FakeLLMProcess]:
        """A fake server in its own process (default behaviour, no faults)."""
        with FakeLLMProcess() as server:
            yield server

    @pytest.fixture
    def fake_candidate(fake_llm: FakeLLM) -> Callable[..., Any]:
        """Factory: `fake_candidate("openai"|"anthropic", **fields)` -> a Candidate on `fake_llm`."""
        from routeopt.evals.config import Candidate

        def make(provider: str = "openai", **overrides: Any) -> Candidate:
            base = fake_llm.openai_base_url if provider == "openai" else fake_llm.anthropic_base_url
            spec = dict(
                name=f"fake-{provider}",
                provider=provider,
                model=f"fake-{provider}-model",
                base_url=base,
                input_price_per_mtok=1.0,
                output_price_per_mtok=2.0,
                timeout_s=10.0,
                max_retries=3,
            )
            spec.update(overrides)
            return Candidate(**spec)

        return make


if __name__ == "__main__":
    main()
