"""`routeopt bench replay`: send logged traffic again, open loop, at its recorded pace times a speed.

Each arrival (`routeopt.evals.selfhost.arrivals`) goes at its offset / speed, whether or not earlier
requests have answered (open loop: a slow server meets the load it would really meet, as in
GuideLLM's and vLLM's rate modes, but with the team's own arrivals and lengths). `max_tokens` is
the recorded output length. OpenAI-compatible and Anthropic candidates are called over HTTP with
a lean client (`routeopt.evals.selfhost.wire`), `local` candidates through their serving engine (the
provider's continuous batcher) in a process of its own. Definitions are the serving benchmark's (vLLM's):
TTFT to the first content chunk, TPOT, inter-token latency (the gaps), end-to-end latency.

The generator measures itself: each request's lateness (when it was handed to the socket minus
when it was due; never negative: a send waits until its time has come). A replay whose sends
fell behind (lateness p99 above `max_lateness_s`, or a send rate under 98% of the offered one) is
marked `generator_limited`: its latencies describe this machine, not the server, and the report
says so instead of showing them. An endpoint that stops answering (connection refused or timed
out `down_after` times in a row, with no answer since) gets no more requests: the rest of its
arrivals are recorded as not sent, and the result is marked partial, with what was measured kept.

Queueing delay is estimated: a request's TTFT minus the model's median TTFT over requests that
found nothing else of that model in flight (the unloaded TTFT); unknown when there were none.
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Sequence

import numpy as np

from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request
from routeopt.evals.selfhost.arrivals import Arrival, synthesize
from routeopt.evals.selfhost.wire import Endpoint

QUANTILES = (50, 95, 99)
DOWN_KINDS = frozenset({"connection", "timeout"})


@dataclass
class Sent:
    """One arrival as replayed; times in seconds from the replay's start."""

    index: int
    model: str
    where: str
    due_s: float
    input_tokens: int
    max_tokens: int
    sent_s: float | None = None
    first_s: float | None = None
    end_s: float | None = None
    ok: bool = False
    error_kind: str | None = None  # a ProviderError kind, "not_sent" or "cancelled"
    output_tokens: int | None = None
    reported_input_tokens: int | None = None
    gaps: list[float] = field(default_factory=list)
    in_flight: int = 0  # requests of this model in flight when it was sent (itself excluded)

    @property
    def lateness_s(self) -> float | None:
        return None if self.sent_s is None else self.sent_s - self.due_s

    @property
    def ttft_s(self) -> float | None:
        return None if self.first_s is None or self.sent_s is None else self.first_s - self.sent_s

    @property
    def e2e_s(self) -> float | None:
        return None if self.end_s is None or self.sent_s is None or not self.ok else self.end_s - self.sent_s

    @property
    def tpot_s(self) -> float | None:
        if self.ttft_s is None or self.e2e_s is None or not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e_s - self.ttft_s) / (self.output_tokens - 1)


@dataclass(frozen=True)
class Slo:
    ttft_s: float | None = None
    latency_s: float | None = None
    min_good: float = 0.9  # share of requests that must meet the targets

    def good(self, r: Sent) -> bool:
        return (
            r.ok
            and (self.ttft_s is None or (r.ttft_s is not None and r.ttft_s <= self.ttft_s))
            and (self.latency_s is None or (r.e2e_s is not None and r.e2e_s <= self.latency_s))
        )


# -- senders -----------------------------------------------------------------------------------


