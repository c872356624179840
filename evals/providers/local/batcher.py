"""Continuous batching for an in-process Hugging Face causal LM: one decode step at a time.

A batch is a set of rows, each one request, sharing one KV cache whose rows are left-padded to a
common length. Between two decode steps the scheduler
- evicts rows that ended (end of sequence, max_tokens, a stop string, or a caller that stopped
  waiting), so their answers go back at once rather than when the slowest row of a group ends;
- admits waiting requests into the freed slots: their prompts are prefilled together in a cache
  of their own, and the two caches are joined by left-padding the shorter one.

So a suite keeps the device busy: the batch is refilled from the runner's queue every step, the
way vLLM and TGI schedule, without their paged memory. Joining needs plain full-attention cache
layers; for other caches (sliding window, recurrent) waiting requests join only an empty batch.

Every row keeps its own sampling settings and step timestamps. A step ends by copying the chosen
token ids to the host, which waits for the device, so timestamps are when tokens exist.
"""

from __future__ import annotations

import inspect
import time
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import Any

import torch


@dataclass
class Row:
    """One request in the running batch."""

    prompt: str
    max_tokens: int
    temperature: float
    top_p: float | None
    stops: tuple[str, ...]
    n_in: int = 0
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    ended: str | None = None  # "eos", "stop" (a stop string) or "length" (max_tokens)


