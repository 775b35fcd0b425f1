"""Importance weights that correct for a sampler that is not the trained policy.

When rollouts come from another copy of the policy (a bf16 copy, an inference engine), the
"on-policy" GRPO batch is slightly off-policy: its tokens were drawn from pi_sampler, while the
surrogate's ratio is taken against pi_old, the trained policy before the update. The decoupled
correction multiplies each token's surrogate by a constant weight built from

    rho = pi_old / pi_sampler = exp(log pi_old - log pi_sampler)

per token (`level="token"`), or for the whole response (`level="sequence"`: the product of its
model tokens' ratios, exp of the summed log-ratio, which is the response's true importance
weight; every token of the response gets it). With the cap C:

- `tis`, truncated importance sampling (Yao et al., 2025, "Your efficient RL framework secretly
  brings you off-policy RL training"): w = min(rho, C);
- `mis`, masked importance sampling: w = rho where rho <= C, else 0 (the token or response
  leaves the loss instead of being truncated);
- `reject`, rejection of outlier responses: w = 0 for every token of a response whose ratio lies
  outside [1/C, C] (at `level="token"`: any of its model tokens' ratios does), else w = 1.

Weights carry no gradient. `clipped` marks the model tokens the cap acted on (truncated, masked
or rejected). Outside `loss_mask` weights are 1 and nothing is marked.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from llds.algo.masking import masked_fill_zero
from llds.config.algo import CorrectionLevel, CorrectionMode


def no_correction(loss_mask: Tensor) -> tuple[Tensor, Tensor]:
    """`(weights, clipped)` when the sampler is the trained policy: exactly 1, nothing clipped.
    Built, never computed, so that rounding cannot make them differ from 1."""
    device = loss_mask.device
    ones = torch.ones(loss_mask.shape, device=device)
    return ones, torch.zeros(loss_mask.shape, dtype=torch.bool, device=device)


def importance_weights(
    old_log_probs: Tensor,
    sampler_log_probs: Tensor,
    loss_mask: Tensor,
    *,
    mode: CorrectionMode,
    level: CorrectionLevel = "token",
    cap: float = 2.0,
) -> tuple[Tensor, Tensor]:
    """`(weights, clipped)`, both `[B, T]`: the decoupled correction's per-token weights (float32,
    detached) and the model tokens whose weight the cap changed. `mode="off"` gives ones."""
    if cap <= 1.0:
        raise ValueError(f"cap must be > 1, got {cap}")
    mask = loss_mask.bool()
    if mode == "off":
        return no_correction(loss_mask)
    log_rho = masked_fill_zero(
        old_log_probs.detach().float() - sampler_log_probs.detach().float(), mask
    )
    log_cap = math.log(cap)
    if level == "sequence":
        log_rho = log_rho.sum(-1, keepdim=True).expand_as(log_rho)
    elif level != "token":
        raise ValueError(f"level must be 'token' or 'sequence', got {level!r}")
    if mode == "tis":
        over = log_rho > log_cap
        weights = torch.exp(log_rho.clamp(max=log_cap))
    elif mode == "mis":
        over = log_rho > log_cap
        weights = torch.where(over, 0.0, torch.exp(log_rho.clamp(max=log_cap)))
    elif mode == "reject":
        outlier = (log_rho.abs() > log_cap) & mask
        over = outlier.any(-1, keepdim=True).expand_as(outlier)
        weights = torch.where(over, 0.0, 1.0)
    else:
        raise ValueError(f"mode must be off, tis, mis or reject, got {mode!r}")
    clipped = over & mask
    return torch.where(mask, weights, 1.0), clipped
