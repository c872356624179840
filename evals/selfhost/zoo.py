"""The demo fleet ("zoo"): real tiny causal LMs the project trains itself, so the whole pipeline
runs with real models and no downloads.

Three char-level Llama models of growing size learn three synthetic tasks of graded difficulty
(reverse a string, sort digits, add two numbers). Bigger models train longer and pass harder
items, so routing between them has something real to learn. Everything is seeded; the eval
items are drawn from a separate seed and excluded from training, so evals measure held-out skill.
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable

from routeopt.common.io import atomic_write

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast

TASKS: tuple[str, ...] = ("reverse", "sort", "add")
DIFFICULTIES: tuple[int, ...] = (1, 2, 3, 4, 5, 6)
SPECIALS: tuple[str, ...] = ("<pad>", "<bos>", "<eos>", "<unk>")
CHARS = "0123456789abcdefghijklmnopqrstuvwxyz :+=\n"
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{% if m['role'] == 'user' %}{{ m['content'] }}"
    "{% endif %}{% endfor %}"
)
EVAL_SEED_OFFSET = 1_000_003
EVAL_PER_DIFFICULTY = 75
EVAL_SHARE_OF_SPACE = 4  # at most a quarter of a level's distinct prompts is held out from training
_LETTERS = "abcdefghijklmnopqrstuvwxyz"
_TASK_MIX = ("reverse", "add", "sort", "add")  # addition is the slowest to learn: twice the share


@dataclass(frozen=True)
class Example:
    task: str
    difficulty: int
    prompt: str
    answer: str


ADD_DIGITS: dict[int, tuple[int, int]] = {1: (1, 1), 2: (2, 1), 3: (2, 2), 4: (3, 2), 5: (3, 3), 6: (4, 4)}


def _number(rng: random.Random, digits: int) -> int:
    return rng.randint(10 ** (digits - 1) if digits > 1 else 0, 10**digits - 1)


def make_example(task: str, difficulty: int, rng: random.Random) -> Example:
    """One task instance; difficulty 1..6 sets the length (reverse, sort: 2..7 characters) or
    the operand digits (add: 1+1 digits up to 4+4, see ADD_DIGITS)."""
    if task == "reverse":
        s = "".join(rng.choice(_LETTERS) for _ in range(difficulty + 1))
        return Example(task, difficulty, f"reverse: {s}=", s[::-1])
    if task == "sort":
        s = "".join(rng.choice("0123456789") for _ in range(difficulty + 1))
        return Example(task, difficulty, f"sort: {s}=", "".join(sorted(s)))
    if task == "add":
        long, short = ADD_DIGITS[difficulty]
        a, b = _number(rng, long), _number(rng, short)
        if rng.random() < 0.5:
            a, b = b, a
        return Example(task, difficulty, f"add: {a}+{b}=", str(a + b))
    raise ValueError(f"unknown zoo task {task!r}; known: {list(TASKS)}")


def prompt_space(task: str, difficulty: int) -> int:
    """How many distinct prompts a (task, difficulty) level has (see `make_example`)."""
    if task == "reverse":
        return len(_LETTERS) ** (difficulty + 1)
    if task == "sort":
        return 10 ** (difficulty + 1)
    long, short = ADD_DIGITS[difficulty]
    numbers = {d: 10 if d == 1 else 9 * 10 ** (d - 1) for d in (long, short)}
    return numbers[long] * numbers[short] * (1 if long == short else 2)  # operands in either order


def eval_count(task: str, difficulty: int, per_difficulty: int = EVAL_PER_DIFFICULTY) -> int:
    """Held-out items of a level: `per_difficulty`, but never more than a quarter of its
    distinct prompts, so training still sees most of a small level (add and sort at level 1
    have 100 prompts each)."""
    return min(per_difficulty, prompt_space(task, difficulty) // EVAL_SHARE_OF_SPACE)


def eval_examples(task: str, seed: int = 0, per_difficulty: int = EVAL_PER_DIFFICULTY) -> list[Example]:
    """The held-out eval items of one task: distinct prompts from a seed training never uses."""
    rng = random.Random(f"zoo-eval-{task}-{seed + EVAL_SEED_OFFSET}")
    out: list[Example] = []
    for d in DIFFICULTIES:
        seen: set[str] = set()
        tries = 0
        want = eval_count(task, d, per_difficulty)
        while len(seen) < want and tries < want * 200:
            tries += 1
            ex = make_example(task, d, rng)
            if ex.prompt not in seen:
                seen.add(ex.prompt)
                out.append(ex)
    return out


def write_eval_data(data_dir: Path, seed: int = 0) -> dict[str, Path]:
    """Write `<task>.jsonl` eval datasets (id, difficulty, prompt, input, answer) atomically."""
    data_dir.mkdir(parents=True, exist_ok=True)
    paths: dict[str, Path] = {}
    for task in TASKS:
        lines = []
        for n, ex in enumerate(eval_examples(task, seed)):
            row = {
                "id": f"{task}-{ex.difficulty}-{n:03d}",
                "task": task,
                "difficulty": ex.difficulty,
                "input": ex.prompt.split(": ", 1)[1][:-1],
                "prompt": ex.prompt,
                "answer": ex.answer,
            }
            lines.append(json.dumps(row, sort_keys=True))
        paths[task] = atomic_write(data_dir / f"{task}.jsonl", "\n".join(lines) + "\n")
    return paths


def build_tokenizer() -> "PreTrainedTokenizerFast":
    """A char-level tokenizer (one token per character) with a chat template that emits the raw
    prompt, so the local provider can treat zoo models like any chat checkpoint."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(SPECIALS + tuple(CHARS))}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    core.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        bos_token="<bos>",
        eos_token="<eos>",
        unk_token="<unk>",
        padding_side="left",
        chat_template=CHAT_TEMPLATE,
        model_max_length=64,
    )
    return tok


