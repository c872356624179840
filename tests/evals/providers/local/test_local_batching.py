"""Continuous batching in the local provider: requests join and leave the running batch per
decode step, and batching never changes an answer.

A random-weight model whose special tokens can never be chosen decodes exactly max_tokens, so
the test controls how long each request stays in the batch.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from routeopt.evals.config import Candidate  # noqa: E402
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request  # noqa: E402
from routeopt.evals.providers.local import batcher as _batcher  # noqa: E402
from routeopt.evals.providers.local.provider import LocalProvider  # noqa: E402
from tests import REPO  # noqa: E402

ZOO = REPO / "evals" / "demo" / "zoo"
pytestmark = pytest.mark.skipif(
    not (ZOO / "zoo-l" / "config.json").exists(), reason="zoo checkpoints not built"
)
MIXED = [
    "sort: 4213=",
    "reverse: abcdefg=",
    "add: 12+7=",
    "sort: 987654=",
    "reverse: xy=",
    "add: 305+96=",
    "sort: 31=",
    "reverse: hello world=",
    "add: 5+5=",
    "sort: 55031=",
]


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A random model on the zoo's tokenizer whose greedy choice is never a special token."""
    out = tmp_path_factory.mktemp("endless")
    for f in ZOO.joinpath("zoo-s").iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    config = transformers.AutoConfig.from_pretrained(out)
    config.max_position_embeddings = 256
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        for tid in tok.all_special_ids:
            model.lm_head.weight[tid].zero_()  # logit 0: below the best of 40 random logits
    model.save_pretrained(out)
    return out


def _provider(model: Path | str, max_batch: int = 8) -> LocalProvider:
    cand = Candidate(
        name="t",
        provider="local",
        model=str(model),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=max_batch,
    )
    return LocalProvider(cand)


def _req(
    prompt: str,
    max_tokens: int = 12,
    temperature: float = 0.0,
    top_p: float | None = None,
    stop: tuple[str, ...] = (),
) -> Request:
    return Request(
        (Message("user", prompt),),
        GenerationSettings(max_tokens=max_tokens, temperature=temperature, top_p=top_p, stop=stop),
    )


async def _alone(model: Path, requests: list[Request]) -> list[str]:
    """Each request served on its own (a batch of one, no padding)."""
    provider = _provider(model)
    try:
        return [(await provider.generate(r)).text for r in requests]
    finally:
        await provider.aclose()


async def _wait_for_steps(provider: LocalProvider, n: int) -> None:
    for _ in range(2000):
        if len(provider.batch_sizes) >= n:
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"engine ran {len(provider.batch_sizes)} steps, expected {n}")


async def test_batched_answers_equal_answers_served_alone() -> None:
    """Prompts of different lengths share left-padded caches; greedy answers must not move."""
    requests = [_req(p) for p in MIXED]
    alone = await _alone(ZOO / "zoo-l", requests)
    provider = _provider(ZOO / "zoo-l", max_batch=4)  # fewer slots than requests: rows rotate
    try:
        together = await asyncio.gather(*(provider.generate(r) for r in requests))
    finally:
        await provider.aclose()
    assert [c.text for c in together] == alone
    assert max(provider.batch_sizes) == 4 and sum(provider.admissions) == len(MIXED)
    assert len(provider.admissions) > 1  # later requests joined a running batch


async def test_late_request_joins_the_running_batch_and_leaves_first(endless: Path) -> None:
    long_r = _req("reverse: ab=", max_tokens=80)
    short_longer_prompt = _req("sort: 9876543210987654321098765=", max_tokens=3)
    short_shorter_prompt = _req("add: 1+2=", max_tokens=5)
    alone = await _alone(endless, [long_r, short_longer_prompt, short_shorter_prompt])
    provider = _provider(endless)
    try:
        long_task = asyncio.ensure_future(provider.generate(long_r))
        await _wait_for_steps(provider, 10)  # the long row is decoding, its cache has grown
        shorts = await asyncio.gather(
            provider.generate(short_longer_prompt), provider.generate(short_shorter_prompt)
        )
        assert not long_task.done()  # the short ones left while the long one still runs
        long_c = await long_task
    finally:
        await provider.aclose()
    assert [long_c.text] + [c.text for c in shorts] == alone
    assert long_c.output_tokens == 80 and long_c.finish_reason == "length"
    assert [c.output_tokens for c in shorts] == [3, 5]
    assert provider.admissions[0] == 1 and sum(provider.admissions) == 3
    assert max(provider.batch_sizes) >= 2
    assert len(long_c.chunk_gaps_s) == 79


