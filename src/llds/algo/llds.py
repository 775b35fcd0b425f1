"""LLDS: likelihood-preserving regularization against Lazy Likelihood Displacement.

Deng et al., "On GRPO Collapse in Search-R1: The Lazy Likelihood-Displacement Death Spiral"
(arXiv 2512.04220). Per token, `d = log pi_old - log pi_theta` is positive when the update
lowered the token's likelihood. For responses with non-negative advantage (the preserving set),
LLDS penalizes `max(0, d)` inside gated units whose summed `d` is positive:

    L = 1/|Y_pre| sum_{i in Y_pre} 1/|y_i| sum_t g_{i,t} sum_k w_{i,t,k} max(0, d_{i,t,k})

Gates are computed from detached values; gradient flows only through `log_probs`.
"""

from __future__ import annotations

from typing import get_args

import torch
from torch import Tensor

from llds.algo.arguments import check_tensors
from llds.algo.masking import aggregate, masked_fill_zero
from llds.algo.segments import action_segments, broadcast_segments, segment_sums
from llds.config.algo import Gate, LLDSAggregation, LLDSConfig, check_arguments

GATES: tuple[str, ...] = get_args(Gate)
LLDS_AGGREGATIONS: tuple[str, ...] = get_args(LLDSAggregation)


def preserving_mask(advantages: Tensor, loss_mask: Tensor) -> Tensor:
    """Tokens LLDS may protect: model tokens whose advantage is >= 0, `[B, T]` bool.

    With per-response advantages `[B]` this is the paper's set of responses with `A_i >= 0`;
    with token-level advantages `[B, T]` each token uses its own sign.
    """
    mask = loss_mask.bool()
    if advantages.dim() == 1:
        return mask & (advantages >= 0).unsqueeze(-1)
    if advantages.shape != loss_mask.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] = {tuple(loss_mask.shape)}, "
            f"got {tuple(advantages.shape)}"
        )
    return mask & (advantages >= 0)


def llds_gate(displacement: Tensor, loss_mask: Tensor, gate: str = "action") -> Tensor:
    """Per-token 0/1 gate from the detached displacement `d` `[B, T]`.

    - ``token``: always open (selectivity comes only from `max(0, d)`).
    - ``response``: open for every token of a row whose summed `d` over model tokens is > 0.
    - ``action``: open for every token of an action whose summed `d` is > 0.
    """
    mask = loss_mask.bool()
    d = masked_fill_zero(displacement.detach(), mask)
    if gate == "token":
        return mask.clone()
    if gate == "response":
        return mask & (d.sum(-1, keepdim=True) > 0)
    if gate == "action":
        action_index, _ = action_segments(mask)
        per_action = segment_sums(d, action_index)
        return mask & (broadcast_segments(per_action, action_index) > 0)
    raise ValueError(f"gate must be one of {GATES}, got {gate!r}")


def llds_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    coef: float = 0.2,
    gate: str = "action",
    answer_mask: Tensor | None = None,
    answer_weight: float = 1.0,
    aggregation: str = "seq-mean-token-mean",
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The LLDS penalty, already multiplied by `coef`.

    Args:
        log_probs: `[B, T]` log pi_theta of the taken tokens (with gradient).
        old_log_probs: `[B, T]` log pi_old, recomputed by the trainer before the first update.
        advantages: `[B]` or `[B, T]`; only tokens with advantage >= 0 are protected.
        loss_mask: `[B, T]` 1 on model-written tokens, 0 on prompt, observations and padding.
        gate: ``"action"`` (default, best in the paper's ablation), ``"response"`` or ``"token"``.
        answer_mask: `[B, T]` final-answer tokens (LLDS-MA); they get weight `answer_weight`.
            Gates always use the unweighted signed sums.
        aggregation: ``"seq-mean-token-mean"`` (the paper's Eq. 4: mean over preserving
            responses of each response's penalty sum divided by its model-token count) or
            ``"token-mean"`` (the authors' code: penalty summed over the batch divided by the
            model-token count of all responses).
        num_sequences / num_tokens: override the denominators (|Y_pre| for the paper's form,
            the model-token count for token-mean) to accumulate gradients over micro-batches.

    Note `d == 0` on the first optimizer step of a rollout batch (pi_theta == pi_old), so LLDS
    acts from the second step on.
    """
    check_tensors(
        "llds_loss",
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    if answer_mask is not None:
        check_tensors("llds_loss", answer_mask=answer_mask)
    check_arguments(LLDSConfig, "llds_loss", coef=coef, answer_weight=answer_weight)
    if aggregation not in LLDS_AGGREGATIONS:
        raise ValueError(
            f"LLDS aggregation must be one of {LLDS_AGGREGATIONS}, got {aggregation!r}"
        )
    mask = loss_mask.bool()
    preserve = preserving_mask(advantages, mask)
    d = masked_fill_zero(old_log_probs.detach() - log_probs, mask)
    gate_open = llds_gate(d.detach(), mask, gate)
    weight = torch.ones_like(d)
    if answer_mask is not None:
        weight = torch.where(answer_mask.bool(), torch.full_like(d, float(answer_weight)), weight)
    active = preserve & gate_open
    penalty = torch.where(active, weight * torch.relu(d), torch.zeros_like(d))

    if aggregation == "token-mean":
        value = aggregate(penalty, mask, "token-mean", num_tokens=num_tokens)
    else:
        # Rows outside Y_pre contribute zero; the denominator counts only preserving rows.
        row_in_pre = preserve.any(-1)
        per_row = penalty.sum(-1) / mask.sum(-1).clamp(min=1).to(penalty.dtype)
        denom = row_in_pre.sum() if num_sequences is None else num_sequences
        denom_t = torch.as_tensor(denom, dtype=penalty.dtype, device=penalty.device).clamp(min=1)
        value = torch.where(row_in_pre, per_row, torch.zeros_like(per_row)).sum() / denom_t
    loss = coef * value

    with torch.no_grad():
        stats = _llds_stats(d.detach(), mask, preserve, gate_open, penalty.detach(), gate)
        stats["value"] = value.detach()
    return loss, stats


def _llds_stats(
    d: Tensor, mask: Tensor, preserve: Tensor, gate_open: Tensor, penalty: Tensor, gate: str
) -> dict[str, Tensor]:
    rows = mask.any(-1)
    rows_pre = preserve.any(-1)
    n_rows = rows.sum().clamp(min=1)
    preserve_frac = rows_pre.sum() / n_rows
    if gate == "action":
        action_index, _ = action_segments(mask)
        pre_units = segment_sums(preserve.to(d.dtype), action_index) > 0
        open_units = segment_sums((gate_open & preserve).to(d.dtype), action_index) > 0
        units = pre_units.sum()
        fired = (open_units & pre_units).sum()
    elif gate == "response":
        units = rows_pre.sum()
        fired = (gate_open & preserve).any(-1).sum()
    else:
        units = preserve.sum()
        fired = units
    penalized = penalty > 0
    n_pen = penalized.sum()
    return {
        "preserve_frac": preserve_frac.float(),
        "gate_frac": (fired / units.clamp(min=1)).float(),
        "penalized_token_frac": (n_pen / preserve.sum().clamp(min=1)).float(),
        "mean_penalty": (penalty.sum() / n_pen.clamp(min=1)).float(),
        "displaced_token_frac": ((d > 0) & preserve).sum() / preserve.sum().clamp(min=1),
    }
