"""Sampling and speculative verification for the local batcher: pure functions over tensors.

`probabilities` turns logits into the distribution a row samples from: one-hot at the argmax for
a greedy row (temperature 0), else softmax(logits / T) cut to the nucleus (top-p) and
renormalised. The same transform is applied to the draft's logits (q) and the target's (p), so
speculative decoding keeps exactly the distribution a row would have had without a draft.

`verify` is the rejection sampling of Leviathan et al. 2022 ("Fast Inference from Transformers
via Speculative Decoding") and Chen et al. 2023: draft token d_j is accepted with probability
min(1, p_j(d_j) / q_j(d_j)); at the first rejection the row's next token is drawn from
normalize(max(0, p_j - q_j)); when all k are accepted a bonus token comes from p_{k+1}. Each
emitted token then has the target's distribution. For greedy rows p and q are one-hot, so a
proposal is kept exactly when it is the target's argmax and the correction is the argmax: the
output is the target's own greedy output.
"""

from __future__ import annotations

import torch


def _per_row(x: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Shape a (rows,) setting to broadcast against (rows, ..., vocab)."""
    return x.view((-1,) + (1,) * (like.dim() - 1))


def probabilities(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Each row's sampling distribution over the vocabulary (last axis), in float32.

    `logits` is (rows, vocab) or (rows, positions, vocab); `temperature` and `top_p` are
    (rows,). Top-p keeps the smallest set of most likely tokens whose mass reaches top_p
    (at least the most likely one).
    """
    onehot = torch.nn.functional.one_hot(logits.argmax(-1), logits.shape[-1]).float()
    sampling = temperature > 0
    if not bool(sampling.any()):
        return onehot
    t = _per_row(temperature.clamp(min=1e-6), logits)
    probs = torch.softmax(logits.float() / t, dim=-1)
    if bool((top_p < 1).any()):
        sorted_p, order = probs.sort(dim=-1, descending=True)
        outside = sorted_p.cumsum(-1) - sorted_p > _per_row(top_p, logits)
        sorted_p = sorted_p.masked_fill(outside, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return torch.where(_per_row(sampling, logits), probs, onehot)


def sample(probs: torch.Tensor) -> torch.Tensor:
    """One token per row of a (rows, vocab) distribution (one-hot rows give their argmax)."""
    return torch.multinomial(probs, 1).squeeze(-1)


def choose(logits: torch.Tensor, temperature: torch.Tensor, top_p: torch.Tensor) -> torch.Tensor:
    """Next token per row from (rows, vocab) logits: argmax when every row is greedy."""
    if not bool((temperature > 0).any()):
        return logits.argmax(dim=-1)
    return sample(probabilities(logits, temperature, top_p))


def verify(p: torch.Tensor, q: torch.Tensor, drafts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Accept a prefix of each row's k draft tokens and choose the token after it.

    p: (rows, k+1, vocab) target probabilities at each draft position and one past the last;
    q: (rows, k, vocab) draft probabilities the drafts were sampled from; drafts: (rows, k).
    Returns (accepted, next): how many leading drafts each row keeps (0..k), and its next
    token (the correction after a rejection, or the bonus token after k acceptances).
    """
    rows, k = drafts.shape
    pick = drafts.unsqueeze(-1)
    p_d = p[:, :k].gather(-1, pick).squeeze(-1)
    q_d = q.gather(-1, pick).squeeze(-1)
    u = torch.rand(rows, k, device=p.device)
    kept = u * q_d < p_d  # u < p/q without dividing; q_d > 0 since d was drawn from q
    accepted = kept.int().cumprod(dim=-1).sum(dim=-1)
    at = torch.arange(rows, device=p.device)
    p_n = p[at, accepted]
    q_n = torch.cat([q, q.new_zeros(rows, 1, q.shape[-1])], dim=1)[at, accepted]
    residual = (p_n - q_n).clamp(min=0)
    mass = residual.sum(-1, keepdim=True)
    residual = torch.where(mass > 0, residual / mass.clamp(min=1e-30), p_n)
    return accepted, sample(residual)
