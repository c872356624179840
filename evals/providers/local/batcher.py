"""Continuous batching for an in-process Hugging Face causal LM: one decode step at a time.

A batch is a set of rows, each one request, sharing one KV cache per model (the target, and its
draft when speculating). All caches have the same columns, described by one mask (rows x cache
length: 1 = a real token, 0 = padding or a discarded token) and one next position per row.
Positions are given explicitly, so a row's cache may have holes; attention never sees them.
Between two decode steps the scheduler
- evicts rows that ended (end of sequence, max_tokens, a stop string, or a caller that stopped
  waiting), so their answers go back at once rather than when the slowest row of a group ends;
- admits waiting requests into the freed slots: their prompts are prefilled together in caches
  of their own (starting from cached prefix blocks where the prefix cache has them, see
  `prefix_cache`), and the caches are joined by left-padding the shorter ones.

With a draft model (speculative decoding) a step has the draft propose k tokens per row, the
target score them all in one forward pass, and each row keep the prefix it accepts plus one token
(`speculative.verify`): rows grow by 1 to k+1 tokens in the same step. The columns of rejected
proposals are masked out, and columns that no row kept are cropped, so the caches grow by the
longest accepted run.

So a suite keeps the device busy: the batch is refilled from the runner's queue every step, the
way vLLM and TGI schedule, without their paged memory. Joining needs plain full-attention cache
layers; for other caches (sliding window, recurrent) waiting requests join only an empty batch,
and neither prefix caching nor a draft is used.

Every forward pass, and every operation on the caches, runs in `torch.inference_mode()`: with
autograd recording, each cache tensor kept the graph of the passes that made it, and the caches
chain every step to the one before, so a batch that never emptied held every activation since it
started (about 0.3 MB per request on the demo model, 9 GB after a long overload) and paid for
recording it.

Every row keeps its own sampling settings and step timestamps. A step ends by copying the chosen
token ids to the host, which waits for the device, so timestamps are when tokens exist.
"""

from __future__ import annotations

import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from routeopt.evals.providers.local.prefix_cache import Hit, PrefixCache
from routeopt.evals.providers.local.speculative import choose, probabilities, sample, verify


@dataclass
class Row:
    """One request in the running batch."""

    prompt: str
    max_tokens: int
    temperature: float
    top_p: float | None
    stops: tuple[str, ...]
    n_in: int = 0
    n_cached: int = 0  # prompt tokens whose keys and values came from the prefix cache
    ids: list[int] = field(default_factory=list)
    times: list[float] = field(default_factory=list)
    ended: str | None = None  # "eos", "stop" (a stop string) or "length" (max_tokens)
    drafted: int = 0  # draft tokens proposed for this row
    accepted: int = 0  # of which the target accepted


class _Forward:
    """One model's forward pass with a cache, whatever this transformers version calls things."""

    def __init__(self, model: Any):
        self.model = model
        params = inspect.signature(model.forward).parameters
        self.trims = "logits_to_keep" in params
        # transformers 5.2x renamed `past_key_values` to `cache`; the GPU images have 5.17
        self.cache_kw = "cache" if "cache" in params else "past_key_values"

    def __call__(
        self, ids: torch.Tensor, mask: torch.Tensor, pos: torch.Tensor, cache: Any, keep: int = 1
    ) -> torch.Tensor:
        """Logits of the last `keep` positions, (rows, keep, vocab)."""
        extra = {"logits_to_keep": keep} if self.trims else {}
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=pos,
            use_cache=True,
            **{self.cache_kw: cache},
            **extra,
        )
        return out.logits[:, -keep:, :]


