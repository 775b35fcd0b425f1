"""Actions as token segments: a maximal run of loss-mask tokens inside one response row."""

from __future__ import annotations

import torch
from torch import Tensor


def action_segments(loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """Index every model-written token by the action it belongs to.

    Returns `(action_index [B, T], num_actions [B])`: `action_index` counts actions from 0 within
    each row and is -1 on observation, prompt and padding tokens. Observation tokens break an
    action, so a rollout `y0 o0 y1 o1 y2` has actions 0, 1, 2.
    """
    m = loss_mask.bool()
    prev = torch.zeros_like(m)
    prev[..., 1:] = m[..., :-1]
    starts = m & ~prev
    ordinal = torch.cumsum(starts.to(torch.long), dim=-1) - 1
    action_index = torch.where(m, ordinal, torch.full_like(ordinal, -1))
    return action_index, starts.sum(-1)


def segment_sums(values: Tensor, action_index: Tensor, num_segments: int | None = None) -> Tensor:
    """Sum `values [B, T]` per (row, action) -> `[B, A]`; tokens with index -1 are ignored."""
    b, _ = values.shape
    a = int(action_index.max().item()) + 1 if num_segments is None else num_segments
    a = max(a, 1)
    valid = action_index >= 0
    flat = torch.where(valid, action_index, torch.zeros_like(action_index))
    flat = flat + torch.arange(b, device=values.device).unsqueeze(1) * a
    out = torch.zeros(b * a, dtype=values.dtype, device=values.device)
    out.index_add_(0, flat[valid], values[valid])
    return out.view(b, a)


def broadcast_segments(per_segment: Tensor, action_index: Tensor) -> Tensor:
    """Inverse of `segment_sums`: give each token its action's value (0 outside actions)."""
    idx = action_index.clamp(min=0)
    gathered = per_segment.gather(1, idx)
    return torch.where(action_index >= 0, gathered, torch.zeros_like(gathered))
