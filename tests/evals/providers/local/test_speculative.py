"""Speculative decoding in the local provider: greedy output is exactly the target's, sampled
output keeps the target's distribution, and it works inside the continuous batcher (rows that
accept different numbers of tokens in one step, stop strings, max_tokens, abandoned callers,
out-of-memory back-off).
"""

from __future__ import annotations

import asyncio
import shutil
from collections import Counter
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from scipy import stats  # noqa: E402

from routeopt.evals.config import Candidate, ConfigError, load_config  # noqa: E402
from routeopt.evals.providers.base import GenerationSettings, Message, ProviderError, Request  # noqa: E402
from routeopt.evals.providers.local.batcher import Batcher, Row  # noqa: E402
from routeopt.evals.providers.local.provider import LocalProvider  # noqa: E402
from routeopt.evals.providers.local.speculative import probabilities, verify  # noqa: E402
from tests import REPO  # noqa: E402

ZOO = REPO / "evals" / "demo" / "zoo"
pytestmark = pytest.mark.skipif(
    not (ZOO / "zoo-l" / "config.json").exists(), reason="zoo checkpoints not built"
)


def _random_model(out: Path, scale: float, noise: float = 0.0) -> Path:
    """A random model on the zoo's tokenizer that never ends a request (special tokens cannot
    win). `scale` sharpens its next-token distributions; `noise` perturbs its output layer,
    making a draft that agrees with the noise-free model only part of the time."""
    for f in ZOO.joinpath("zoo-s").iterdir():
        if f.name != "model.safetensors":
            shutil.copy(f, out / f.name)
    config = transformers.AutoConfig.from_pretrained(out)
    config.max_position_embeddings = 256
    config.tie_word_embeddings = False  # tied, a random model mostly repeats its input token
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config)
    tok = transformers.AutoTokenizer.from_pretrained(out)
    with torch.no_grad():
        w = model.lm_head.weight
        w.add_(noise * w.std() * torch.randn(w.shape, generator=torch.Generator().manual_seed(1)))
        w.mul_(scale)
        for tid in tok.all_special_ids:
            w[tid].fill_(0.0)
    model.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def endless(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(target, draft): random models that never emit a special token, the draft a noisy copy."""
    return (
        _random_model(tmp_path_factory.mktemp("target"), 8.0),
        _random_model(tmp_path_factory.mktemp("draft"), 8.0, noise=0.7),
    )


def _candidate(model: Path, draft: Path | None = None, k: int = 3, max_batch: int = 64, **extra) -> Candidate:
    spec = {"speculative": {"model": str(draft), "num_speculative_tokens": k}} if draft else {}
    return Candidate(
        name="t",
        provider="local",
        model=str(model),
        variant="fp32",
        device="cpu",
        gpu_hour_usd=1.0,
        max_concurrency=max_batch,
        **spec,
        **extra,
    )


def _req(prompt: str, max_tokens: int = 12, temperature: float = 0.0, stop: tuple[str, ...] = ()) -> Request:
    return Request(
        (Message("user", prompt),),
        GenerationSettings(max_tokens=max_tokens, temperature=temperature, stop=stop),
    )


async def _serve(candidate: Candidate, requests: list[Request]) -> list:
    provider = LocalProvider(candidate)
    try:
        return await asyncio.gather(*(provider.generate(r) for r in requests))
    finally:
        await provider.aclose()


async def test_max_tokens_and_stop_strings_end_exactly_their_row(endless) -> None:
    """A step may accept up to k+1 tokens; a row still ends at its own max_tokens or stop
    string, and greedy output equals the target's alone."""
    target, draft = endless
    free = _req("sort: 31=", max_tokens=30)
    alone = (await _serve(_candidate(target), [free]))[0].text
    stop = alone[9:11]
    requests = [
        free,
        _req("sort: 31=", max_tokens=30, stop=(stop,)),
        _req("add: 1+2=", 7),
        _req("reverse: abc=", 1),
    ]
    plain = await _serve(_candidate(target), requests)
    spec = await _serve(_candidate(target, target, k=4), requests)  # self-draft: all accepted
    assert [c.text for c in spec] == [c.text for c in plain]
    assert spec[0].text == alone and spec[0].finish_reason == "length"
    assert spec[1].text == alone[: alone.index(stop)] and spec[1].finish_reason == "stop"
    assert [c.output_tokens for c in spec[2:]] == [7, 1]
    assert spec[0].accepted_draft_tokens == spec[0].draft_tokens  # the draft is the target


async def test_an_abandoned_caller_frees_its_slot_while_speculating(endless) -> None:
    target, draft = endless
    provider = LocalProvider(_candidate(target, draft))
    await provider.prepare()
    try:
        # cancelled once the engine is stepping it, far from its 200 tokens (not by a timer,
        # which an idle machine can beat)
        task = asyncio.create_task(provider.generate(_req("sort: 12=", max_tokens=200)))
        while not provider.batch_sizes:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await asyncio.sleep(0.3)
        steps = len(provider.batch_sizes)
        await asyncio.sleep(0.3)
        assert len(provider.batch_sizes) == steps  # the engine went idle
        after = await provider.generate(_req("add: 1+1=", max_tokens=6))
        assert after.output_tokens == 6 and after.draft_tokens > 0
    finally:
        await provider.aclose()


async def test_out_of_memory_while_speculating_requeues(endless, monkeypatch) -> None:
    target, draft = endless
    real = Batcher._speculate
    fired = []

    def oom_once_at_full_batch(self: Batcher) -> None:
        if len(self.rows) == 4 and not fired:
            fired.append(1)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        real(self)

    requests = [_req(p, max_tokens=12) for p in ("sort: 12=", "add: 1+1=", "reverse: ab=", "sort: 4321=")]
    alone = await _serve(_candidate(target), requests)
    monkeypatch.setattr(Batcher, "_speculate", oom_once_at_full_batch)
    provider = LocalProvider(_candidate(target, draft, max_batch=4))
    try:
        got = await asyncio.gather(*(provider.generate(r) for r in requests))
    finally:
        await provider.aclose()
    assert fired and provider.oom_backoffs == 1 and provider.max_batch == 2
    assert [c.text for c in got] == [c.text for c in alone]


def test_verify_keeps_the_target_distribution_at_every_position() -> None:
    """Rejection sampling over fixed p (target) and q (draft): whatever q proposes, the token
    emitted at each position is distributed as p there (chi-square, 200,000 rows)."""
    gen = torch.Generator().manual_seed(0)
    rows, k, vocab = 200_000, 3, 6
    p1 = torch.softmax(3 * torch.randn(k + 1, vocab, generator=gen), -1)
    q1 = torch.softmax(3 * torch.randn(k, vocab, generator=gen), -1)
    p, q = p1.expand(rows, -1, -1), q1.expand(rows, -1, -1)
    torch.manual_seed(1)
    drafts = torch.multinomial(q1, rows, replacement=True).T  # (rows, k) drawn from q
    accepted, nxt = verify(p, q, drafts)
    emitted = torch.cat([drafts, nxt[:, None]], dim=1)
    for j in range(k + 1):
        reached = accepted >= j  # rows that emitted a token at position j
        token = torch.where(accepted[reached] == j, nxt[reached], emitted[reached, j])
        _assert_same_distribution(torch.bincount(token, minlength=vocab).double(), p1[j])
    assert 0 < float(accepted.float().mean()) < k  # both paths ran: rejections and bonuses


def test_greedy_rows_accept_exactly_the_targets_argmax() -> None:
    logits = torch.tensor([[[0.0, 5, 1], [3, 0, 1], [0, 0, 9]]])  # target argmax 1, 0, 2
    p = probabilities(logits, torch.tensor([0.0]), torch.tensor([1.0]))
    q = probabilities(torch.tensor([[[0.0, 9, 0], [0, 9, 0]]]), torch.tensor([0.0]), torch.tensor([1.0]))
    for _ in range(20):  # whatever the random draws
        n, nxt = verify(p, q, torch.tensor([[1, 1]]))
        assert (n.item(), nxt.item()) == (1, 0)  # keeps 1, rejects 1, corrects to 0
        n, nxt = verify(p, q, torch.tensor([[1, 0]]))
        assert (n.item(), nxt.item()) == (2, 2)  # keeps both, bonus = argmax of the last


def _exact_marginals(
    model, prompt_ids: list[int], temp: float, top_p: float, vocab: int
) -> list[torch.Tensor]:
    """The target's own distribution of output tokens 1, 2 and 3 (summing over the earlier
    ones), with its temperature and top-p: what sampling without a draft gives."""
    t, tp = torch.tensor([temp]), torch.tensor([top_p])

    def next_dist(prefixes: torch.Tensor) -> torch.Tensor:
        logits = model(input_ids=prefixes).logits[:, -1]
        return probabilities(logits, t.expand(len(prefixes)), tp.expand(len(prefixes)))

    base = torch.tensor([prompt_ids])
    d1 = next_dist(base)[0]
    toks = torch.arange(vocab)
    two = torch.cat([base.expand(vocab, -1), toks[:, None]], 1)
    d2 = next_dist(two)  # (t1, t2)
    m2 = (d1[:, None] * d2).sum(0)
    three = torch.cat([two.repeat_interleave(vocab, 0), toks.repeat(vocab)[:, None]], 1)
    d3 = next_dist(three).view(vocab, vocab, vocab)
    m3 = (d1[:, None, None] * d2[:, :, None] * d3).sum((0, 1))
    return [d1, m2, m3]


def _assert_same_distribution(observed: torch.Tensor, expected: torch.Tensor) -> None:
    n = observed.sum()
    expected = expected.double() / expected.double().sum()
    exp = expected * n
    assert observed[exp == 0].sum() == 0, "a token outside the target's top-p was emitted"
    big = exp >= 5  # pool small cells, as the chi-square approximation needs
    obs_cells = torch.cat([observed[big], observed[~big].sum()[None]])
    exp_cells = torch.cat([exp[big], exp[~big].sum()[None]])
    keep = exp_cells > 0
    result = stats.chisquare(obs_cells[keep], exp_cells[keep])
    tv = 0.5 * (observed / n - expected).abs().sum()
    assert result.pvalue > 1e-3 and tv < 0.05, (result.pvalue, tv)


@pytest.mark.parametrize("temp,top_p", [(1.0, 1.0), (0.7, 0.8)])
def test_sampled_tokens_keep_the_targets_distribution_through_the_batcher(
    endless, temp: float, top_p: float
) -> None:
    """Rows sampled with a disagreeing draft, batched 300 at a time, produce output tokens
    2 and 3 (the first verified ones) with the target's exact distribution."""
    target_dir, draft_dir = endless
    tok = transformers.AutoTokenizer.from_pretrained(target_dir)
    tok.padding_side = "left"
    target = transformers.AutoModelForCausalLM.from_pretrained(target_dir).eval()
    draft = transformers.AutoModelForCausalLM.from_pretrained(draft_dir).eval()
    prompt = tok.bos_token + "sort: 31="
    vocab = target.config.vocab_size
    counts = [Counter(), Counter(), Counter()]
    proposed = accepted = 0
    torch.manual_seed(2)
    with torch.inference_mode():
        expected = _exact_marginals(
            target, tok(prompt, add_special_tokens=False)["input_ids"], temp, top_p, vocab
        )
        batcher = Batcher(target, tok, "cpu", 300, draft=draft, num_draft=2)
        for _ in range(10):
            rows = [Row(prompt, 3, temp, top_p, ()) for _ in range(300)]
            batcher.admit(rows)
            while batcher.rows:
                batcher.step()
                batcher.evict(lambda r: False)
            for r in rows:
                for j, t in enumerate(r.ids):
                    counts[j][t] += 1
                proposed, accepted = proposed + r.drafted, accepted + r.accepted
    assert 0.2 < accepted / proposed < 0.9  # the draft is often right, often wrong
    for j in range(3):
        observed = torch.tensor([counts[j][t] for t in range(vocab)], dtype=torch.float64)
        _assert_same_distribution(observed, expected[j])


async def test_a_draft_with_another_vocabulary_is_refused(tmp_path) -> None:
    bench = pytest.importorskip("tests.benchmarks").load("gpu_check")
    other = bench.build_checkpoint(tmp_path / "other", bench.ARCH_TINY)["path"]
    provider = LocalProvider(_candidate(ZOO / "zoo-l", Path(other)))
    try:
        with pytest.raises(
            ProviderError,
            match="cannot draft for this model: the tokenizers "
            r"differ \(45 vs 512 tokens.*share the target's tokenizer",
        ) as err:
            await provider.generate(_req("sort: 21="))
    finally:
        await provider.aclose()
    assert err.value.kind == "config"  # our configuration, not the model: excluded from pass rates


def _write(tmp_path: Path, body: str) -> Path:
    path = tmp_path / "routeopt.yaml"
    path.write_text(body)
    return path


def test_config_names_a_draft_by_candidate_and_resolves_it(tmp_path) -> None:
    shutil.copytree(ZOO / "zoo-s", tmp_path / "small")
    cfg = load_config(
        _write(
            tmp_path,
            """
candidates:
  - {name: s, provider: local, model: small, variant: int8, gpu_hour_usd: 1}
  - {name: l, provider: local, model: /abs/l, gpu_hour_usd: 2,
     speculative: {model: s, num_speculative_tokens: 4}}
  - {name: l2, provider: local, model: /abs/l, gpu_hour_usd: 2,
     speculative: {model: small, num_speculative_tokens: 2, variant: bf16}}
""",
        )
    )
    l_, l2 = cfg.candidates[1].speculative, cfg.candidates[2].speculative
    assert (l_.model, l_.variant, l_.num_speculative_tokens) == (str(tmp_path / "small"), "int8", 4)
    assert (l2.model, l2.variant) == (str(tmp_path / "small"), "bf16")


@pytest.mark.parametrize(
    "candidates, message",
    [
        (
            "  - {name: a, provider: openai, model: m, input_price_per_mtok: 1,"
            " speculative: {model: x, num_speculative_tokens: 2}}",
            "candidates.0: Value error, speculative: only `local` candidates",
        ),
        (
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1,"
            " speculative: {model: x, num_speculative_tokens: 0}}",
            "candidates.0.speculative.num_speculative_tokens",
        ),
        (
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1, speculative: {model: x}}",
            "candidates.0.speculative.num_speculative_tokens: Field required",
        ),
        (
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1,"
            " speculative: {model: x, num_speculative_tokens: 2, k: 3}}",
            "candidates.0.speculative.k",
        ),
        (
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1,"
            " speculative: {model: a, num_speculative_tokens: 2}}",
            "candidates.0.speculative.model: candidate 'a' names itself",
        ),
        (
            "  - {name: api, provider: openai, model: m, input_price_per_mtok: 1}\n"
            "  - {name: a, provider: local, model: m, gpu_hour_usd: 1,"
            " speculative: {model: api, num_speculative_tokens: 2}}",
            "candidates.1.speculative.model: draft candidate 'api' is a 'openai' candidate",
        ),
    ],
)
def test_bad_speculative_config_names_the_field(tmp_path, candidates: str, message: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(_write(tmp_path, "candidates:\n" + candidates + "\n"))
    assert message in str(err.value) and "routeopt.yaml" in str(err.value)