@dataclass(frozen=True)
class ModelSpec:
    """Size and training budget of one zoo model."""

    name: str
    hidden: int
    layers: int
    heads: int
    steps: int
    lr: float
    batch: int = 64
    max_difficulty: int = 6  # the smallest model also sees less: only the easier half of the tasks


ZOO_SPECS: tuple[ModelSpec, ...] = (
    ModelSpec("zoo-s", hidden=64, layers=2, heads=4, steps=1000, lr=5e-3, max_difficulty=3),
    ModelSpec("zoo-m", hidden=96, layers=3, heads=4, steps=1500, lr=5e-3),
    ModelSpec("zoo-l", hidden=128, layers=4, heads=4, steps=1500, lr=3e-3),
)


def _model_config(spec: ModelSpec, tok: "PreTrainedTokenizerFast") -> Any:
    from transformers import LlamaConfig

    return LlamaConfig(
        vocab_size=len(tok),
        hidden_size=spec.hidden,
        intermediate_size=spec.hidden * 4,
        num_hidden_layers=spec.layers,
        num_attention_heads=spec.heads,
        num_key_value_heads=spec.heads,
        max_position_embeddings=64,
        rope_theta=10000.0,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=True,
    )


def _curriculum(progress: float, max_difficulty: int = 6) -> list[float]:
    """Difficulty weights at a point in training: two levels at first, one more every 12.5% of
    the run, all by half-way; harder levels weigh a little more (they need more steps)."""
    unlocked = min(max_difficulty, 2 + int(progress / 0.125))
    return [1.0 + 0.5 * (d - 1) if d <= unlocked else 0.0 for d in DIFFICULTIES]


def sample_training_example(rng: random.Random, task: str, weights: list[float], banned: set[str]) -> Example:
    """A training example of `task` at a curriculum-weighted difficulty, never a held-out prompt."""
    while True:
        ex = make_example(task, rng.choices(DIFFICULTIES, weights)[0], rng)
        if ex.prompt not in banned:
            return ex