async def test_a_caller_that_stops_waiting_frees_its_slot(endless: Path) -> None:
    provider = _provider(endless)
    await provider.prepare()  # loading is not part of the caller's wait
    try:
        with pytest.raises(TimeoutError):
            async with asyncio.timeout(0.2):  # a fraction of what 5,000 steps take
                await provider.generate(_req("sort: 12=", max_tokens=5000))
        await asyncio.sleep(0.3)
        steps = len(provider.batch_sizes)
        await asyncio.sleep(0.3)
        assert len(provider.batch_sizes) == steps  # the engine went idle
        assert steps < 4999  # it did not decode the abandoned request to the end
        after = await provider.generate(_req("add: 1+1=", max_tokens=4))
        assert after.output_tokens == 4
    finally:
        await provider.aclose()


async def test_rows_keep_their_own_sampling_settings(endless: Path) -> None:
    greedy = _req("reverse: abc=", max_tokens=16)
    nucleus_of_one = _req("reverse: abc=", max_tokens=16, temperature=1.0, top_p=1e-9)
    hot = _req("reverse: abc=", max_tokens=16, temperature=5.0)
    provider = _provider(endless)
    try:
        g, n, h = await asyncio.gather(*(provider.generate(r) for r in (greedy, nucleus_of_one, hot)))
    finally:
        await provider.aclose()
    assert max(provider.batch_sizes) == 3  # one batch, three sampling settings
    assert n.text == g.text  # top-p that keeps only the top token is greedy
    assert h.text != g.text


async def test_stop_string_ends_only_its_row(endless: Path) -> None:
    free = _req("sort: 31=", max_tokens=30)
    alone = (await _alone(endless, [free]))[0]
    stop = alone[5:7]
    provider = _provider(endless)
    try:
        a, b = await asyncio.gather(
            provider.generate(free), provider.generate(_req("sort: 31=", max_tokens=30, stop=(stop,)))
        )
    finally:
        await provider.aclose()
    assert a.text == alone and a.finish_reason == "length"
    assert b.text == alone[: alone.index(stop)] and b.finish_reason == "stop"


