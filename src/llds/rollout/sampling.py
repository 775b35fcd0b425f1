"""Next-token sampling: temperature, top-k, top-p (nucleus), or greedy.

With a seed per row (Gumbel-max sampling over counter-based noise, `llds.rollout.noise`), what
a rollout samples depends only on its own seed, the position it samples at and its logits, not
on which other rows share its batch: the same step gives the same rollouts on 1 process or 8,
with any generation chunk size, on the eager and on the static-cache decode loop.
"""

from __future__ import annotations

import torch
from torch import Tensor

from llds.rollout.noise import gumbel_noise


def filter_logits(scores: Tensor, *, top_k: int = 0, top_p: float = 1.0) -> Tensor:
    """Set logits outside the top-k / nucleus to -inf (always keeps the best token)."""
    if top_k and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[..., -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        probs = torch.softmax(sorted_scores, dim=-1)
        # drop a token when the mass strictly before it already reaches top_p
        drop = (probs.cumsum(-1) - probs) >= top_p
        sorted_scores = sorted_scores.masked_fill(drop, float("-inf"))
        scores = torch.full_like(scores, float("-inf")).scatter(-1, order, sorted_scores)
    return scores


def sample_next_token(
    logits: Tensor,
    *,
    row_seeds: Tensor,
    positions: Tensor | None = None,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> Tensor:
    """Sample one token per row from `logits [N, V]`; `temperature == 0` picks the argmax.

    Row `r` samples with counter-based noise of (`row_seeds[r]`, `positions[r]`), both int64
    `[N]`, by Gumbel-max: `argmax(scores / T + Gumbel)` is an exact sample of
    `softmax(scores / T)`.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    rows = (logits.shape[0],)
    if positions is None or tuple(row_seeds.shape) != rows or tuple(positions.shape) != rows:
        got = None if positions is None else tuple(positions.shape)
        raise ValueError(
            f"row_seeds and positions must both have shape {rows}, got "
            f"{tuple(row_seeds.shape)} and {got}"
        )
    scores = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
    device = scores.device
    noise = gumbel_noise(row_seeds.to(device), positions.to(device), scores.shape[-1])
    return (scores + noise).argmax(dim=-1)