def _batch(
    rng: random.Random,
    tok_ids: dict[str, int],
    n: int,
    progress: float,
    banned: set[str],
    max_difficulty: int = 6,
) -> tuple["torch.Tensor", "torch.Tensor"]:
    """A right-padded batch of `<bos>prompt answer<eos>`; loss only on the answer and eos."""
    import torch

    weights = _curriculum(progress, max_difficulty)
    seqs: list[list[int]] = []
    starts: list[int] = []
    for i in range(n):
        ex = sample_training_example(rng, _TASK_MIX[i % len(_TASK_MIX)], weights, banned)
        prompt = [tok_ids["<bos>"]] + [tok_ids[c] for c in ex.prompt]
        seqs.append(prompt + [tok_ids[c] for c in ex.answer] + [tok_ids["<eos>"]])
        starts.append(len(prompt))
    width = max(len(s) for s in seqs)
    ids = torch.full((n, width), tok_ids["<pad>"], dtype=torch.long)
    labels = torch.full((n, width), -100, dtype=torch.long)
    for i, (s, p) in enumerate(zip(seqs, starts)):
        ids[i, : len(s)] = torch.tensor(s)
        labels[i, p : len(s)] = torch.tensor(s[p:])
    return ids, labels


def train_model(
    spec: ModelSpec,
    tok: "PreTrainedTokenizerFast",
    seed: int,
    banned: set[str],
    log: Callable[[str], None] = lambda _: None,
) -> Any:
    """Train one zoo model from scratch with AdamW, warmup + cosine decay, a task curriculum."""
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(_model_config(spec, tok))
    model.train()
    rng = random.Random(f"zoo-train-{spec.name}-{seed}")
    tok_ids = tok.get_vocab()
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.01)
    warmup = max(1, spec.steps // 10)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt,
        lambda s: (
            min(1.0, (s + 1) / warmup)
            * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * min(1.0, s / spec.steps))))
        ),
    )
    for step in range(spec.steps):
        ids, labels = _batch(rng, tok_ids, spec.batch, step / spec.steps, banned, spec.max_difficulty)
        loss = model(input_ids=ids, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        if step % 200 == 0 or step == spec.steps - 1:
            log(f"{spec.name} step {step}/{spec.steps} loss {loss.item():.4f}")
    model.eval()
    return model


def greedy_answers(
    model: Any, tok: "PreTrainedTokenizerFast", prompts: list[str], max_new_tokens: int = 10, batch: int = 256
) -> list[str]:
    """Greedy answers for raw prompts, batched with left padding (what the local provider does)."""
    import torch

    out: list[str] = []
    with torch.inference_mode():
        for i in range(0, len(prompts), batch):
            texts = [tok.bos_token + p for p in prompts[i : i + batch]]
            enc = tok(texts, return_tensors="pt", padding=True, add_special_tokens=False)
            gen = model.generate(
                **enc,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=tok.pad_token_id,
                eos_token_id=tok.eos_token_id,
            )
            new = gen[:, enc["input_ids"].shape[1] :]
            out.extend(tok.batch_decode(new, skip_special_tokens=True))
    return out


def pass_rates(
    model: Any, tok: "PreTrainedTokenizerFast", examples: Iterable[Example]
) -> dict[str, dict[int, float]]:
    """Exact-match pass rate per task and difficulty."""
    examples = list(examples)
    answers = greedy_answers(model, tok, [e.prompt for e in examples])
    hits: dict[tuple[str, int], list[int]] = {}
    for ex, got in zip(examples, answers):
        hits.setdefault((ex.task, ex.difficulty), []).append(int(got.strip() == ex.answer))
    table: dict[str, dict[int, float]] = {}
    for (task, d), h in sorted(hits.items()):
        table.setdefault(task, {})[d] = sum(h) / len(h)
    return table


def _save(model: Any, tok: "PreTrainedTokenizerFast", spec: ModelSpec, out: Path) -> None:
    from transformers import GenerationConfig
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    out.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        pad_token_id=tok.pad_token_id,
        do_sample=False,
        max_new_tokens=16,
    )
    model.save_pretrained(out, safe_serialization=True)
    tok.save_pretrained(out)
    atomic_write(out / "zoo_spec.json", json.dumps(asdict(spec), indent=2) + "\n")


