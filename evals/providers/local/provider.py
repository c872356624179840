"""The `local` provider: an in-process Hugging Face causal LM (a zoo model or any checkpoint).

Requests from any number of concurrent `generate()` calls, from any event loop, go to one engine
thread per model that batches them per decode step (`routeopt.evals.providers.local.batcher`): a request joins
the running batch at the next step and leaves it, with its answer, the step it ends. Token counts
come from the tokenizer, so they are exact; TTFT and inter-token gaps are the engine's step times.
torch and transformers are imported on first use and the model loads once, on the first request;
within `keep_loaded()` (a run's preflight and evaluation) a candidate's model loads once per process
and serves each of its suites in turn.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections import deque
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from routeopt.evals.config import Candidate
from routeopt.evals.providers.base import Completion, ProviderError, Request

DEFAULT_MAX_BATCH = 64


@dataclass
class _Pending:
    """A request waiting for, or riding in, the engine, and where its answer goes."""

    request: Request
    future: asyncio.Future
    loop: asyncio.AbstractEventLoop
    enqueued: float = field(default_factory=time.perf_counter)

    @property
    def abandoned(self) -> bool:
        """The caller stopped waiting (timeout, cancellation): stop spending steps on it."""
        return self.future.done()

    def settle(self, result: Completion | ProviderError) -> None:
        """Hand the result to the caller's event loop (called from the engine thread)."""

        def _set() -> None:
            if self.future.done():
                return
            if isinstance(result, BaseException):
                self.future.set_exception(result)
            else:
                self.future.set_result(result)

        try:
            self.loop.call_soon_threadsafe(_set)
        except RuntimeError:  # the caller's loop is closed: nobody is waiting any more
            pass


_LOAD_LOCK = threading.Lock()
# (tokenizer, model, draft) by candidate while `keep_loaded` is open; None when closed
_kept: dict[str, tuple[Any, Any, Any]] | None = None


@contextmanager
def keep_loaded() -> Iterator[None]:
    """Keep each candidate's loaded model for later providers of the same candidate in this
    process until the block ends: the preflight's load serves the first suite, and a suite's the
    next (a candidate's suites run one after another), instead of one load per suite. Nested
    blocks share the outermost one; the models are released when it ends."""
    global _kept
    with _LOAD_LOCK:
        outer = _kept is None
        if outer:
            _kept = {}
    try:
        yield
    finally:
        if outer:
            with _LOAD_LOCK:
                held, _kept = _kept or {}, None
            devices = {str(getattr(m, "device", "cpu")) for _, m, _ in held.values()}
            held.clear()
            for device in devices:
                _free_device_memory(device)


_side_by_side = 1  # local engines evaluated at once in this process (see `sharing_cpu`)


@contextmanager
def sharing_cpu(engines: int) -> Iterator[None]:
    """Within this block `engines` local models run side by side, so each model loaded (or
    taken from `keep_loaded`) sets torch's CPU threads to its share of the cores instead of
    each engine's team of threads competing for all of them: on 2 cores the demo's 5 engines
    spent 16% less CPU with 1 thread each than with 2 (`benchmarks/local_threads.py`).
    ROUTEOPT_TORCH_THREADS still overrides."""
    global _side_by_side
    before, _side_by_side = _side_by_side, max(1, engines)
    try:
        yield
    finally:
        _side_by_side = before