class _HttpSender:
    """OpenAI Chat Completions or Anthropic Messages, streamed, over `wire.Endpoint`."""

    def __init__(self, candidate: Any) -> None:
        self.candidate, self.anthropic = candidate, candidate.provider == "anthropic"
        key = candidate.api_key() or "not-needed"
        if self.anthropic:
            base = candidate.base_url or "https://api.anthropic.com"
            headers = {"x-api-key": key, "anthropic-version": "2023-06-01"}
            self.path = "/v1/messages"
        else:
            base = candidate.base_url or "https://api.openai.com/v1"
            headers = {"Authorization": f"Bearer {key}"}
            self.path = "/chat/completions"
        self.endpoint = Endpoint(base, headers)
        self.where = base

    def payload(self, text: str, max_tokens: int) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.candidate.model,
            "max_tokens": max_tokens,
            "stream": True,
            "messages": [{"role": "user", "content": text}],
            "temperature": 0,
        }
        if not self.anthropic:
            body["stream_options"] = {"include_usage": True}
        return body

    def start(self, rec: Sent, text: str, t0: float) -> Any:
        """Send now when a connection is idle; the rest (reading the answer) is `send`'s."""
        marks: dict[str, float] = {}
        payload = self.payload(text, rec.max_tokens)
        conn = self.endpoint.send_now(self.path, payload, marks)
        if conn is not None:
            rec.sent_s = marks["sent"] - t0
        return payload, marks, conn

    async def send(self, rec: Sent, text: str, t0: float, started: Any = None) -> None:
        payload, marks, conn = started or self.start(rec, text, t0)
        last = None
        finished = False
        async for line in self.endpoint.stream(self.path, payload, marks, conn):
            if rec.sent_s is None:
                rec.sent_s = marks["sent"] - t0
            if not line.startswith(b"data:"):
                continue
            data = line[5:].strip()
            if data == b"[DONE]":  # read on to the body's end: the connection is then reused
                continue
            event = json.loads(data)
            piece, done = self._event(event, rec)
            finished = finished or done
            if piece:
                now = time.perf_counter() - t0
                if rec.first_s is None:
                    rec.first_s = now
                else:
                    rec.gaps.append(now - last)  # type: ignore[operator]
                last = now
        if rec.sent_s is None:
            rec.sent_s = marks["sent"] - t0
        if not finished:
            raise ProviderError("truncated_stream", "the stream ended without its finish event")

    def _event(self, e: dict, rec: Sent) -> tuple[str | None, bool]:
        """(content piece, whether this event finishes the answer); usage goes into `rec`."""
        if self.anthropic:
            kind = e.get("type")
            if kind == "message_start":
                u = (e.get("message") or {}).get("usage") or {}
                rec.reported_input_tokens = u.get("input_tokens")
            elif kind == "content_block_delta":
                return (e.get("delta") or {}).get("text"), False
            elif kind == "message_delta":
                rec.output_tokens = (e.get("usage") or {}).get("output_tokens", rec.output_tokens)
            elif kind == "message_stop":
                return None, True
            elif kind == "error":
                raise ProviderError("server_error", f"error event: {str(e.get('error'))[:200]}")
            return None, False
        if e.get("usage"):
            rec.output_tokens = e["usage"].get("completion_tokens")
            rec.reported_input_tokens = e["usage"].get("prompt_tokens")
        choices = e.get("choices") or []
        if not choices:
            return None, False
        c = choices[0]
        return (c.get("delta") or {}).get("content"), bool(c.get("finish_reason"))

    def close(self) -> None:
        self.endpoint.close()


