"""Automatic prefix caching for the local batcher, the way vLLM does it.

A prompt's tokens are cut into blocks of `block_size`; each full block is named by a hash of its
tokens chained to the hash of the block before it, so a name stands for the whole prefix up to
that block. The cache maps names to the blocks' keys and values (one tensor per model: layers x
{key, value} x heads x block_size x head_dim, on the model's device). A new request whose prompt
starts with cached blocks copies them instead of recomputing them; at least its last prompt token
is always computed, since its logits choose the first output token.

The cache is bounded by `capacity_tokens` and evicts the least recently used block first. A hit
touches the blocks from the deepest to the first, so a chain's first blocks (shared by more
prompts) outlive its tails. Only the engine thread uses it: no locking.
"""

from __future__ import annotations

import hashlib
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class Hit:
    """What the cache holds of one prompt: `tokens` leading tokens in `blocks` (per block, one
    tensor per model), and the names of all the prompt's full blocks (for storing the rest)."""

    tokens: int = 0
    blocks: list[list[torch.Tensor]] = field(default_factory=list)
    names: list[bytes] = field(default_factory=list)


class PrefixCache:
    """Key/value blocks of prompt prefixes, by chained block hash, with LRU eviction."""

    def __init__(self, block_size: int, capacity_tokens: int):
        if block_size < 1:
            raise ValueError(f"block_size must be >= 1, got {block_size}")
        self.block_size = block_size
        self.capacity_blocks = max(0, capacity_tokens) // block_size
        self._blocks: OrderedDict[bytes, list[torch.Tensor]] = OrderedDict()
        self.queried_tokens = 0  # prompt tokens looked up
        self.hit_tokens = 0  # of which came from the cache
        self.evicted_blocks = 0

    def __len__(self) -> int:
        return len(self._blocks)

    @property
    def bytes(self) -> int:
        """Device memory the cached blocks hold."""
        return sum(t.numel() * t.element_size() for b in self._blocks.values() for t in b)

    def names(self, ids: Sequence[int]) -> list[bytes]:
        """The chained name of every full block of `ids`."""
        out: list[bytes] = []
        parent = b""
        bs = self.block_size
        for start in range(0, len(ids) - bs + 1, bs):
            h = hashlib.blake2b(parent, digest_size=16)
            h.update(array("q", ids[start : start + bs]).tobytes())
            parent = h.digest()
            out.append(parent)
        return out

    def lookup(self, ids: Sequence[int]) -> Hit:
        """The longest cached prefix of `ids` in whole blocks, leaving the last token to compute."""
        names = self.names(ids)
        usable = (len(ids) - 1) // self.block_size
        blocks: list[list[torch.Tensor]] = []
        for name in names[:usable]:
            block = self._blocks.get(name)
            if block is None:
                break
            blocks.append(block)
        for name in reversed(names[: len(blocks)]):
            self._blocks.move_to_end(name)
        hit = Hit(len(blocks) * self.block_size, blocks, names)
        self.queried_tokens += len(ids)
        self.hit_tokens += hit.tokens
        return hit

    def store(self, name: bytes, block: list[torch.Tensor]) -> None:
        """Keep one block (one tensor per model), evicting the least recently used beyond the
        capacity. Call for a prompt's blocks from the last to the first."""
        if self.capacity_blocks == 0:
            return
        if name in self._blocks:
            self._blocks.move_to_end(name)
            return
        self._blocks[name] = block
        while len(self._blocks) > self.capacity_blocks:
            self._blocks.popitem(last=False)
            self.evicted_blocks += 1

    def clear(self) -> None:
        """Drop every block (after running out of device memory)."""
        self._blocks.clear()
