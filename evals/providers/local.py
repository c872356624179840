"""The `local` provider: an in-process Hugging Face causal LM (a zoo model or any checkpoint).

Concurrent `generate()` calls are queued and served in batches (continuous feeding: while one
batch runs in a worker thread, new requests wait for the next one). Each batch is left-padded and
decoded with `model.generate`; per-row stopping criteria end each row at its own max_tokens or
stop string. Token counts come from the tokenizer, so they are exact. torch and transformers are
imported on first use and the model loads once, in a thread, on the first request.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from evals.config import Candidate
from evals.providers.base import Completion, ProviderError, Request

DEFAULT_MAX_BATCH = 64


@dataclass
class _Pending:
    request: Request
    future: asyncio.Future
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def key(self) -> tuple:
        s = self.request.settings
        return (s.temperature, s.top_p) if s.temperature > 0 else (0.0, None)


class _StepClock:
    """A logits processor that only timestamps decode steps: step 0 is the first token."""

    def __init__(self) -> None:
        self.times: list[float] = []

    def __call__(self, input_ids: Any, scores: Any) -> Any:
        if not self.times and getattr(scores, "is_cuda", False):
            # A GPU runs behind the host: wait once for the prefill, so TTFT is when the first
            # token exists rather than when its kernels were queued.
            import torch

            torch.cuda.synchronize(scores.device)
        self.times.append(time.perf_counter())
        return scores


class _RowStops:
    """Per-row stopping: each row ends at its own max_tokens or first stop string."""

    def __init__(self, tokenizer: Any, prompt_len: int, limits: list[int],
                 stops: list[tuple[str, ...]]):
        self.tokenizer = tokenizer
        self.prompt_len = prompt_len
        self.limits = limits
        self.stops = stops

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        n_new = input_ids.shape[1] - self.prompt_len
        done = [n_new >= lim for lim in self.limits]
        for i, stops in enumerate(self.stops):
            if stops and not done[i]:
                text = self.tokenizer.decode(input_ids[i, self.prompt_len:],
                                             skip_special_tokens=True)
                done[i] = any(s in text for s in stops)
        return torch.tensor(done, dtype=torch.bool, device=input_ids.device)


_LOAD_LOCK = threading.Lock()


def _resolve_device(requested: str) -> str:
    import torch

    if requested in ("auto", ""):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ProviderError("client_error",
                            f"device {requested!r} requested but CUDA is not available")
    return requested


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else (./x, /x, a/b/c) is a local path."""
    return model.startswith((".", "/", "~")) or model.count("/") > 1 or "\\" in model