class Batcher:
    """The running batch of one model: `admit` prompts, `step` them, `evict` the ended rows."""

    def __init__(self, model: Any, tokenizer: Any, device: str, max_batch: int):
        self.model = model
        self.tok = tokenizer
        self.device = device
        self.max_batch = max_batch
        self.rows: list[Row] = []
        self._cache: Any = None
        self._mask: torch.Tensor | None = None  # (rows, cache length) 1 = real token, 0 = pad
        self._pos: torch.Tensor | None = None  # (rows,) position of the next token
        self._joinable = True
        self.eos_ids = _eos_ids(model, tokenizer)
        params = inspect.signature(model.forward).parameters
        self._logits_kw = {"logits_to_keep": 1} if "logits_to_keep" in params else {}
        # transformers 5.2x renamed `past_key_values` to `cache`; the GPU images have 5.17
        self._cache_kw = "cache" if "cache" in params else "past_key_values"

    # ---- the schedule ------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """How many requests may be admitted now."""
        if not self._joinable and self.rows:
            return 0
        return self.max_batch - len(self.rows)

    def admit(self, rows: list[Row]) -> None:
        """Prefill `rows` and add them to the batch; each gets its first token."""
        from transformers import DynamicCache

        enc = self.tok([r.prompt for r in rows], return_tensors="pt", padding=True,
                       add_special_tokens=False).to(self.device)
        mask = enc["attention_mask"]
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        logits = self._forward(enc["input_ids"], mask, pos, cache)
        for r, n in zip(rows, mask.sum(-1).tolist()):
            r.n_in = int(n)
        self._join(rows, cache, mask, mask.sum(-1))
        self._take(rows, logits)

    def step(self) -> None:
        """One decode step for every row: feed each row's last token, choose the next."""
        assert self._mask is not None and self._pos is not None
        last = torch.tensor([[r.ids[-1]] for r in self.rows], device=self.device)
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=1)
        logits = self._forward(last, self._mask, self._pos[:, None], self._cache)
        self._pos = self._pos + 1
        self._take(self.rows, logits)

    def evict(self, drop: Callable[[Row], bool]) -> list[Row]:
        """Remove the rows that ended or that `drop` names; return them."""
        gone = [r for r in self.rows if r.ended or drop(r)]
        if not gone:
            return []
        keep = [i for i, r in enumerate(self.rows) if not (r.ended or drop(r))]
        self.rows = [self.rows[i] for i in keep]
        if not keep:
            self.reset()
            return gone
        idx = torch.tensor(keep, device=self.device)
        self._cache.batch_select_indices(idx)
        assert self._mask is not None and self._pos is not None
        self._mask, self._pos = self._mask[idx], self._pos[idx]
        if self._joinable:
            self._trim_left()
        return gone

    def reset(self) -> None:
        """Drop every row and the cache (after an error, or when the batch empties)."""
        self.rows, self._cache, self._mask, self._pos = [], None, None, None

    # ---- tensors -------------------------------------------------------------------------------
    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor,
                 cache: Any) -> torch.Tensor:
        out = self.model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True,
                         **{self._cache_kw: cache}, **self._logits_kw)
        return out.logits[:, -1, :]

    def _join(self, rows: list[Row], cache: Any, mask: torch.Tensor, pos: torch.Tensor) -> None:
        if self._cache is None:
            self._cache, self._mask, self._pos = cache, mask, pos
            self._joinable = _plain_layers(cache)
            self.rows = list(rows)
            return
        assert self._mask is not None and self._pos is not None
        width = max(self._mask.shape[1], mask.shape[1])
        for old, new in zip(self._cache.layers, cache.layers):
            old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(new.keys, width)])
            old.values = torch.cat([_pad_left(old.values, width), _pad_left(new.values, width)])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        self._pos = torch.cat([self._pos, pos])
        self.rows.extend(rows)

    def _trim_left(self) -> None:
        """Drop leading cache columns that are padding in every remaining row."""
        assert self._mask is not None
        start = int(self._mask.any(dim=0).int().argmax())
        if start == 0:
            return
        for layer in self._cache.layers:
            layer.keys = layer.keys[..., start:, :]
            layer.values = layer.values[..., start:, :]
        self._mask = self._mask[:, start:]

    def _take(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Choose each row's next token, record it with its time, and mark rows that ended."""
        chosen = _choose(logits, rows).tolist()  # waits for the device
        now = time.perf_counter()
        for r, t in zip(rows, chosen):
            r.ids.append(t)
            r.times.append(now)
            if t in self.eos_ids:
                r.ended = "eos"
            elif len(r.ids) >= r.max_tokens:
                r.ended = "length"
            elif r.stops and any(s in self.tok.decode(r.ids, skip_special_tokens=True)
                                 for s in r.stops):
                r.ended = "stop"


def _choose(logits: torch.Tensor, rows: list[Row]) -> torch.Tensor:
    """Greedy for rows at temperature 0; temperature and nucleus (top-p) sampling for the rest."""
    greedy = logits.argmax(dim=-1)
    temps = [r.temperature for r in rows]
    if not any(t > 0 for t in temps):
        return greedy
    t = torch.tensor([max(x, 1e-6) for x in temps], device=logits.device)
    probs = torch.softmax(logits.float() / t[:, None], dim=-1)
    top_p = torch.tensor([r.top_p or 1.0 for r in rows], device=logits.device)
    sorted_p, order = probs.sort(dim=-1, descending=True)
    outside = sorted_p.cumsum(-1) - sorted_p > top_p[:, None]  # keeps at least the top token
    sorted_p = sorted_p.masked_fill(outside, 0.0)
    sampled = order.gather(-1, torch.multinomial(sorted_p, 1)).squeeze(-1)
    sampling = torch.tensor([x > 0 for x in temps], device=logits.device)
    return torch.where(sampling, sampled, greedy)


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for K/V of shape (B, H, L, D), -1 for a (B, L) mask)."""
    axis = -1 if t.dim() == 2 else -2
    short = width - t.shape[axis]
    if short == 0:
        return t
    shape = list(t.shape)
    shape[axis] = short
    return torch.cat([t.new_zeros(shape), t], dim=axis)


def _plain_layers(cache: Any) -> bool:
    """Whether every cache layer is a plain growing full-attention layer that rows can join."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _eos_ids(model: Any, tokenizer: Any) -> set[int]:
    ids = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    found = set(ids if isinstance(ids, list) else [ids] if ids is not None else [])
    if tokenizer.eos_token_id is not None:
        found.add(tokenizer.eos_token_id)
    return found