class _LocalSender:
    """A `local` candidate through its serving engine, in a process of its own: the model's
    compute must not share the generator's interpreter (its lock would delay the sends). The
    engine (the provider's continuous batcher) measures TTFT and the gaps as the runner does;
    both processes read the same monotonic clock, so the answer's times line up with the send."""

    def __init__(self, candidate: Any, cpus: set[int] | None = None) -> None:
        self.candidate, self.where, self.cpus = candidate, f"local:{candidate.name}", cpus
        self.conn: Any = None
        self.proc: Any = None
        self.waiting: dict[int, asyncio.Future] = {}
        self.ids = iter(range(1 << 62))

    def _start(self) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self._writer(self.conn)
        self.proc = ctx.Process(
            target=serve_local,
            args=(self.candidate, child, self.cpus),
            daemon=True,
            name=f"routeopt-replay-{self.candidate.name}",
        )
        self.proc.start()
        child.close()
        asyncio.get_running_loop().add_reader(self.conn.fileno(), self._answers)

    def _writer(self, conn: Any) -> None:
        """Requests go to the engine from a thread of their own. A full pipe must never stop the
        event loop, which reads the engine's answers: with the loop blocked sending while the
        engine blocked sending answers back, a replay under overload waited forever."""
        import queue
        import threading

        self.outbox: queue.SimpleQueue = queue.SimpleQueue()

        def write() -> None:
            while True:
                item = self.outbox.get()
                try:
                    conn.send(item)
                except (OSError, ValueError):  # the engine or the pipe is gone: its waiters fail on the loop
                    return
                if item is None:
                    return

        self.writing = threading.Thread(
            target=write, name=f"routeopt-replay-{self.candidate.name}-send", daemon=True
        )
        self.writing.start()

    def _answers(self) -> None:
        try:
            while self.conn.poll():
                i, reply = self.conn.recv()
                fut = self.waiting.pop(i, None)
                if fut is not None and not fut.done():
                    fut.set_result(reply)
        except (EOFError, OSError):  # the engine process died: every waiting request fails
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
            for fut in self.waiting.values():
                if not fut.done():
                    fut.set_exception(ProviderError("connection", f"{self.where}: the engine process exited"))
            self.waiting.clear()

    def start(self, rec: Sent, text: str, t0: float) -> Any:
        if self.conn is None:
            return None
        i = next(self.ids)
        self.waiting[i] = asyncio.get_running_loop().create_future()
        sent = time.perf_counter()
        self.outbox.put((i, text, rec.max_tokens))
        rec.sent_s = sent - t0
        return i

    async def send(self, rec: Sent, text: str, t0: float, started: Any = None) -> None:
        if self.conn is None:
            self._start()
        i = started if started is not None else self.start(rec, text, t0)
        fut = self.waiting[i]
        try:
            reply = await fut
        finally:
            self.waiting.pop(i, None)
        if not reply["ok"]:
            raise ProviderError(reply["kind"], reply["message"])
        if reply["ttft"] is not None:
            rec.first_s = reply["received"] - t0 + reply["ttft"]
        rec.gaps = reply["gaps"]
        rec.output_tokens, rec.reported_input_tokens = reply["output_tokens"], reply["input_tokens"]

    def close(self) -> None:
        if self.conn is None:
            return
        try:
            asyncio.get_running_loop().remove_reader(self.conn.fileno())
        except RuntimeError:  # no loop running any more
            pass
        self.outbox.put(None)  # after every request already handed over
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.terminate()
        self.conn.close()


def serve_local(candidate: Any, conn: Any, cpus: set[int] | None = None) -> None:
    """The engine process: requests (id, text, max_tokens) in, timings and token counts out; on
    `cpus` when given (before torch loads, so its threads fit them)."""
    if cpus:
        os.sched_setaffinity(0, cpus)
    from routeopt.evals.providers import make_provider

    provider = make_provider(candidate)

    async def answer(i: int, text: str, max_tokens: int, received: float) -> None:
        request = Request((Message("user", text),), GenerationSettings(max_tokens=max_tokens))
        try:
            c = await provider.generate(request)
            reply = {
                "ok": True,
                "received": received,
                "ttft": c.ttft_s,
                "gaps": list(c.chunk_gaps_s),
                "output_tokens": c.output_tokens,
                "input_tokens": c.input_tokens,
            }
        except ProviderError as exc:
            reply = {"ok": False, "kind": exc.kind, "message": exc.message[:300]}
        except Exception as exc:  # an engine bug costs this request only
            reply = {"ok": False, "kind": "internal", "message": f"{type(exc).__name__}: {exc}"[:300]}
        conn.send((i, reply))

    async def main() -> None:
        loop, done = asyncio.get_running_loop(), asyncio.Event()
        tasks: set[asyncio.Task] = set()

        def incoming() -> None:
            while conn.poll():
                try:
                    msg = conn.recv()
                except EOFError:
                    msg = None
                if msg is None:
                    done.set()
                    loop.remove_reader(conn.fileno())
                    return
                task = loop.create_task(answer(*msg, time.perf_counter()))
                tasks.add(task)
                task.add_done_callback(tasks.discard)

        await provider.prepare()  # the model loads first, so its objects are frozen with the rest
        _freeze_heap()  # this process serves until it exits: nothing to thaw
        loop.add_reader(conn.fileno(), incoming)
        await done.wait()
        await provider.aclose()

    asyncio.run(main())


