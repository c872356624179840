"""The fake LLM server with provider Batch APIs, on the real wire protocols.

OpenAI: `POST /v1/files` (multipart, purpose=batch), `GET /v1/files/{id}/content`,
`POST /v1/batches`, `GET /v1/batches[/{id}]`, `POST /v1/batches/{id}/cancel`; a batch goes
validating -> in_progress -> finalizing -> completed, `phase_s` seconds each (observed when
polled), and answers as an output file and an error file of JSONL lines, shuffled.
Anthropic: `POST /v1/messages/batches`, `GET /v1/messages/batches[/{id}]`,
`GET /v1/messages/batches/{id}/results` (JSONL, shuffled), `POST .../cancel`; in_progress ->
ended. Each answer is what the synchronous routes would say (`FakeLLM._complete`).

Faults, per batch by creation order (`faults={1: {"expire"}}`) or for every batch
(`all_faults`): stuck_validating / stuck_processing (until cancelled; finished lines kept),
stuck_finalizing, expire (half the lines answered, the rest expired), fail_validation (a failed
batch naming line 2), duplicate, missing (one line never reported), bad_json (a line that is not
JSON), unknown_id (a result for a custom_id never sent), poll_5xx (every other poll answers 500, the first included),
gone (the batch id is unknown after creation). `enqueued_token_limit` fails a batch (code
token_limit_exceeded) whose prompt tokens would exceed it with the model's batches in flight.

`billed` counts every answered line per (model, prompt), with the synchronous routes' answers
too (`billed_sync` counts those alone): a test sums it to check that nothing was paid twice.
`python -m tests.fake_batches` serves it in its own process (`GET /_fake/billed`,
`GET /_fake/billed_sync`, `GET /_fake/batches`), judging as
`judging(default_answer)` does.

`judging(answer_fn)` answers judge prompts too (`routeopt.evals.grading.judge`: a rubric that
ends asking for `SCORE: <n>`), for rubrics with a `Question: ...` and a `Reply: ...` line:
`SCORE: 9` when the reply is what `default_answer` says to the question, else `SCORE: 2`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import threading
import time
import uuid
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from tests.fake_llm import FakeLLM, FaultPlan, _prompt_of, count_tokens, default_answer
from tests.fake_llm_wire import (
    _STATUS_FAULTS,
    _anthropic_plain,
    _Http,
    _openai_plain,
    _send_json,
    _send_raw,
)

BATCH_FAULTS = (
    "stuck_validating",
    "stuck_processing",
    "stuck_finalizing",
    "expire",
    "fail_validation",
    "duplicate",
    "missing",
    "bad_json",
    "unknown_id",
    "poll_5xx",
    "gone",
)


_JUDGED = re.compile(r"Question: (?P<question>[^\n]*)\nReply: (?P<reply>[^\n]*)\n")
JUDGE_RUBRIC = "Question: What is {{ a }} + {{ b }}?\nReply: {{ response }}\n"
"""A judge rubric `judging` answers (over the arithmetic suite's fields)."""


def judging(answer_fn: Callable[[str], str] = default_answer) -> Callable[[str], str]:
    """`answer_fn`, but a judge's prompt (one asking for `SCORE:`) is graded: 9 when its reply
    is right, 2 when wrong; a judge prompt without the rubric's lines gets no score."""

    def answer(prompt: str) -> str:
        if "SCORE:" not in prompt:
            return answer_fn(prompt)
        m = _JUDGED.search(prompt)
        if m is None:
            return "There is no reply to grade."
        right = m["reply"].strip() == default_answer(m["question"])
        return f"The reply is {'right' if right else 'wrong'}.\nSCORE: {9 if right else 2}"

    return answer


@dataclass
class _Batch:
    id: str
    kind: str  # openai | anthropic
    lines: list[dict]
    created: float
    faults: set[str]
    model: str
    input_file_id: str | None = None
    metadata: dict = field(default_factory=dict)
    state: str = "validating"
    cancel_at: float | None = None
    done: bool = False
    answered: list[str] = field(default_factory=list)  # result lines (JSON text)
    failed_lines: list[str] = field(default_factory=list)
    errors: list[dict] | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None
    polls: int = 0
    counts: Counter = field(default_factory=Counter)


class FakeBatchLLM(FakeLLM):
    """FakeLLM plus the two Batch APIs."""

    def __init__(
        self,
        *,
        phase_s: float = 0.05,
        faults: dict[int, set[str]] | None = None,
        all_faults: set[str] | None = None,
        enqueued_token_limit: int | None = None,
        seed: int = 0,
        **kwargs: Any,
    ):
        super().__init__(**kwargs)
        self.phase_s = phase_s
        self.batch_faults = {int(k): set(v) for k, v in (faults or {}).items()}
        self.all_faults = set(all_faults or ())
        self.enqueued_token_limit = enqueued_token_limit
        self.rng = random.Random(seed)
        self.files: dict[str, bytes] = {}
        self.batches: dict[str, _Batch] = {}
        self.billed: Counter = Counter()
        self.billed_sync: Counter = Counter()  # the part of `billed` the synchronous routes answered
        self._batch_lock = threading.RLock()

    # --- routing ---------------------------------------------------------------------------

    async def _dispatch(self, req: _Http, writer: asyncio.StreamWriter) -> None:
        path, m = req.path, req.method
        if m == "GET" and path in ("/_fake/billed", "/_fake/billed_sync"):
            counts = self.billed if path == "/_fake/billed" else self.billed_sync
            await _send_json(writer, 200, [[list(k), n] for k, n in counts.items()])
            return
        if m == "GET" and path == "/_fake/batches":
            with self._batch_lock:
                views = [
                    {
                        "id": b.id,
                        "kind": b.kind,
                        "model": b.model,
                        "n": len(b.lines),
                        "state": b.state,
                        "faults": sorted(b.faults),
                    }
                    for b in self.batches.values()
                ]
            await _send_json(writer, 200, views)
            return
        parts = path.strip("/").split("/")
        if (
            parts[:2] == ["v1", "files"]
            or parts[:2] == ["v1", "batches"]
            or parts[:3] == ["v1", "messages", "batches"]
        ):
            self._record(req)
            with self._batch_lock:
                status, payload, raw = self._route(m, parts, req)
            if raw is not None:
                await _send_raw(writer, status, raw, "application/octet-stream")
            else:
                await _send_json(writer, status, payload)
            return
        if m == "POST" and path in ("/v1/chat/completions", "/v1/messages"):
            self._bill_sync(req)
        await super()._dispatch(req, writer)

    def _record(self, req: _Http) -> None:
        from tests.fake_llm import RecordedRequest

        body: Any = None
        if req.body and req.headers.get("content-type", "").startswith("application/json"):
            body = json.loads(req.body)
        with self._lock:
            self._records.append(
                RecordedRequest(req.method, req.path, dict(req.headers), body, None, 1, time.time())
            )

    def _bill_sync(self, req: _Http) -> None:
        try:
            body = json.loads(req.body or b"{}")
        except json.JSONDecodeError:
            return
        prompt = _prompt_of(req.path, body)
        if self.faults.choose(prompt, self._attempts.get(prompt, 0) + 1) is None:
            with self._batch_lock:
                self.billed[(body.get("model"), prompt)] += 1
                self.billed_sync[(body.get("model"), prompt)] += 1

    def _route(self, m: str, parts: list[str], req: _Http) -> tuple[int, Any, bytes | None]:
        if parts[:2] == ["v1", "files"]:
            if m == "POST" and len(parts) == 2:
                if "upload_5xx" in self.all_faults:
                    return 500, _err("injected fault: upload_5xx", "openai"), None
                return 200, self._upload(req), None
            if m == "GET" and len(parts) == 4 and parts[3] == "content":
                data = self.files.get(parts[2])
                return (200, None, data) if data is not None else (404, _err(f"no file {parts[2]}"), None)
            return 404, _err("no route"), None
        kind = "openai" if parts[1] == "batches" else "anthropic"
        rest = parts[2:] if kind == "openai" else parts[3:]
        if m == "POST" and not rest:
            return self._create(kind, json.loads(req.body or b"{}"))
        if m == "GET" and not rest:
            data = [
                self._view(b)
                for b in sorted(self.batches.values(), key=lambda b: -b.created)
                if b.kind == kind
            ]
            return (
                200,
                {
                    "object": "list",
                    "data": data,
                    "has_more": False,
                    "first_id": data[0]["id"] if data else None,
                    "last_id": data[-1]["id"] if data else None,
                },
                None,
            )
        b = self.batches.get(rest[0])
        if b is None or "gone" in b.faults:
            return 404, _err(f"no batch {rest[0]}", kind), None
        if m == "GET" and len(rest) == 1:
            b.polls += 1
            if "poll_5xx" in b.faults and b.polls % 2 == 1:
                return 500, _err("injected fault: poll_5xx", kind), None
            return 200, self._view(b), None
        if m == "POST" and rest[1:] == ["cancel"]:
            if not b.done:
                b.cancel_at = time.time()
            return 200, self._view(b), None
        if m == "GET" and rest[1:] == ["results"] and kind == "anthropic":
            self._advance(b)
            if not b.done:
                return 400, _err("batch has not ended", kind), None
            return 200, None, "".join(line + "\n" for line in b.answered).encode()
        return 404, _err("no route", kind), None

    # --- files and batches -----------------------------------------------------------------

    def _upload(self, req: _Http) -> dict:
        boundary = req.headers["content-type"].split("boundary=", 1)[1].strip('"').encode()
        data = b""
        for part in req.body.split(b"--" + boundary):
            head, _, content = part.partition(b"\r\n\r\n")
            if b'name="file"' in head:
                data = content[:-2] if content.endswith(b"\r\n") else content
        fid = f"file-{uuid.uuid4().hex[:12]}"
        self.files[fid] = data
        return {
            "id": fid,
            "object": "file",
            "bytes": len(data),
            "created_at": int(time.time()),
            "filename": "batch.jsonl",
            "purpose": "batch",
            "status": "processed",
        }

    def _create(self, kind: str, body: dict) -> tuple[int, Any, None]:
        if kind == "openai":
            data = self.files.get(body.get("input_file_id", ""))
            if data is None:
                return 400, _err(f"no file {body.get('input_file_id')}"), None
            lines = [json.loads(x) for x in data.decode().splitlines() if x.strip()]
            model = (lines[0]["body"] if lines else {}).get("model", "")
        else:
            lines = body.get("requests") or []
            model = (lines[0]["params"] if lines else {}).get("model", "")
        n = len(self.batches) + 1
        prefix = "batch" if kind == "openai" else "msgbatch"
        b = _Batch(
            f"{prefix}_{uuid.uuid4().hex[:16]}",
            kind,
            lines,
            time.time(),
            self.batch_faults.get(n, set()) | self.all_faults,
            model,
            body.get("input_file_id"),
            body.get("metadata") or {},
        )
        if kind == "anthropic":
            b.state = "in_progress"
        self.batches[b.id] = b
        return 200, self._view(b), None

    def _tokens(self, b: _Batch) -> int:
        return sum(count_tokens(_prompt_of("", self._body(b, ln))) for ln in b.lines)

    @staticmethod
    def _body(b: _Batch, line: dict) -> dict:
        return line["body"] if b.kind == "openai" else line["params"]

    def _advance(self, b: _Batch) -> None:
        """Move a batch along by the time elapsed (lazily: when it is looked at)."""
        if b.done:
            return
        phase = int((time.time() - b.created) / self.phase_s) if self.phase_s else 9
        f = b.faults
        if b.kind == "openai":
            if b.state == "validating":
                if "fail_validation" in f:
                    return self._fail(
                        b,
                        [
                            {
                                "code": "invalid_request",
                                "line": 2,
                                "param": "body",
                                "message": "missing required parameter 'messages'",
                            }
                        ],
                    )
                limit = self.enqueued_token_limit
                if limit is not None and self._queued(b) + self._tokens(b) > limit:
                    return self._fail(
                        b,
                        [
                            {
                                "code": "token_limit_exceeded",
                                "line": None,
                                "param": None,
                                "message": f"Enqueued token limit reached for {b.model}",
                            }
                        ],
                    )
                if b.cancel_at is not None:
                    return self._end(b, "cancelled")
                if phase >= 1 and "stuck_validating" not in f:
                    b.state = "in_progress"
            if b.state == "in_progress":
                if phase >= 2 and "stuck_processing" not in f:
                    self._process(b, len(b.lines) // 2 if "expire" in f else len(b.lines))
                    if "expire" in f:
                        return self._end(b, "expired")
                    b.state = "finalizing"
                elif b.cancel_at is not None:
                    self._process(b, len(b.lines) // 2)
                    return self._end(b, "cancelled")
            if b.state == "finalizing":
                if b.cancel_at is not None:
                    return self._end(b, "cancelled")
                if phase >= 3 and "stuck_finalizing" not in f:
                    self._end(b, "completed")
        else:
            if b.cancel_at is not None:
                self._process(b, len(b.lines) // 2)
                return self._end(b, "ended")
            if phase >= 2 and "stuck_processing" not in f:
                self._process(b, len(b.lines) // 2 if "expire" in f else len(b.lines))
                self._end(b, "ended")

    def _queued(self, b: _Batch) -> int:
        return sum(
            self._tokens(o)
            for o in self.batches.values()
            if o is not b
            and o.kind == b.kind
            and o.model == b.model
            and not o.done
            and o.created < b.created
            and o.state != "validating"
        )

    def _fail(self, b: _Batch, errors: list[dict]) -> None:
        b.errors = errors
        self._end(b, "failed")

    def _process(self, b: _Batch, n: int) -> None:
        """Answer the first n lines not yet answered (billed), in the synchronous routes' way."""
        done = {json.loads(x)["custom_id"] for x in b.answered if x.startswith("{")}
        for line in b.lines:
            if n <= 0:
                break
            if line["custom_id"] in done:
                continue
            n -= 1
            b.answered.append(json.dumps(self._answer_line(b, line)))

    def _answer_line(self, b: _Batch, line: dict) -> dict:
        body, cid = self._body(b, line), line["custom_id"]
        prompt = _prompt_of("", body)
        fault = self.faults.choose(prompt, 1)
        if fault in _STATUS_FAULTS:
            status, etype = _STATUS_FAULTS[fault]
            b.counts["failed"] += 1
            if b.kind == "openai":
                return {
                    "id": f"req_{cid}",
                    "custom_id": cid,
                    "response": {
                        "status_code": status,
                        "request_id": "r",
                        "body": {"error": {"message": f"injected fault: {fault}", "type": etype}},
                    },
                    "error": None,
                }
            return {
                "custom_id": cid,
                "result": {
                    "type": "errored",
                    "error": {
                        "type": "error",
                        "error": {"type": etype, "message": f"injected fault: {fault}"},
                    },
                },
            }
        pieces, finish, usage = self._complete(body, b.kind, None)
        self.billed[(body.get("model"), prompt)] += 1
        b.counts["completed"] += 1
        if b.kind == "openai":
            payload = _openai_plain(body, "".join(pieces), finish, usage, self.usage)
            return {
                "id": f"req_{cid}",
                "custom_id": cid,
                "response": {"status_code": 200, "request_id": "r", "body": payload},
                "error": None,
            }
        payload = _anthropic_plain(body, "".join(pieces), finish, usage, self.usage)
        return {"custom_id": cid, "result": {"type": "succeeded", "message": payload}}

    def _end(self, b: _Batch, state: str) -> None:
        """Terminal: write the output and error files, with the faults that touch them."""
        answered_ids = {json.loads(x)["custom_id"] for x in b.answered}
        rest = [ln["custom_id"] for ln in b.lines if ln["custom_id"] not in answered_ids]
        word = {"expired": "expired", "cancelled": "cancelled", "failed": None}.get(state)
        if b.kind == "anthropic":
            word = "expired" if "expire" in b.faults and b.cancel_at is None else "canceled"
        lines = list(b.answered)
        if state != "failed":
            for cid in rest:
                if b.kind == "openai":
                    b.failed_lines.append(
                        json.dumps(
                            {
                                "id": f"req_{cid}",
                                "custom_id": cid,
                                "response": None,
                                "error": {
                                    "code": f"batch_{word}",
                                    "message": f"This line was not run: batch {word}",
                                },
                            }
                        )
                    )
                else:
                    lines.append(json.dumps({"custom_id": cid, "result": {"type": word}}))
        if "duplicate" in b.faults and lines:
            lines.append(lines[0])
        if "missing" in b.faults and lines:
            gone = json.loads(lines.pop(0))["custom_id"]
            self.billed_missing = getattr(self, "billed_missing", []) + [gone]
        if "bad_json" in b.faults:
            lines.append('{"custom_id": "r-broken", "response": {"status_code": 200, "bod')
        if "unknown_id" in b.faults:
            never = json.loads(lines[0]) if lines else {"custom_id": "x"}
            never["custom_id"] = "r" + "f" * 40 + "-9"
            lines.append(json.dumps(never))
        self.rng.shuffle(lines)
        b.answered = lines
        b.state, b.done = state, True
        if b.kind == "openai":
            if lines:
                b.output_file_id = f"file-{uuid.uuid4().hex[:12]}"
                self.files[b.output_file_id] = "".join(x + "\n" for x in lines).encode()
            if b.failed_lines:
                b.error_file_id = f"file-{uuid.uuid4().hex[:12]}"
                self.files[b.error_file_id] = "".join(x + "\n" for x in b.failed_lines).encode()

    def _view(self, b: _Batch) -> dict:
        self._advance(b)
        state = b.state
        if b.cancel_at is not None and not b.done:
            state = "cancelling" if b.kind == "openai" else "canceling"
        if b.kind == "openai":
            total = len(b.lines)
            return {
                "id": b.id,
                "object": "batch",
                "endpoint": "/v1/chat/completions",
                "errors": {"object": "list", "data": b.errors} if b.errors else None,
                "input_file_id": b.input_file_id or "",
                "completion_window": "24h",
                "status": state,
                "output_file_id": b.output_file_id,
                "error_file_id": b.error_file_id,
                "created_at": int(b.created),
                "request_counts": {
                    "total": total,
                    "completed": b.counts["completed"],
                    "failed": b.counts["failed"],
                },
                "metadata": b.metadata,
                "model": b.model,
            }
        results = (
            [json.loads(x) for x in b.answered if x.startswith("{") and x.endswith("}")] if b.done else []
        )
        kinds = Counter((r.get("result") or {}).get("type") for r in results)
        processing = 0 if b.done else len(b.lines)
        created = (
            time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(b.created)) + f".{int(b.created % 1 * 1e6):06d}Z"
        )
        return {
            "id": b.id,
            "type": "message_batch",
            "processing_status": state,
            "request_counts": {
                "processing": processing,
                "succeeded": kinds["succeeded"],
                "errored": kinds["errored"],
                "canceled": kinds["canceled"],
                "expired": kinds["expired"],
            },
            "created_at": created,
            "expires_at": created,
            "ended_at": created if b.done else None,
            "cancel_initiated_at": None,
            "archived_at": None,
            "results_url": f"{self.url}/v1/messages/batches/{b.id}/results" if b.done else None,
        }


def _err(message: str, kind: str = "openai") -> dict:
    if kind == "anthropic":
        return {"type": "error", "error": {"type": "not_found_error", "message": message}}
    return {"error": {"message": message, "type": "invalid_request_error", "code": None, "param": None}}


def _parse_faults(text: str) -> dict[int, set[str]]:
    out: dict[int, set[str]] = {}
    for part in filter(None, text.split(";")):
        n, _, names = part.partition("=")
        out[int(n)] = set(filter(None, names.split(",")))
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="fake OpenAI/Anthropic server with Batch APIs")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--phase-s", type=float, default=0.05)
    ap.add_argument("--faults", default="", help="e.g. '1=expire;3=poll_5xx,duplicate'")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    server = FakeBatchLLM(
        phase_s=a.phase_s, faults=_parse_faults(a.faults), seed=a.seed, answer_fn=judging(default_answer)
    )

    async def run() -> None:
        await server.serve(a.port)
        print(f"PORT {server.port}", flush=True)
        await asyncio.Event().wait()

    try:
        asyncio.run(run())
    except KeyboardInterrupt:
        pass


__all__ = ["BATCH_FAULTS", "JUDGE_RUBRIC", "FakeBatchLLM", "FaultPlan", "judging"]

if __name__ == "__main__":
    main()
