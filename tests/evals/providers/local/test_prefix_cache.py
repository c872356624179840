"""Automatic prefix caching in the local provider: requests that share a prompt prefix reuse its
cached key/value blocks, answers do not change, and the cache stays within its bound."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from routeopt.evals.providers.base import GenerationSettings, Message, Request  # noqa: E402
from routeopt.evals.providers.local.prefix_cache import PrefixCache  # noqa: E402
from routeopt.evals.providers.local.provider import LocalProvider  # noqa: E402
from routeopt.evals.suite.spec import load_suite  # noqa: E402
from tests import REPO  # noqa: E402
from tests.local_zoo import ZOO, serve, zoo_l  # noqa: E402

pytestmark = pytest.mark.skipif(
    not (ZOO / "zoo-l" / "config.json").exists(), reason="zoo checkpoints not built"
)


def _demo_requests() -> list[Request]:
    out = []
    for name in ("sort", "add", "reverse"):
        suite = load_suite(REPO / "evals" / "suites" / f"{name}.yaml")
        out += [suite.request(item) for item in suite.items]
    return out


async def test_a_bounded_cache_evicts_and_still_answers_the_same() -> None:
    requests = _demo_requests()[:150]
    off, _ = await serve(zoo_l(False), requests)
    on, provider = await serve(zoo_l({"block_size": 2, "capacity_tokens": 16}), requests)
    assert [c.text for c in on] == [c.text for c in off]
    pc = provider.prefix_cache
    assert len(pc) <= 8 and pc.evicted_blocks > 0 and pc.hit_tokens > 0


async def test_a_long_shared_prefix_is_computed_once() -> None:
    """Sequential requests with a 40-token shared prefix: after the first, only the unique
    tail is prefilled."""
    head = "sort: 9876543210 sort: 9876543210 sort: 12345 "  # 47 characters
    requests = [
        Request((Message("user", head + f"sort: {n}="),), GenerationSettings(max_tokens=4))
        for n in (4213, 9870, 5512)
    ]  # 59-token prompts + 4 <= 64 positions
    provider = LocalProvider(zoo_l({"block_size": 8}))
    try:
        got = [await provider.generate(r) for r in requests]
    finally:
        await provider.aclose()
    assert [c.cached_input_tokens for c in got] == [0, 48, 48]  # <bos> + 47 = 6 blocks of 8


def test_block_names_chain_their_prefix_and_lookup_leaves_the_last_token() -> None:
    pc = PrefixCache(block_size=2, capacity_tokens=100)
    a, b = pc.names([1, 2, 3, 4]), pc.names([9, 9, 3, 4])
    assert len(a) == 2 and a[1] != b[1]  # the same block after another prefix is another block
    for name in reversed(a):
        pc.store(name, [torch.zeros(1)])
    assert pc.lookup([1, 2, 3, 4]).tokens == 2  # the last block holds the last token: computed
    assert pc.lookup([1, 2, 3, 4, 5]).tokens == 4
    assert pc.lookup([1, 2, 7, 7, 5]).tokens == 2
    assert pc.lookup([1]).tokens == 0


def test_lru_evicts_the_tails_of_chains_first() -> None:
    pc = PrefixCache(block_size=1, capacity_tokens=3)
    first = pc.names([1, 2, 3])
    for name in reversed(first):
        pc.store(name, [torch.zeros(1)])
    pc.lookup([1, 2, 3, 9])  # touches 3, 2, then 1: the first block is the freshest
    other = pc.names([5])
    pc.store(other[0], [torch.zeros(1)])
    assert pc.evicted_blocks == 1
    assert pc.lookup([1, 2, 3, 9]).tokens == 2  # block [1,2,3] went, [1] and [1,2] stayed
    assert pc.lookup([5, 0]).tokens == 1


def test_zero_capacity_stores_nothing() -> None:
    pc = PrefixCache(block_size=2, capacity_tokens=0)
    pc.store(pc.names([1, 2])[0], [torch.zeros(1)])
    assert len(pc) == 0 and pc.lookup([1, 2, 3]).tokens == 0