def _load_info(path: Path, seed: int) -> dict[str, Any]:
    """The previous build's info when it used the same seed (a partial rebuild extends it)."""
    if path.exists():
        info = json.loads(path.read_text())
        if info.get("seed") == seed:
            return info
    return {"seed": seed, "models": {}}


def _build_one(
    spec: ModelSpec,
    out_dir: Path,
    seed: int,
    threads: int | None,
    measure_per_difficulty: int,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train, measure and save one model. Depends only on (spec, seed): safe in any process."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    tok = build_tokenizer()
    held_out = [ex for task in TASKS for ex in eval_examples(task, seed)]
    rank: dict[tuple[str, int], int] = {}
    measured = []
    for ex in held_out:  # the first `measure_per_difficulty` items of each level
        n = rank[ex.task, ex.difficulty] = rank.get((ex.task, ex.difficulty), -1) + 1
        if n < measure_per_difficulty:
            measured.append(ex)
    t0 = time.perf_counter()
    model = train_model(spec, tok, seed, {ex.prompt for ex in held_out}, log)
    train_s = time.perf_counter() - t0
    rates = pass_rates(model, tok, measured)
    _save(model, tok, spec, out_dir / spec.name)
    params = sum(p.numel() for p in model.parameters())
    log(f"{spec.name}: {params} params, trained in {train_s:.0f}s, pass rates {rates}")
    return {
        "params": params,
        "train_s": round(train_s, 1),
        "spec": asdict(spec),
        "build_s": round(time.perf_counter() - t0, 1),
        "threads": torch.get_num_threads(),
        "pass_rates": {t: {str(d): r for d, r in row.items()} for t, row in rates.items()},
    }


def build_zoo(
    out_dir: Path,
    seed: int = 0,
    specs: Iterable[ModelSpec] = ZOO_SPECS,
    threads: int | None = 1,
    log: Callable[[str], None] = print,
    measure_per_difficulty: int = EVAL_PER_DIFFICULTY,
    only: Iterable[str] | None = None,
    jobs: int = 1,
) -> dict:
    """Train, evaluate and save zoo models under `out_dir/<name>/`; return what was measured
    (seconds and pass rate per task x difficulty on held-out items, per model).

    Each model depends only on (seed, its spec), so `only` rebuilds a subset with the result a
    full build would give (merged into `zoo_info.json`), and `jobs` > 1 trains models in
    parallel processes (largest first) without changing any weight.
    """
    specs = list(specs)
    wanted = set(only) if only else {sp.name for sp in specs}
    unknown = wanted - {sp.name for sp in specs}
    if unknown:
        raise ValueError(f"unknown zoo model(s) {sorted(unknown)}; known: {[sp.name for sp in specs]}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    todo = [sp for sp in specs if sp.name in wanted]
    info = _load_info(out_dir / "zoo_info.json", seed) if only else {"seed": seed, "models": {}}
    t0 = time.perf_counter()
    if jobs > 1 and len(todo) > 1:
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor, as_completed

        largest_first = sorted(todo, key=lambda sp: -sp.hidden * sp.layers * sp.steps)
        with ProcessPoolExecutor(jobs, mp_context=mp.get_context("spawn")) as pool:
            futures = {
                pool.submit(_build_one, sp, out_dir, seed, threads, measure_per_difficulty): sp.name
                for sp in largest_first
            }
            for fut in as_completed(futures):
                info["models"][futures[fut]] = fut.result()
                log(f"{futures[fut]}: done")
    else:
        for sp in todo:
            info["models"][sp.name] = _build_one(sp, out_dir, seed, threads, measure_per_difficulty, log)
    info["models"] = {sp.name: info["models"][sp.name] for sp in specs if sp.name in info["models"]}
    info["wall_s"] = round(time.perf_counter() - t0, 1)
    info["jobs"] = jobs
    info["total_s"] = round(sum(m.get("build_s", m["train_s"]) for m in info["models"].values()), 1)
    atomic_write(out_dir / "zoo_info.json", json.dumps(info, indent=2, sort_keys=True) + "\n")
    return info