def make_sender(candidate: Any, cpus: set[int] | None = None) -> Any:
    """The candidate's sender; a `local` engine runs on `cpus` when given (`cpu_split`)."""
    return _LocalSender(candidate, cpus) if candidate.provider == "local" else _HttpSender(candidate)


def cpu_split(local_engines: int) -> tuple[set[int], set[int]] | None:
    """(the generator's CPU, the local engines' CPUs) when engines run here and this process may
    use two CPUs or more; else None. Unpinned on 2 cores, the engine process's two threads (its
    event loop and the batcher) and the generator's move between the cores, passing the
    engine's interpreter lock across them: at 1,600 requests/s the engine completed a median
    993 requests/s unpinned and 1,086 pinned, over 10 probes each; both spread by about 20%,
    which is the machine's (`benchmarks/replay_pinning.py`)."""
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if local_engines == 0 or len(allowed) < 2:
        return None
    return {allowed[0]}, set(allowed[1:])


@contextmanager
def pinned(cpus: set[int] | None) -> Iterator[None]:
    """This thread (and the threads and processes it starts) on `cpus` within the block."""
    if not cpus:
        yield
        return
    before = os.sched_getaffinity(0)
    os.sched_setaffinity(0, cpus)
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)


async def warm_up(senders: dict[str, Any], arrivals: Sequence[Arrival], n: int) -> None:
    """`n` unmeasured requests per candidate, one after another, shaped like its first arrivals
    (the local provider loads its model then; HTTP connections open)."""
    for model, sender in senders.items():
        mine = [a for a in arrivals if a.model == model][: max(n, 0)]
        for i, a in enumerate(mine):
            rec = Sent(-1 - i, model, "warm-up", 0.0, a.input_tokens, a.output_tokens)
            try:
                await sender.send(rec, a.text or synthesize(a.input_tokens, -1 - i), time.perf_counter())
            except (ProviderError, OSError):
                return  # the replay itself will record what the endpoint does


# -- the open loop -----------------------------------------------------------------------------


@dataclass
class ReplayRun:
    speed: float
    records: list[Sent]
    wall_s: float
    status: str  # complete, partial (an endpoint went down) or interrupted
    down: dict[str, str] = field(default_factory=dict)  # model -> why its endpoint was given up


class _Down:
    """Gives an endpoint up after `after` connection or timeout errors in a row."""

    def __init__(self, after: int) -> None:
        self.after, self.streak, self.why = after, 0, None

    def saw(self, r: Sent, where: str) -> None:
        if r.ok:
            self.streak = 0
        elif r.error_kind in DOWN_KINDS:
            self.streak += 1
            if self.streak >= self.after and self.why is None:
                self.why = (
                    f"{where} stopped answering at {r.sent_s or 0:.1f} s into the replay: "
                    f"{self.streak} {r.error_kind} errors in a row; its remaining arrivals "
                    "were not sent"
                )


SPIN_S = 0.001  # the selector's timeout has millisecond steps (rounded up): the last one is
# waited by yielding to the loop, which keeps answering requests meanwhile