def _cpu_threads() -> int:
    """torch's intra-op threads: ROUTEOPT_TORCH_THREADS, else this engine's share of the cores
    this process may run on (at most 4: a small model gains little from more)."""
    override = int(os.environ.get("ROUTEOPT_TORCH_THREADS", 0))
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return override or max(1, min(cores // _side_by_side, 4))


def _kept_key(candidate: Candidate) -> str:
    """What a loaded model depends on: the candidate's whole definition (name included, so two
    candidates never share a model object across engine threads)."""
    return candidate.model_dump_json()


def _resolve_device(requested: str) -> str:
    import torch

    if requested in ("auto", ""):
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ProviderError("config", f"device {requested!r} requested but CUDA is not available")
    return requested


def _looks_like_path(model: str) -> bool:
    """Hub ids are `name` or `org/name`; anything else (./x, /x, a/b/c) is a local path."""
    return model.startswith((".", "/", "~")) or model.count("/") > 1 or "\\" in model


class LocalProvider:
    """In-process generation for one candidate (checkpoint + variant + device)."""

    def __init__(self, candidate: Candidate, max_batch: int | None = None):
        self.candidate = candidate
        self.max_batch = max_batch or min(candidate.max_concurrency, DEFAULT_MAX_BATCH)
        self.batch_sizes: list[int] = []  # rows in each decode step
        self.admissions: list[int] = []  # requests admitted together, in order
        self.oom_backoffs = 0  # times out-of-memory made the batch smaller
        self.prefix_cache: Any = None  # the engine's PrefixCache, once it runs (for its stats)
        self._inbox: deque[_Pending] = deque()
        self._wake = threading.Condition()
        self._engine: threading.Thread | None = None
        self._model: Any = None
        self._draft: Any = None
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

            self._device = _resolve_device(self.candidate.device)
            if self._device == "cpu":
                torch.set_num_threads(_cpu_threads())
            key = _kept_key(self.candidate) if _kept is not None else None
            if key is not None and key in _kept:
                self._tokenizer, self._model, self._draft = _kept[key]
                return
            tok, model = self._checkpoint(self.candidate.model, self.candidate.variant)
            spec = self.candidate.speculative
            if spec is not None:
                variant = spec.variant or self.candidate.variant
                draft_tok, draft = self._checkpoint(spec.model, variant, role="draft ")
                _same_vocabulary(self.candidate.name, tok, model, draft_tok, draft)
                self._draft = draft.eval()
            tok.padding_side = "left"
            if tok.pad_token is None:
                tok.pad_token = tok.eos_token
            self._tokenizer, self._model = tok, model.eval()
            if key is not None:
                _kept[key] = (self._tokenizer, self._model, self._draft)

    def _checkpoint(self, ref: str, variant: str, role: str = "") -> tuple[Any, Any]:
        """Tokenizer and model of one checkpoint, in `variant` on the candidate's device."""
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer
        from transformers.utils import logging as hf_logging

        from routeopt.evals.providers.local.quantize import QuantizeError, apply_variant

        name = self.candidate.name
        if _looks_like_path(ref) and not Path(ref).expanduser().exists():
            raise ProviderError("config", f"candidate {name!r}: {role}checkpoint not found: {ref}")
        hf_logging.disable_progress_bar()
        # Tied input/output embeddings are reported as a "missing lm_head" load report at
        # warning level; the weights are tied, so keep it out of the run's output.
        verbosity = hf_logging.get_verbosity()
        hf_logging.set_verbosity_error()
        try:
            tok = AutoTokenizer.from_pretrained(ref)
            model = AutoModelForCausalLM.from_pretrained(ref, dtype=torch.float32)
        except (OSError, ValueError) as exc:
            raise ProviderError(
                "config", f"candidate {name!r}: cannot load {role}checkpoint {ref!r}: {exc}"
            ) from None
        finally:
            hf_logging.set_verbosity(verbosity)
        try:
            return tok, apply_variant(model, variant, self._device)
        except QuantizeError as exc:
            raise ProviderError("config", f"candidate {name!r}: {role}{exc}") from None

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
        item = _Pending(request, loop.create_future(), loop)
        with self._wake:
            if self._closed:
                raise ProviderError("internal", "local provider is closed")
            if self._engine is None or not self._engine.is_alive():
                self._engine = threading.Thread(
                    target=self._serve, daemon=True, name=f"routeopt-local-{self.candidate.name}"
                )
                self._engine.start()
            self._inbox.append(item)
            self._wake.notify()
        return await item.future

    async def aclose(self) -> None:
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._engine is not None:
            await asyncio.to_thread(self._engine.join)
        self._engine = None
        self._fail(list(self._inbox), ProviderError("internal", "local provider closed"))
        self._inbox.clear()
        self._model = self._draft = None

    # ---- the engine thread ----------------------------------------------------------------
    def _serve(self) -> None:
        """Admit waiting requests, run one decode step, hand back the rows that ended; repeat."""
        from routeopt.evals.providers.local.batcher import Batcher
        from routeopt.evals.providers.local.prefix_cache import PrefixCache

        spec, pc = self.candidate.speculative, self.candidate.prefix_cache
        batcher = Batcher(
            self._model,
            self._tokenizer,
            self._device,
            self.max_batch,
            draft=self._draft,
            num_draft=spec.num_speculative_tokens if spec is not None else 0,
            prefix_cache=PrefixCache(pc.block_size, pc.capacity_tokens) if pc.enabled else None,
        )
        self.prefix_cache = batcher.prefix_cache
        owners: dict[int, _Pending] = {}

        def abandoned(row: Any) -> bool:
            return owners[id(row)].abandoned

        why = "local provider closed"
        try:
            while True:
                with self._wake:
                    while not (self._inbox or batcher.rows or self._closed):
                        self._wake.wait()
                    if self._closed:
                        break
                    new = self._take(batcher.free)
                if new:
                    self._admit(batcher, new, owners)
                self._finish(batcher.evict(abandoned), owners)
                if not batcher.rows:
                    continue
                self.batch_sizes.append(len(batcher.rows))
                try:
                    batcher.step()
                except Exception as exc:  # a crash in a step ends this batch, not the engine
                    failed = [owners.pop(id(r)) for r in batcher.rows]
                    batcher.reset()
                    self._requeue_or_fail(batcher, failed, exc)
                    continue
                self._finish(batcher.evict(abandoned), owners)
        except Exception as exc:
            why = f"local engine stopped: {exc!r}"
            raise
        finally:  # closed, or a bug in this loop: nobody may wait forever
            with self._wake:
                waiting, self._inbox = list(self._inbox), deque()
            self._fail(list(owners.values()) + waiting, ProviderError("internal", why))

    def _requeue_or_fail(self, batcher: Any, items: list[_Pending], exc: Exception) -> None:
        """After a failed prefill or step. Out of memory shrinks the batch (to the rows still
        running, else to half the failed ones) and requeues the requests, which restart with
        their clocks still running; anything else, or out of memory at batch 1, fails them."""
        room = len(batcher.rows) or len(items) // 2
        if not _out_of_memory(exc) or room == 0:
            if _out_of_memory(exc):
                exc = RuntimeError(
                    f"out of memory with one request in the batch ({exc}); "
                    "shorten its prompt or max_tokens, or use a smaller variant"
                )
            self._fail(items, _internal(exc))
            return
        batcher.max_batch = self.max_batch = room
        self.oom_backoffs += 1
        if batcher.prefix_cache is not None:  # cached prefixes are memory the batch needs more
            batcher.prefix_cache.clear()
        _free_device_memory(self._device)
        with self._wake:
            self._inbox.extendleft(reversed([p for p in items if not p.abandoned]))

    def _take(self, n: int) -> list[_Pending]:
        """Up to n waiting requests, oldest first, skipping those nobody waits for any more."""
        taken: list[_Pending] = []
        while self._inbox and len(taken) < n:
            p = self._inbox.popleft()
            if not p.abandoned:
                taken.append(p)
        return taken

    def _admit(self, batcher: Any, new: list[_Pending], owners: dict[int, _Pending]) -> None:
        from routeopt.evals.providers.local.batcher import Row

        rows, riding = [], []
        for p in new:
            s = p.request.settings
            try:
                prompt = self._render(p.request)
            except Exception as exc:  # e.g. a chat template that rejects these messages
                p.settle(ProviderError("client_error", f"cannot render the prompt: {exc}"))
                continue
            rows.append(Row(prompt, s.max_tokens, s.temperature, s.top_p, tuple(x for x in s.stop if x)))
            riding.append(p)
        if not rows:
            return
        try:
            batcher.admit(rows)
        except Exception as exc:  # the running rows go on; only the new group is affected
            self._requeue_or_fail(batcher, riding, exc)
            return
        self.admissions.append(len(rows))
        owners.update((id(r), p) for r, p in zip(rows, riding))

    def _finish(self, rows: list[Any], owners: dict[int, _Pending]) -> None:
        now = time.perf_counter()
        for r in rows:
            p = owners.pop(id(r))
            if p.abandoned:
                continue
            try:
                result: Completion | ProviderError = self._completion(p, r, now)
            except Exception as exc:  # one answer that cannot be decoded fails alone
                result = _internal(exc)
            p.settle(result)

    @staticmethod
    def _fail(items: list[_Pending], exc: ProviderError) -> None:
        for p in items:
            p.settle(exc)

    def _render(self, request: Request) -> str:
        tok = self._tokenizer
        messages = [{"role": m.role, "content": m.content} for m in request.messages]
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        return (tok.bos_token or "") + request.prompt_text

    def _completion(self, p: _Pending, row: Any, now: float) -> Completion:
        """The answer of a row that ended: text cut at the first stop string, exact counts."""
        tok = self._tokenizer
        ids = row.ids[:-1] if row.ended == "eos" else row.ids
        text = tok.decode(ids, skip_special_tokens=True)
        cut = min((text.find(s) for s in row.stops if s in text), default=-1)
        special = set(tok.all_special_ids)
        n_out = len([t for t in ids if t not in special])
        if cut >= 0:
            text = text[:cut]
            n_out = len(tok(text, add_special_tokens=False)["input_ids"])
        reason = "length" if row.ended == "length" else "stop"
        n_steps = min(len(row.times), n_out)
        gaps = [b - a for a, b in zip(row.times[:n_steps], row.times[1:n_steps])]
        return Completion(
            text=text,
            finish_reason=reason,
            input_tokens=row.n_in,
            output_tokens=n_out,
            cached_input_tokens=row.n_cached,
            tokens_estimated=False,
            ttft_s=row.times[0] - p.enqueued if row.times else None,
            latency_s=now - p.enqueued,
            chunk_gaps_s=gaps,
            streamed=True,
            draft_tokens=row.drafted if self._draft is not None else None,
            accepted_draft_tokens=row.accepted if self._draft is not None else None,
        )


def _same_vocabulary(name: str, tok: Any, model: Any, draft_tok: Any, draft: Any) -> None:
    """Refuse a draft whose token ids mean something else than the target's: it proposes ids
    and the target verifies them, so both must share one vocabulary (and output size)."""
    why = None
    if tok.get_vocab() != draft_tok.get_vocab():
        ours, theirs = tok.get_vocab(), draft_tok.get_vocab()
        differ = sorted(set(ours.items()) ^ set(theirs.items()))[:3]
        why = (
            f"the tokenizers differ ({len(ours)} vs {len(theirs)} tokens; e.g. "
            f"{', '.join(f'{t!r}={i}' for t, i in differ)})"
        )
    elif (tok.bos_token_id, tok.eos_token_id) != (draft_tok.bos_token_id, draft_tok.eos_token_id):
        why = "their special tokens (bos/eos) differ"
    else:
        width = model.get_output_embeddings().weight.shape[0]
        draft_width = draft.get_output_embeddings().weight.shape[0]
        if width != draft_width:
            why = f"their output layers score {width} vs {draft_width} token ids"
    if why is not None:
        raise ProviderError(
            "config",
            f"candidate {name!r}: speculative.model cannot draft "
            f"for this model: {why}; a draft must share the target's tokenizer "
            "and vocabulary",
        )


def _out_of_memory(exc: BaseException) -> bool:
    import torch

    return isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower()


def _free_device_memory(device: str) -> None:
    import gc

    gc.collect()
    if device.startswith("cuda"):
        import torch

        torch.cuda.empty_cache()


def _internal(exc: Exception) -> ProviderError:
    return ProviderError("internal", f"local generation failed: {exc!r}")


def create(candidate: Candidate) -> LocalProvider:
    """Provider factory (see routeopt.evals.providers.PROVIDERS); loads nothing until the first call."""
    return LocalProvider(candidate)