class LocalProvider:
    """In-process batched generation for one candidate (checkpoint + variant + device)."""

    def __init__(self, candidate: Candidate, max_batch: int | None = None):
        self.candidate = candidate
        self.max_batch = max_batch or min(candidate.max_concurrency, DEFAULT_MAX_BATCH)
        self._pending: deque[_Pending] = deque()
        self._wakeup: asyncio.Event | None = None
        self._worker: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self.batch_sizes: list[int] = []
        self._model: Any = None
        self._tokenizer: Any = None
        self._device = "cpu"
        self._closed = False

    # ---- loading -------------------------------------------------------------------------
    def _load(self) -> None:
        # One process-wide lock: transformers' lazy imports and meta-device initialisation are
        # not thread-safe, and pairs of several candidates load their models from parallel tasks.
        with _LOAD_LOCK:
            if self._model is not None:
                return
            import torch
            from transformers import AutoModelForCausalLM, AutoTokenizer
            from transformers.utils import logging as hf_logging

            from evals.quantize import QuantizeError, apply_variant

            ref = self.candidate.model
            if _looks_like_path(ref) and not Path(ref).expanduser().exists():
                raise ProviderError("client_error", f"candidate {self.candidate.name!r}: "
                                    f"checkpoint not found: {ref}")
            self._device = _resolve_device(self.candidate.device)
            if self._device == "cpu":
                torch.set_num_threads(int(os.environ.get("ROUTEOPT_TORCH_THREADS", 0))
                                      or min(os.cpu_count() or 1, 4))
            hf_logging.disable_progress_bar()
            # Tied input/output embeddings are reported as a "missing lm_head" load report at
            # warning level; the weights are tied, so keep it out of the run's output.
            verbosity = hf_logging.get_verbosity()
            hf_logging.set_verbosity_error()
            try:
                tok = AutoTokenizer.from_pretrained(ref)
                model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
            except (OSError, ValueError) as exc:
                raise ProviderError("client_error", f"candidate {self.candidate.name!r}: cannot "
                                    f"load checkpoint {ref!r}: {exc}") from None
            finally:
                hf_logging.set_verbosity(verbosity)
            try:
                model = apply_variant(model, self.candidate.variant, self._device)
            except QuantizeError as exc:
                raise ProviderError("client_error",
                                    f"candidate {self.candidate.name!r}: {exc}") from None
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            self._tokenizer, self._model = tok, model.eval()

    # ---- the public protocol --------------------------------------------------------------
    async def prepare(self) -> None:
        """Load the model before the runner starts its clock: loading is not serving time, and
        a GPU-priced candidate's first requests must not pay for it."""
        try:
            await asyncio.to_thread(self._load)
        except ProviderError:
            return  # a missing checkpoint is reported by each call, as an error row

    async def generate(self, request: Request) -> Completion:
        if self._closed:
            raise ProviderError("internal", "local provider is closed")
        if self._model is None:
            await asyncio.to_thread(self._load)
        loop = asyncio.get_running_loop()
        if self._loop is not loop:  # first call, or reused from another event loop
            self._loop, self._wakeup, self._pending = loop, asyncio.Event(), deque()
            self._worker = None
        if self._worker is None or self._worker.done():
            self._worker = loop.create_task(self._serve())
        item = _Pending(request, loop.create_future())
        self._pending.append(item)
        assert self._wakeup is not None
        self._wakeup.set()
        return await item.future

    async def aclose(self) -> None:
        self._closed = True
        if self._worker is not None and self._loop is asyncio.get_running_loop():
            self._worker.cancel()
            try:
                await self._worker
            except asyncio.CancelledError:
                pass
        while self._pending:
            p = self._pending.popleft()
            if not p.future.done():
                p.future.set_exception(ProviderError("internal", "local provider closed"))
        self._model = None

    # ---- batching ---------------------------------------------------------------------------
    def _take_batch(self) -> list[_Pending]:
        """Up to max_batch waiting requests that share sampling settings, oldest first."""
        first = self._pending.popleft()
        batch, rest = [first], deque()
        while self._pending and len(batch) < self.max_batch:
            p = self._pending.popleft()
            (batch if p.key == first.key else rest).append(p)
        rest.extend(self._pending)
        self._pending = rest
        return batch

    async def _serve(self) -> None:
        assert self._wakeup is not None
        while True:
            if not self._pending:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            await asyncio.sleep(0)  # let callers scheduled in the same tick join this batch
            batch = self._take_batch()
            self.batch_sizes.append(len(batch))
            try:
                results = await asyncio.to_thread(self._run_batch, batch)
            except ProviderError as exc:
                results = [exc] * len(batch)
            except Exception as exc:  # a crash inside generate fails this batch, not the loop
                err = ProviderError("internal", f"local generation failed: {exc!r}")
                results = [err] * len(batch)
            now = time.perf_counter()
            for p, res in zip(batch, results):
                if p.future.done():
                    continue
                if isinstance(res, Exception):
                    p.future.set_exception(res)
                else:
                    res.latency_s = now - p.enqueued
                    p.future.set_result(res)

    def _render(self, request: Request) -> str:
        tok = self._tokenizer
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return (tok.bos_token or "") + request.prompt_text

    def _run_batch(self, batch: list[_Pending]) -> list[Completion]:
        import torch
        from transformers import LogitsProcessorList, StoppingCriteriaList

        tok, model = self._tokenizer, self._model
        enc = tok([self._render(p.request) for p in batch], return_tensors="pt", padding=True,
                  add_special_tokens=False).to(self._device)
        width = enc["input_ids"].shape[1]
        limits = [p.request.settings.max_tokens for p in batch]
        clock = _StepClock()
        stops = _RowStops(tok, width, limits, [p.request.settings.stop for p in batch])
        s = batch[0].request.settings
        sampling = {"do_sample": False} if s.temperature == 0 else {
            "do_sample": True, "temperature": s.temperature, "top_p": s.top_p or 1.0}
        with torch.inference_mode():
            out = model.generate(**enc, max_new_tokens=max(limits), pad_token_id=tok.pad_token_id,
                                 eos_token_id=tok.eos_token_id,
                                 logits_processor=LogitsProcessorList([clock]),
                                 stopping_criteria=StoppingCriteriaList([stops]), **sampling)
        new = out[:, width:].tolist()
        in_lens = enc["attention_mask"].sum(dim=1).tolist()
        return [self._completion(p, row, int(n_in), clock.times)
                for p, row, n_in in zip(batch, new, in_lens)]

    def _completion(self, p: _Pending, row: list[int], n_in: int, times: list[float]) -> Completion:
        tok = self._tokenizer
        settings = p.request.settings
        special = set(tok.all_special_ids)
        ids: list[int] = []
        hit_eos = False
        for t in row[: settings.max_tokens]:
            if t == tok.eos_token_id or t == tok.pad_token_id:
                hit_eos = True
                break
            if t not in special:
                ids.append(t)
        text = tok.decode(ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in settings.stop if s and s in text), default=-1)
        if cut >= 0:
            text = text[:cut]
            ids = tok(text, add_special_tokens=False)["input_ids"]
        reason = "stop" if hit_eos or cut >= 0 else "length"
        n_steps = min(len(times), len(ids))
        gaps = [b - a for a, b in zip(times[:n_steps], times[1:n_steps])]
        return Completion(
            text=text, finish_reason=reason, input_tokens=n_in, output_tokens=len(ids),
            tokens_estimated=False, ttft_s=(times[0] - p.enqueued) if times else None,
            chunk_gaps_s=gaps,
        )


def create(candidate: Candidate) -> LocalProvider:
    """Provider factory (see evals.providers.PROVIDERS); loads nothing until the first call."""
    return LocalProvider(candidate)