async def _until(due: float) -> None:
    """Return at `due` (perf_counter), never before it, and as little after as the loop allows."""
    now = time.perf_counter()
    if due - now > SPIN_S:
        await asyncio.sleep(due - now - SPIN_S)
    while time.perf_counter() < due:
        await asyncio.sleep(0)


async def replay_once(
    arrivals: Sequence[Arrival],
    speed: float,
    senders: dict[str, Any],
    *,
    timeout_s: float = 60.0,
    down_after: int = 20,
    stop: asyncio.Event | None = None,
    lead_s: float = 0.05,
) -> ReplayRun:
    """Send every arrival at offset / speed (never before), wait for the answers, return them."""
    records = [
        Sent(i, a.model, a.where, a.offset_s / speed, a.input_tokens, a.output_tokens)
        for i, a in enumerate(arrivals)
    ]
    texts = [a.text or synthesize(a.input_tokens, i) for i, a in enumerate(arrivals)]  # before the clock
    down = {m: _Down(down_after) for m in senders}
    in_flight = dict.fromkeys(senders, 0)
    tasks: set[asyncio.Task] = set()
    fresh = _freeze_heap()
    try:
        t0 = time.perf_counter() + lead_s

        async def one(r: Sent, text: str, started: Any, attempt: float) -> None:
            sender = senders[r.model]
            try:
                async with asyncio.timeout(timeout_s):
                    await sender.send(r, text, t0, started)
                r.ok = True
            except TimeoutError:
                r.error_kind = "timeout"
            except ProviderError as exc:
                r.error_kind = exc.kind
            except asyncio.CancelledError:
                r.error_kind = "cancelled"
            except Exception:  # a malformed answer or a sender bug costs this request only
                r.error_kind = "bad_response"
            finally:
                in_flight[r.model] -= 1
                r.end_s = time.perf_counter() - t0
                if r.sent_s is None:  # refused before the request went out: it was attempted then
                    r.sent_s = attempt
                down[r.model].saw(r, sender.where)

        for r in records:
            await _until(t0 + r.due_s)
            if stop is not None and stop.is_set():
                break
            if down[r.model].why is not None:
                r.error_kind = "not_sent"
                continue
            text = texts[r.index]
            attempt = time.perf_counter() - t0
            r.in_flight = in_flight[r.model]
            in_flight[r.model] += 1
            try:
                started = senders[r.model].start(r, text, t0)  # written now if a connection is idle
            except OSError:
                started = None
            task = asyncio.ensure_future(one(r, text, started, attempt))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        interrupted = stop is not None and stop.is_set()
        if interrupted:
            for task in list(tasks):
                task.cancel()
        if tasks:
            await asyncio.gather(*list(tasks), return_exceptions=True)
        for r in records:
            if r.sent_s is None and r.error_kind is None:
                r.error_kind = "not_sent"
        gone = {m: d.why for m, d in down.items() if d.why}
        status = "interrupted" if interrupted else "partial" if gone else "complete"
        return ReplayRun(speed, records, time.perf_counter() - t0, status, gone)  # type: ignore[arg-type]
    finally:
        if fresh:
            gc.unfreeze()


def _freeze_heap() -> bool:
    """Leave every object made so far (this probe's records and prompts, each earlier probe's
    results) out of garbage collection while the probe runs; True when nothing was frozen before,
    so the caller unfreezes. A sweep keeps every probe's records, so a full collection walked more
    of them at each probe and its pause made the generator late in overloaded probes (send
    lateness p99 80 to 230 ms): the generator's figure, not the server's."""
    gc.collect()
    fresh = gc.get_freeze_count() == 0
    gc.freeze()
    return fresh


# -- figures -----------------------------------------------------------------------------------


def _q(values: Sequence[float]) -> dict[str, float] | None:
    if not len(values):
        return None
    arr = np.asarray(values, dtype=float)
    return {f"p{q}": float(np.percentile(arr, q)) for q in QUANTILES} | {"max": float(arr.max())}


