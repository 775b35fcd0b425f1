"""Masked reductions and the loss aggregation modes shared by every loss in `llds.algo`.

Masked positions are excluded with `torch.where`, never by multiplying: padded positions may
hold -inf or NaN log-probs, and `0 * inf` would poison the result.
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from llds.algo.arguments import check_tensors
from llds.config.algo import Aggregation

AGGREGATIONS: tuple[str, ...] = get_args(Aggregation)


def masked_fill_zero(values: Tensor, mask: Tensor) -> Tensor:
    """`values` where `mask` is true, exactly 0 elsewhere (safe for inf/NaN at masked positions)."""
    return torch.where(
        mask.bool(), values, torch.zeros((), dtype=values.dtype, device=values.device)
    )


def masked_sum(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Sum of `values` over positions where `mask` is true."""
    filled = masked_fill_zero(values, mask)
    return filled.sum() if dim is None else filled.sum(dim)


def masked_mean(values: Tensor, mask: Tensor, dim: int | None = None) -> Tensor:
    """Mean over masked positions; 0 (not NaN) where nothing is masked in."""
    check_tensors("masked_mean", values=values, mask=mask)
    total = masked_sum(values, mask, dim)
    count = mask.bool().sum() if dim is None else mask.bool().sum(dim)
    return total / count.clamp(min=1).to(total.dtype)


def masked_max(values: Tensor, mask: Tensor) -> Tensor:
    """Max over masked positions; 0 when the mask is empty. Computed without asking the device
    whether the mask is empty (a GPU tensor read on the host waits for its queue to drain)."""
    return _masked_extreme(values, mask, torch.amax, float("-inf"))


def masked_min(values: Tensor, mask: Tensor) -> Tensor:
    """Min over masked positions; 0 when the mask is empty (see `masked_max`)."""
    return _masked_extreme(values, mask, torch.amin, float("inf"))


def _masked_extreme(values: Tensor, mask: Tensor, reduce, neutral: float) -> Tensor:
    m = mask.bool()
    filled = torch.where(m, values, torch.full_like(values, neutral))
    zero = torch.zeros((), dtype=values.dtype, device=values.device)
    return torch.where(m.any(), reduce(filled), zero)


def check_aggregation(mode: str) -> None:
    if mode not in AGGREGATIONS:
        raise ValueError(f"aggregation must be one of {AGGREGATIONS}, got {mode!r}")


def aggregate(
    values: Tensor,
    mask: Tensor,
    mode: str,
    *,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    norm_length: float | None = None,
) -> Tensor:
    """Reduce per-token `values [B, T]` to a scalar loss.

    - ``token-mean``: sum over all masked tokens / number of masked tokens.
    - ``seq-mean-token-mean``: per row mean over its masked tokens, then mean over rows that
      have at least one masked token.
    - ``seq-mean-token-sum``: per row sum, then mean over rows with a masked token.
    - ``seq-mean-token-sum-norm`` (Dr. GRPO): per row sum divided by a constant length
      (`norm_length`, default T), then mean over rows with a masked token.

    `num_sequences` / `num_tokens` override the denominators so that gradient accumulation
    over micro-batches reproduces the loss of the whole mini-batch exactly: pass the
    mini-batch totals and sum the micro-batch losses.
    """
    check_aggregation(mode)
    m = mask.bool()
    if mode == "token-mean":
        denom = m.sum() if num_tokens is None else num_tokens
        return masked_sum(values, m) / _as_positive(denom, values)
    row_sum = masked_sum(values, m, dim=-1)
    row_len = m.sum(-1)
    if mode == "seq-mean-token-mean":
        row_val = row_sum / row_len.clamp(min=1).to(row_sum.dtype)
    elif mode == "seq-mean-token-sum":
        row_val = row_sum
    else:
        length = float(values.shape[-1]) if norm_length is None else float(norm_length)
        row_val = row_sum / length
    denom = (row_len > 0).sum() if num_sequences is None else num_sequences
    return row_val.sum() / _as_positive(denom, values)


def _as_positive(denom: float | Tensor, like: Tensor) -> Tensor:
    d = torch.as_tensor(denom, dtype=like.dtype, device=like.device)
    return d.clamp(min=1.0) if d.is_floating_point() else d
