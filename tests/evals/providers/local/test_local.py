"""The local provider against the committed zoo checkpoints: real generation, real batching."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from routeopt.evals.config import Candidate  # noqa: E402
from routeopt.evals.providers import make_provider  # noqa: E402
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request  # noqa: E402
from routeopt.evals.providers.local.provider import LocalProvider, create  # noqa: E402
from tests import REPO  # noqa: E402

ZOO = REPO / "evals" / "demo" / "zoo"
pytestmark = pytest.mark.skipif(
    not (ZOO / "zoo-l" / "config.json").exists(), reason="zoo checkpoints not built"
)

# sorting is the zoo's most reliable skill; 4-5 digit strings, all different
DIGITS = ["4213", "9870", "5512", "30718", "6642", "12093", "8181", "73520", "2946", "55031", "9076", "31482"]


def _candidate(name: str = "zoo-l", variant: str = "fp32", model: str | None = None) -> Candidate:
    return Candidate(
        name=f"{name}-{variant}",
        provider="local",
        model=model or str(ZOO / name),
        variant=variant,
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=8,
    )


def _req(prompt: str, max_tokens: int = 12, stop: tuple[str, ...] = ()) -> Request:
    return Request((Message("user", prompt),), GenerationSettings(max_tokens=max_tokens, stop=stop))


@pytest.fixture
async def zoo_l():
    provider = create(_candidate())
    yield provider
    await provider.aclose()


async def test_registry_builds_local_provider() -> None:
    provider = make_provider(_candidate())
    assert isinstance(provider, LocalProvider)
    assert provider._model is None  # nothing loads before the first request
    await provider.aclose()


async def test_correct_answers_and_exact_accounting(zoo_l: LocalProvider) -> None:
    c = await zoo_l.generate(_req("sort: 73520="))
    assert c.text == "02357"
    assert c.finish_reason == "stop"
    assert c.input_tokens == len("sort: 73520=") + 1  # one token per char plus <bos>
    assert c.output_tokens == 5 and not c.tokens_estimated
    assert c.ttft_s is not None and 0 < c.ttft_s <= c.latency_s
    assert len(c.chunk_gaps_s) == 4 and all(g > 0 for g in c.chunk_gaps_s)  # between 5 tokens
    rev = await zoo_l.generate(_req("reverse: abc="))
    assert rev.text == "cba"


async def test_concurrent_calls_are_batched_and_each_gets_its_own_answer(zoo_l: LocalProvider) -> None:
    results = await asyncio.gather(*(zoo_l.generate(_req(f"sort: {d}=")) for d in DIGITS))
    right = sum(r.text == "".join(sorted(d)) for r, d in zip(results, DIGITS))
    assert right >= len(DIGITS) - 1, [r.text for r in results]
    assert max(zoo_l.batch_sizes) > 1
    assert sum(zoo_l.admissions) == len(DIGITS)
    assert all(b <= zoo_l.max_batch for b in zoo_l.batch_sizes)


async def test_stop_sequence_truncates(zoo_l: LocalProvider) -> None:
    c = await zoo_l.generate(_req("sort: 97531=", stop=("5",)))
    assert c.text == "13"
    assert c.finish_reason == "stop"
    assert c.output_tokens == 2


async def test_max_tokens_gives_length(zoo_l: LocalProvider) -> None:
    short, full = await asyncio.gather(
        zoo_l.generate(_req("sort: 97531=", max_tokens=2)), zoo_l.generate(_req("sort: 97531="))
    )
    assert short.text == "13" and short.finish_reason == "length" and short.output_tokens == 2
    assert full.text == "13579" and full.finish_reason == "stop"


@pytest.mark.parametrize("variant", ["bf16", "fp16", "int8", "fp8", "int8-dyn", "fp8-dyn"])
async def test_variant_code_paths_on_cpu(variant: str) -> None:
    provider = create(_candidate(variant=variant))
    try:
        results = await asyncio.gather(*(provider.generate(_req(f"sort: {d}=")) for d in DIGITS))
        right = sum(r.text == "".join(sorted(d)) for r, d in zip(results, DIGITS))
        assert right >= len(DIGITS) - 2, [r.text for r in results]
        kinds = {type(m).__name__ for m in provider._model.modules()}
        quantized = {
            "int8": "Int8Linear",
            "fp8": "Fp8Linear",
            "int8-dyn": "Int8DynLinear",
            "fp8-dyn": "Fp8DynLinear",
        }
        if variant in quantized:
            assert quantized[variant] in kinds
        else:
            dtype = next(provider._model.parameters()).dtype
            assert str(dtype).endswith("bfloat16" if variant == "bf16" else "float16")
    finally:
        await provider.aclose()


async def test_missing_checkpoint_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "zoo-x"
    provider = create(_candidate(model=str(missing)))
    with pytest.raises(ProviderError, match=str(missing)) as err:
        await provider.generate(_req("sort: 321="))
    assert err.value.kind == "config" and not err.value.retryable


async def test_closed_provider_refuses() -> None:
    provider = create(_candidate("zoo-s"))
    await provider.aclose()
    with pytest.raises(ProviderError, match="closed"):
        await provider.generate(_req("reverse: abc="))


async def test_within_keep_loaded_a_candidate_loads_once_and_answers_the_same() -> None:
    """The preflight's provider and each suite's are distinct providers of one candidate: inside
    `keep_loaded` they share one loaded model (the same object), answer as a fresh load does,
    and another candidate never gets it; after the block, a provider loads its own again."""
    from routeopt.evals.providers.local.provider import keep_loaded

    fresh = create(_candidate("zoo-s"))
    want = await fresh.generate(_req("reverse: abc="))
    await fresh.aclose()
    with keep_loaded():
        first = create(_candidate("zoo-s"))
        await first.generate(_req("reverse: abc="))
        model = first._model
        await first.aclose()
        with keep_loaded():  # nested: the outer block keeps it
            second = create(_candidate("zoo-s"))
            got = await second.generate(_req("reverse: abc="))
            assert second._model is model
            await second.aclose()
        other = create(_candidate("zoo-s", variant="bf16"))
        await other.generate(_req("reverse: abc="))
        assert other._model is not model
        await other.aclose()
    assert (got.text, got.output_tokens, got.finish_reason) == (
        want.text,
        want.output_tokens,
        want.finish_reason,
    )
    after = create(_candidate("zoo-s"))
    await after.generate(_req("reverse: abc="))
    assert after._model is not model
    await after.aclose()


def test_engines_side_by_side_share_the_cores(monkeypatch) -> None:
    """The cores counted are those this process may run on: a pinned engine (`bench replay
    --pin`) on one of a machine's 16 starts one thread, not four."""
    from routeopt.evals.providers.local import provider as local

    def cores(n: int) -> None:
        monkeypatch.setattr(local.os, "sched_getaffinity", lambda pid: set(range(n)))

    monkeypatch.delenv("ROUTEOPT_TORCH_THREADS", raising=False)
    monkeypatch.setattr(local.os, "cpu_count", lambda: 16)
    cores(1)
    assert local._cpu_threads() == 1
    cores(2)
    assert local._cpu_threads() == 2
    with local.sharing_cpu(5):
        assert local._cpu_threads() == 1
        cores(16)
        assert local._cpu_threads() == 3
        with local.sharing_cpu(1):
            assert local._cpu_threads() == 4  # at most 4
        assert local._cpu_threads() == 3
        monkeypatch.setenv("ROUTEOPT_TORCH_THREADS", "7")
        assert local._cpu_threads() == 7
    monkeypatch.delenv("ROUTEOPT_TORCH_THREADS")
    assert local._cpu_threads() == 4