def _busiest(records: Sequence[Sent], window_s: float) -> float:
    """Output tokens per second in the busiest window of completed answers."""
    ends = sorted((r.end_s, r.output_tokens or 0) for r in records if r.ok and r.end_s is not None)
    if not ends:
        return 0.0
    best, lo, total = 0, 0, 0
    for t, n in ends:
        total += n
        while ends[lo][0] < t - window_s:
            total -= ends[lo][1]
            lo += 1
        best = max(best, total)
    span = min(window_s, max(ends[-1][0] - ends[0][0], 1e-9))
    return best / span


def summarize(
    records: Sequence[Sent], speed: float, slo: Slo, *, max_lateness_s: float = 0.010, window_s: float = 60.0
) -> dict[str, Any]:
    """The figures of one model's (or every model's) requests at one speed (pure)."""
    sent = [r for r in records if r.sent_s is not None]
    ok = [r for r in sent if r.ok]
    schedule = max((r.due_s for r in records), default=0.0)
    send_span = (max(r.sent_s for r in sent) - min(r.sent_s for r in sent)) if len(sent) > 1 else 0.0
    offered = (len(records) - 1) / schedule if schedule > 0 else None
    achieved = (len(sent) - 1) / send_span if send_span > 0 else None
    lateness = _q([r.lateness_s for r in sent])
    errors: dict[str, int] = {}
    for r in records:
        if r.error_kind:
            errors[r.error_kind] = errors.get(r.error_kind, 0) + 1
    wall = max((r.end_s or 0.0 for r in records), default=0.0) or 1e-9
    unloaded = [r.ttft_s for r in ok if r.in_flight == 0 and r.ttft_s is not None]
    base = float(np.median(unloaded)) if unloaded else None
    limited = bool(lateness and lateness["p99"] > max_lateness_s) or bool(
        offered and achieved is not None and achieved < 0.98 * offered
    )
    good = sum(slo.good(r) for r in records)
    targets = slo.ttft_s is not None or slo.latency_s is not None
    return {
        "speed": speed,
        "arrivals": len(records),
        "sent": len(sent),
        "completed": len(ok),
        "errors": sum(errors.values()),
        "error_kinds": errors,
        "offered_rps": offered,
        "achieved_rps": achieved,
        "completed_rps": len(ok) / wall,
        "goodput_rps": good / wall if targets else None,
        "good_share": good / len(records) if targets and records else None,
        "ttft_s": _q([r.ttft_s for r in ok if r.ttft_s is not None]),
        "tpot_s": _q([r.tpot_s for r in ok if r.tpot_s is not None]),
        "itl_s": _q([g for r in ok for g in r.gaps]),
        "e2e_s": _q([r.e2e_s for r in ok]),
        "queue_s": _q([max(0.0, r.ttft_s - base) for r in ok if r.ttft_s is not None])
        if base is not None
        else None,
        "lateness_s": lateness,
        "in_flight_max": max((r.in_flight for r in sent), default=0) + (1 if sent else 0),
        "peak_output_tok_s": _busiest(records, window_s),
        "output_tok_s": sum(r.output_tokens or 0 for r in ok) / wall,
        "mean_input_tokens": float(np.mean([r.input_tokens for r in records])) if records else None,
        "mean_output_tokens": float(np.mean([r.output_tokens or 0 for r in ok])) if ok else None,
        "generator_limited": limited,
        "meets_slo": (
            not limited
            and not errors.get("not_sent")
            and (good / len(records) >= slo.min_good if records else False)
        ),
    }


def summaries(run: ReplayRun, slo: Slo, max_lateness_s: float, window_s: float) -> dict[str, dict]:
    """Per model and overall (`*`)."""
    out = {"*": summarize(run.records, run.speed, slo, max_lateness_s=max_lateness_s, window_s=window_s)}
    for model in sorted({r.model for r in run.records}):
        out[model] = summarize(
            [r for r in run.records if r.model == model],
            run.speed,
            slo,
            max_lateness_s=max_lateness_s,
            window_s=window_s,
        )
    if run.status != "complete":  # partial: the overall verdict cannot be a pass
        out["*"]["meets_slo"] = False
    return out


