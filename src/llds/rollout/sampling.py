"""Next-token sampling: temperature, top-k, top-p (nucleus), or greedy.

With one generator per row (Gumbel-max sampling), what a rollout samples depends only on its
own seed and logits, not on which other rows share its batch: the same step gives the same
rollouts on 1 process or 8, with any generation chunk size.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


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
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    generator: torch.Generator | None = None,
    row_generators: Sequence[torch.Generator] | None = None,
) -> Tensor:
    """Sample one token per row from `logits [N, V]`; `temperature == 0` picks the argmax.

    `row_generators` (one per row) switches to Gumbel-max sampling with per-row noise:
    `argmax(scores / T + Gumbel)` is an exact sample of `softmax(scores / T)`.
    """
    if temperature == 0:
        return logits.argmax(dim=-1)
    scores = filter_logits(logits.float() / temperature, top_k=top_k, top_p=top_p)
    if row_generators is not None:
        if len(row_generators) != scores.shape[0]:
            raise ValueError(f"{len(row_generators)} generators for {scores.shape[0]} rows")
        v = scores.shape[-1]
        u = torch.stack([torch.rand(v, generator=g, device=g.device) for g in row_generators]).to(
            scores.device
        )
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-20, max=1.0 - 1e-7)))
        return (scores + gumbel).argmax(dim=-1)
    probs = torch.softmax(scores, dim=-1)
    if generator is not None and generator.device != probs.device:
        # a generator draws only on its own device (a seeded CPU generator with a GPU model, as
        # `llds probe` makes one): sample there and bring the tokens back
        return (
            torch.multinomial(probs.to(generator.device), 1, generator=generator)
            .squeeze(-1)
            .to(logits.device)
        )
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)