class Batcher:
    """The running batch of one model: `admit` prompts, `step` them, `evict` the ended rows."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        device: str,
        max_batch: int,
        *,
        draft: Any = None,
        num_draft: int = 0,
        prefix_cache: PrefixCache | None = None,
    ):
        self.tok = tokenizer
        self.device = device
        self.max_batch = max_batch
        self.k = num_draft if draft is not None else 0
        self.prefix_cache = prefix_cache
        self.rows: list[Row] = []
        self._fwd = [_Forward(m) for m in ([model] if draft is None else [model, draft])]
        self._caches: list[Any] = []  # one per model, the same columns
        self._mask: torch.Tensor | None = None  # (rows, cache length) 1 = real token, 0 = not
        self._pos: torch.Tensor | None = None  # (rows,) position of the next token
        self._joinable = True
        self.eos_ids = _eos_ids(model, tokenizer)

    # ---- the schedule ------------------------------------------------------------------------
    @property
    def free(self) -> int:
        """How many requests may be admitted now."""
        if not self._joinable and self.rows:
            return 0
        return self.max_batch - len(self.rows)

    @torch.inference_mode()
    def admit(self, rows: list[Row]) -> None:
        """Prefill `rows` (from their cached prefix on) and add them to the batch; each gets
        its first token."""
        prompts = [self.tok(r.prompt, add_special_tokens=False)["input_ids"] for r in rows]
        hits = [self.prefix_cache.lookup(p) if self.prefix_cache is not None else Hit() for p in prompts]
        width = max(h.tokens for h in hits)
        past = torch.tensor(
            [[0] * (width - h.tokens) + [1] * h.tokens for h in hits], device=self.device, dtype=torch.long
        ).reshape(len(rows), width)
        caches = [
            _cache_of([[blk[m] for blk in h.blocks] for h in hits], width) for m in range(len(self._fwd))
        ]
        ids, new = self._left_padded([p[h.tokens :] for p, h in zip(prompts, hits)])
        mask = torch.cat([past, new], dim=1)
        starts = torch.tensor([h.tokens for h in hits], device=self.device)
        pos = starts[:, None] + (new.cumsum(-1) - 1).clamp(min=0)
        logits = [f(ids, mask, pos, c)[:, -1] for f, c in zip(self._fwd, caches)][0]  # target
        for r, p, h in zip(rows, prompts, hits):
            r.n_in, r.n_cached = len(p), h.tokens
        if self.prefix_cache is not None and _plain_layers(caches[0]):
            self._remember(prompts, hits, caches, mask.shape[1])
        self._join(rows, caches, mask, torch.tensor([len(p) for p in prompts], device=self.device))
        self._take(rows, logits)

    @torch.inference_mode()
    def step(self) -> None:
        """One decode step for every row: feed each row's last token, choose the next; with a
        draft, propose k tokens, verify them in one target pass and keep what is accepted."""
        if self.k:
            self._speculate()
            return
        assert self._mask is not None and self._pos is not None
        last = torch.tensor([[r.ids[-1]] for r in self.rows], device=self.device)
        self._mask = torch.cat([self._mask, self._mask.new_ones((len(self.rows), 1))], dim=1)
        logits = self._fwd[0](last, self._mask, self._pos[:, None], self._caches[0])[:, -1]
        self._pos = self._pos + 1
        self._take(self.rows, logits)

    @torch.inference_mode()
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
        for cache in self._caches:
            cache.batch_select_indices(idx)
        assert self._mask is not None and self._pos is not None
        self._mask, self._pos = self._mask[idx], self._pos[idx]
        if self._joinable:
            self._trim_left()
        return gone

    def reset(self) -> None:
        """Drop every row and the caches (after an error, or when the batch empties)."""
        self.rows, self._caches, self._mask, self._pos = [], [], None, None

    # ---- speculative decoding ----------------------------------------------------------------
    def _speculate(self) -> None:
        """Draft k tokens per row, verify them with one target pass, keep the accepted ones."""
        assert self._mask is not None and self._pos is not None
        if not self._joinable:
            raise RuntimeError("speculative decoding needs plain full-attention KV caches")
        k, n_rows = self.k, len(self.rows)
        target, draft = self._fwd
        t_cache, d_cache = self._caches
        temps, top_p = self._settings(self.rows)
        width = self._mask.shape[1]
        ext = torch.cat([self._mask, self._mask.new_ones((n_rows, k + 1))], dim=1)
        tokens = [torch.tensor([[r.ids[-1]] for r in self.rows], device=self.device)]
        qs = []
        for j in range(k):
            q = probabilities(
                draft(tokens[-1], ext[:, : width + j + 1], (self._pos + j)[:, None], d_cache)[:, -1],
                temps,
                top_p,
            )
            qs.append(q)
            tokens.append(sample(q)[:, None])
        fed = torch.cat(tokens, dim=1)  # the last token, then the k proposals
        pos = self._pos[:, None] + torch.arange(k + 1, device=self.device)
        p = probabilities(target(fed, ext, pos, t_cache, keep=k + 1), temps, top_p)
        accepted, nxt = verify(p, torch.stack(qs, dim=1), fed[:, 1:])
        counts = accepted.tolist()  # waits for the device
        if max(counts) == k:  # a row kept every proposal: the draft's cache needs the last one
            draft(fed[:, k:], ext, pos[:, k:], d_cache)
        kept = torch.arange(k + 1, device=self.device)[None, :] <= accepted[:, None]
        self._mask = torch.cat([self._mask, kept.to(self._mask.dtype)], dim=1)
        self._pos = self._pos + accepted + 1
        self._crop_right()
        now = time.perf_counter()
        for r, proposed, n, t in zip(self.rows, fed[:, 1:].tolist(), counts, nxt.tolist()):
            r.drafted += k
            r.accepted += n
            for token in proposed[:n] + [t]:
                self._append(r, token, now)
                if r.ended:
                    break

    def _crop_right(self) -> None:
        """Drop trailing cache columns that no row kept (proposals every row rejected)."""
        assert self._mask is not None
        used = self._mask.any(dim=0)
        end = int(used.shape[0] - used.flip(0).int().argmax())
        if end == self._mask.shape[1]:
            return
        self._mask = self._mask[:, :end]
        for cache in self._caches:
            for layer in cache.layers:
                layer.keys = layer.keys[..., :end, :]
                layer.values = layer.values[..., :end, :]

    # ---- prefix caching ----------------------------------------------------------------------
    def _remember(self, prompts: list[list[int]], hits: list[Hit], caches: list[Any], width: int) -> None:
        """Store the full prompt blocks the prefill just computed, last block first."""
        assert self.prefix_cache is not None
        bs = self.prefix_cache.block_size
        for i, (p, h) in enumerate(zip(prompts, hits)):
            offset = width - len(p)  # the column of prompt token 0 (prompts are left-padded)
            for b in range(len(h.names) - 1, h.tokens // bs - 1, -1):
                col = offset + b * bs
                block = [
                    torch.stack(
                        [
                            torch.stack(
                                [layer.keys[i, :, col : col + bs], layer.values[i, :, col : col + bs]]
                            )
                            for layer in cache.layers
                        ]
                    ).clone()
                    for cache in caches
                ]
                self.prefix_cache.store(h.names[b], block)

    # ---- tensors -------------------------------------------------------------------------------
    def _left_padded(self, seqs: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(s) for s in seqs)
        pad = self.tok.pad_token_id or 0
        ids = torch.tensor([[pad] * (width - len(s)) + s for s in seqs], device=self.device)
        mask = torch.tensor([[0] * (width - len(s)) + [1] * len(s) for s in seqs], device=self.device)
        return ids, mask

    def _settings(self, rows: list[Row]) -> tuple[torch.Tensor, torch.Tensor]:
        temps = torch.tensor([r.temperature for r in rows], device=self.device)
        top_p = torch.tensor([r.top_p or 1.0 for r in rows], device=self.device)
        return temps, top_p

    def _join(self, rows: list[Row], caches: list[Any], mask: torch.Tensor, pos: torch.Tensor) -> None:
        if not self._caches:
            self._caches, self._mask, self._pos = caches, mask, pos
            self._joinable = all(_plain_layers(c) for c in caches)
            self.rows = list(rows)
            return
        assert self._mask is not None and self._pos is not None
        width = max(self._mask.shape[1], mask.shape[1])
        for running, new in zip(self._caches, caches):
            for old, add in zip(running.layers, new.layers):
                old.keys = torch.cat([_pad_left(old.keys, width), _pad_left(add.keys, width)])
                old.values = torch.cat([_pad_left(old.values, width), _pad_left(add.values, width)])
        self._mask = torch.cat([_pad_left(self._mask, width), _pad_left(mask, width)])
        self._pos = torch.cat([self._pos, pos])
        self.rows.extend(rows)

    def _trim_left(self) -> None:
        """Drop leading cache columns that are padding in every remaining row."""
        assert self._mask is not None
        start = int(self._mask.any(dim=0).int().argmax())
        if start == 0:
            return
        for cache in self._caches:
            for layer in cache.layers:
                layer.keys = layer.keys[..., start:, :]
                layer.values = layer.values[..., start:, :]
        self._mask = self._mask[:, start:]

    def _take(self, rows: list[Row], logits: torch.Tensor) -> None:
        """Choose each row's next token, record it with its time, and mark rows that ended."""
        chosen = choose(logits, *self._settings(rows)).tolist()  # waits for the device
        now = time.perf_counter()
        for r, t in zip(rows, chosen):
            self._append(r, t, now)

    def _append(self, r: Row, t: int, now: float) -> None:
        r.ids.append(t)
        r.times.append(now)
        if t in self.eos_ids:
            r.ended = "eos"
        elif len(r.ids) >= r.max_tokens:
            r.ended = "length"
        elif r.stops and any(s in self.tok.decode(r.ids, skip_special_tokens=True) for s in r.stops):
            r.ended = "stop"


def _cache_of(blocks: list[list[torch.Tensor]], width: int) -> Any:
    """A cache holding each row's cached prefix blocks (one (layers, 2, heads, block, dim)
    tensor each), left-padded to `width` columns; an empty cache when nothing was cached."""
    from transformers import DynamicCache

    cache = DynamicCache()
    if width == 0:
        return cache
    rows = [torch.cat(b, dim=-2) if b else None for b in blocks]
    like = next(r for r in rows if r is not None)
    rows = [r if r is not None else like[..., :0, :] for r in rows]
    kv = torch.stack([_pad_left(r, width) for r in rows], dim=2)  # (layers, 2, rows, heads, w, d)
    for layer, (k, v) in enumerate(kv):
        cache.update(k, v, layer)
    return cache


def _pad_left(t: torch.Tensor, width: int) -> torch.Tensor:
    """Left-pad the sequence axis (-2 for K/V of shape (..., L, D), -1 for a (B, L) mask)."""
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