async def sweep(
    run_at: Callable[[float], Any],
    speeds: Sequence[float] | None,
    *,
    start: float = 1.0,
    max_speed: float = 64.0,
    steps: int = 3,
    halvings: int = 6,
    probes: int = 3,
) -> list[tuple[ReplayRun, dict]]:
    """Given speeds, each once; else double from `start` until the SLO breaks (or the generator
    cannot keep up), or, when `start` already breaks it, halve (at most `halvings` times) until a
    speed meets it; then bisect `steps` times between the last speed that met it and the first
    that did not. `run_at(speed)` replays and returns (run, summaries).

    Each speed's verdict is the majority of up to `probes` probes (stopping once it is decided):
    near the break, two probes of one speed on a shared machine can land on either side of it
    (good 0.78 then 1.000 at one speed), and a single probe, or the best of two, let one such
    flip move the whole bisection. Every probe is in the result."""
    done: list[tuple[ReplayRun, dict]] = []
    if speeds:
        for s in speeds:
            done.append(await run_at(s))
        return done
    need = max(1, probes) // 2 + 1

    async def meets(speed: float) -> bool:
        yes = no = 0
        while yes < need and no < need:
            done.append(await run_at(speed))
            if done[-1][1]["*"]["meets_slo"]:
                yes += 1
            else:
                no += 1
        return yes >= need

    good, bad, s = None, None, start
    while s <= max_speed:
        if not await meets(s):
            bad = s
            break
        good, s = s, s * 2
    for _ in range(halvings if good is None and bad is not None else 0):
        s = round(bad / 2, 6)  # type: ignore[operator]
        if await meets(s):
            good = s
            break
        bad = s
    for _ in range(steps if good is not None and bad is not None else 0):
        mid = round((good + bad) / 2, 3)  # type: ignore[operator]
        if await meets(mid):
            good = mid
        else:
            bad = mid
    return done


def verdicts(results: Sequence[tuple[ReplayRun, dict]]) -> dict[float, bool]:
    """Each speed's verdict: met when more than half of its probes met the SLO (a tie is not)."""
    votes: dict[float, list[bool]] = {}
    for run, s in results:
        votes.setdefault(run.speed, []).append(bool(s["*"]["meets_slo"]))
    return {speed: 2 * sum(v) > len(v) for speed, v in votes.items()}


def highest_meeting(results: Sequence[tuple[ReplayRun, dict]]) -> float | None:
    """The highest speed whose verdict (`verdicts`) is that it met the SLO."""
    met = [speed for speed, ok in verdicts(results).items() if ok]
    return max(met) if met else None


def lowest_breaking(results: Sequence[tuple[ReplayRun, dict]]) -> float | None:
    """The lowest speed above the highest that met the SLO whose verdict is that it broke it."""
    best = highest_meeting(results)
    broke = [speed for speed, ok in verdicts(results).items() if not ok and (best is None or speed > best)]
    return min(broke) if broke else None


def disagreement(results: Sequence[tuple[ReplayRun, dict]]) -> tuple[float, float] | None:
    """(the lowest speed at which any probe broke the SLO, the highest at which any met it) when
    the first is not above the second, else None: the speeds where the probes disagree. On a
    shared machine this band is as wide as the machine's speed moved during the sweep: the error
    bar of `lowest_breaking`, which a single number hides."""
    broke = [run.speed for run, s in results if not s["*"]["meets_slo"]]
    met = [run.speed for run, s in results if s["*"]["meets_slo"]]
    if not broke or not met or min(broke) > max(met):
        return None
    return min(broke), max(met)
