"""GRPO group-relative advantages."""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from llds.algo.arguments import check_tensors


def group_index(
    group_ids: Tensor | Sequence[Hashable], device: torch.device | None = None
) -> Tensor:
    """Map group ids (ints, strings, tuples) to dense indices 0..G-1 in first-seen order."""
    if isinstance(group_ids, Tensor):
        _, inverse = torch.unique(group_ids, return_inverse=True)
        return inverse.to(device or group_ids.device)
    seen: dict[Hashable, int] = {}
    idx = [seen.setdefault(g, len(seen)) for g in group_ids]
    return torch.tensor(idx, dtype=torch.long, device=device)


def group_advantages(
    rewards: Tensor,
    group_ids: Tensor | Sequence[Hashable],
    *,
    normalize_std: bool = True,
    eps: float = 1e-6,
) -> Tensor:
    """GRPO advantages: each reward relative to the other rollouts of the same prompt.

    `A_i = (r_i - mean_g) / (std_g + eps)` with the unbiased std of group g, or `r_i - mean_g`
    when `normalize_std=False` (Dr. GRPO). Groups of size 1 and groups whose rewards are all
    equal get exactly 0 (not a rounding residue divided by `eps`). Group ids must identify the
    prompt uniquely: pooling two prompts into one group is a silent bug. A reward that is NaN
    or infinite is an error naming its row (it would poison its group).
    """
    check_tensors("group_advantages", rewards=rewards)
    if rewards.dim() != 1:
        raise ValueError(f"rewards must be 1-D [B], got shape {tuple(rewards.shape)}")
    r = rewards.to(torch.float32) if not rewards.is_floating_point() else rewards
    finite = torch.isfinite(r)
    if not bool(finite.all()):  # one NaN would make its whole group's advantages NaN
        bad = (~finite).nonzero().flatten()
        raise ValueError(
            f"rewards: {bad.numel()} of {r.numel()} are not finite (row {int(bad[0])}: "
            f"{float(r[bad[0]])}); a reward function returned NaN or Inf"
        )
    idx = group_index(group_ids, device=r.device)
    if idx.numel() != r.numel():
        raise ValueError(f"{r.numel()} rewards but {idx.numel()} group ids")
    n_groups = int(idx.max().item()) + 1 if idx.numel() else 0
    count = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(
        0, idx, torch.ones_like(r)
    )
    total = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, idx, r)
    mean = total / count
    centered = r - mean[idx]
    if normalize_std:
        sq = torch.zeros(n_groups, dtype=r.dtype, device=r.device).index_add_(0, idx, centered**2)
        std = torch.sqrt(sq / (count - 1).clamp(min=1))
        adv = centered / (std[idx] + eps)
    else:
        adv = centered
    lo = torch.full((n_groups,), float("inf"), dtype=r.dtype, device=r.device).scatter_reduce(
        0, idx, r, reduce="amin"
    )
    hi = torch.full((n_groups,), float("-inf"), dtype=r.dtype, device=r.device).scatter_reduce(
        0, idx, r, reduce="amax"
    )
    degenerate = (count[idx] < 2) | (lo[idx] == hi[idx])
    return torch.where(degenerate, torch.zeros_like(adv), adv)
