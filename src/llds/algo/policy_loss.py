"""The clipped policy-gradient surrogate (PPO / GRPO / DAPO clip-higher / GSPO)."""

from __future__ import annotations

import torch
from torch import Tensor

from llds.algo.arguments import check_tensors
from llds.algo.masking import aggregate, masked_fill_zero, masked_max, masked_mean, masked_min
from llds.config.algo import AlgoConfig, RatioType, check_arguments


def _broadcast_advantages(advantages: Tensor, like: Tensor) -> Tensor:
    if advantages.dim() == 1:
        return advantages.unsqueeze(-1).expand_as(like)
    if advantages.shape != like.shape:
        raise ValueError(
            f"advantages must be [B] or [B, T] = {tuple(like.shape)}, got {tuple(advantages.shape)}"
        )
    return advantages


def policy_loss(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float | None = None,
    ratio_type: RatioType = "token",
    dual_clip: float | None = None,
    aggregation: str = "token-mean",
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    norm_length: float | None = None,
    weights: Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """PPO clipped surrogate, `-min(r A, clip(r, 1 - clip_low, 1 + clip_high) A)` per token.

    `clip_high` defaults to `clip_low`; a larger value is DAPO's clip-higher. With
    `ratio_type="sequence"` the ratio is GSPO's length-normalized sequence ratio
    `exp(mean_t(log pi - log pi_old))`, shared by every token of the row, whose gradient is
    spread over the row's tokens. `dual_clip` (> 1) bounds the loss of negative-advantage tokens
    by `-dual_clip * A`. `weights` (`[B, T]`, e.g. importance weights for a sampler that is not
    pi_old, `llds.algo.rollout_correction`) multiply each token's loss as constants before
    aggregation; None leaves the loss untouched. Returns the aggregated loss and detached
    statistics (no host sync).
    """
    check_tensors(
        "policy_loss",
        log_probs=log_probs,
        old_log_probs=old_log_probs,
        advantages=advantages,
        loss_mask=loss_mask,
    )
    if weights is not None:
        check_tensors("policy_loss", weights=weights)
    check_arguments(AlgoConfig, "policy_loss", clip_low=clip_low, clip_high=clip_high)
    if clip_high is None:
        clip_high = clip_low
    mask = loss_mask.bool()
    adv = _broadcast_advantages(advantages, log_probs).to(log_probs.dtype)
    log_ratio = masked_fill_zero(log_probs - old_log_probs.detach(), mask)
    if ratio_type == "sequence":
        seq_log_ratio = log_ratio.sum(-1) / mask.sum(-1).clamp(min=1).to(log_ratio.dtype)
        # value = the sequence ratio on every token; gradient = that ratio times d log pi_t
        log_ratio = seq_log_ratio.detach().unsqueeze(-1) + log_probs - log_probs.detach()
        log_ratio = masked_fill_zero(log_ratio, mask)
    elif ratio_type != "token":
        raise ValueError(f"ratio_type must be 'token' or 'sequence', got {ratio_type!r}")
    ratio = torch.exp(log_ratio.clamp(max=20.0))
    unclipped = -adv * ratio
    clipped = -adv * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    per_token = torch.maximum(unclipped, clipped)
    if dual_clip is not None:
        if dual_clip <= 1.0:
            raise ValueError(f"dual_clip must be > 1, got {dual_clip}")
        bounded = torch.minimum(per_token, -adv * dual_clip)
        per_token = torch.where(adv < 0, bounded, per_token)
    if weights is not None:
        per_token = per_token * weights.detach().to(per_token.dtype)
    loss = aggregate(
        per_token,
        mask,
        aggregation,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
        norm_length=norm_length,
    )
    with torch.no_grad():
        r = ratio.detach()
        a = adv.detach()
        stats = {
            "clip_frac_low": masked_mean(((a < 0) & (r < 1.0 - clip_low)).float(), mask),
            "clip_frac_high": masked_mean(((a > 0) & (r > 1.0 + clip_high)).float(), mask),
            "approx_kl": masked_mean(-log_ratio.detach(), mask),
            "ratio_mean": masked_mean(r, mask),
            "ratio_max": masked_max(r, mask),
            "ratio_min": masked_min(r, mask),
        }
    return loss, stats