async def test_a_failing_step_fails_its_batch_and_the_engine_goes_on(
    endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_step = _batcher.Batcher.step
    calls = {"n": 0}

    def flaky(self: _batcher.Batcher) -> None:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        real_step(self)

    monkeypatch.setattr(_batcher.Batcher, "step", flaky)
    provider = _provider(endless)
    try:
        with pytest.raises(ProviderError, match="illegal memory access") as err:
            await provider.generate(_req("sort: 12=", max_tokens=10))
        assert err.value.kind == "internal"
        ok = await provider.generate(_req("sort: 12=", max_tokens=10))
        assert ok.output_tokens == 10
    finally:
        await provider.aclose()


def test_callers_on_several_event_loops_share_one_engine(endless: Path) -> None:
    provider = _provider(endless)
    prompts = ["sort: 1234=", "reverse: abcd=", "add: 12+34=", "sort: 4321="]
    expected = asyncio.run(_alone(endless, [_req(p, max_tokens=20) for p in prompts]))
    got: dict[int, str] = {}

    def worker(i: int) -> None:
        got[i] = asyncio.run(provider.generate(_req(prompts[i], max_tokens=20))).text

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    asyncio.run(provider.aclose())
    assert [got.get(i) for i in range(len(prompts))] == expected


async def test_close_fails_requests_in_flight(endless: Path) -> None:
    provider = _provider(endless)
    task = asyncio.ensure_future(provider.generate(_req("sort: 12=", max_tokens=5000)))
    await _wait_for_steps(provider, 3)
    await provider.aclose()
    with pytest.raises(ProviderError, match="closed"):
        await task


async def test_out_of_memory_halves_the_batch_and_requeues(
    endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A step that runs out of device memory must not turn the batch into error rows."""
    real_step = _batcher.Batcher.step
    calls = {"n": 0}

    def oom_once_at_full_batch(self: _batcher.Batcher) -> None:
        calls["n"] += 1
        if len(self.rows) == 4 and calls["n"] < 100:
            calls["n"] = 100
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real_step(self)

    requests = [_req(p, max_tokens=12) for p in ("sort: 12=", "add: 1+1=", "reverse: ab=", "sort: 4321=")]
    alone = await _alone(endless, requests)
    monkeypatch.setattr(_batcher.Batcher, "step", oom_once_at_full_batch)
    provider = _provider(endless, max_batch=4)
    try:
        got = await asyncio.gather(*(provider.generate(r) for r in requests))
    finally:
        await provider.aclose()
    assert calls["n"] >= 100  # the fault fired
    assert [c.text for c in got] == alone
    assert provider.oom_backoffs == 1 and provider.max_batch == 2
    assert max(provider.batch_sizes[provider.batch_sizes.index(4) + 1 :]) <= 2


async def test_out_of_memory_at_batch_one_says_what_to_do(
    endless: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def always_oom(self: _batcher.Batcher, rows: list) -> None:
        raise torch.OutOfMemoryError("CUDA out of memory")

    monkeypatch.setattr(_batcher.Batcher, "admit", always_oom)
    provider = _provider(endless)
    try:
        with pytest.raises(ProviderError, match="one request in the batch.*shorten") as err:
            await provider.generate(_req("sort: 12=", max_tokens=4))
    finally:
        await provider.aclose()
    assert err.value.kind == "internal"


async def test_a_prompt_that_cannot_be_rendered_fails_alone(endless: Path) -> None:
    provider = _provider(endless)
    try:
        await provider.generate(_req("sort: 1=", max_tokens=2))  # loads the tokenizer
        tok = provider._tokenizer
        real = tok.apply_chat_template

        def picky(messages, **kw):
            if "poison" in messages[0]["content"]:
                raise ValueError("template rejects this conversation")
            return real(messages, **kw)

        tok.apply_chat_template = picky
        bad, good = await asyncio.gather(
            provider.generate(_req("poison", max_tokens=3)),
            provider.generate(_req("sort: 21=", max_tokens=3)),
            return_exceptions=True,
        )
    finally:
        await provider.aclose()
    assert isinstance(bad, ProviderError) and bad.kind == "client_error"
    assert "template rejects" in str(bad)
    assert good.output_tokens == 3


@pytest.mark.parametrize("num_draft", [0, 2])
def test_a_batch_that_never_empties_keeps_no_autograd_history(endless: Path, num_draft: int) -> None:
    """Rows rotate through a batch that stays busy; its caches must hold only keys and values.
    Recorded autograd graphs chained every step to the last and grew by every activation."""
    tok = transformers.AutoTokenizer.from_pretrained(endless)
    model = transformers.AutoModelForCausalLM.from_pretrained(endless).eval()
    batcher = _batcher.Batcher(model, tok, "cpu", 4, draft=model if num_draft else None, num_draft=num_draft)
    served = 0
    for i in range(12):
        if batcher.free:
            batcher.admit(
                [
                    _batcher.Row(MIXED[(i + j) % len(MIXED)], 2 + 3 * j, 0.0, None, ())
                    for j in range(batcher.free)
                ]
            )
        batcher.step()
        served += len(batcher.evict(lambda r: False))
        if not batcher.rows:
            raise AssertionError("the batch emptied: rows must keep rotating through it")
    assert served >= 8  # rows left and joined while the batch never emptied
    held = [t for cache in batcher._caches for layer in cache.layers for t in (layer.keys, layer.values)]
    assert held and all(t.grad_fn is None and not t.requires_grad for t in held)
