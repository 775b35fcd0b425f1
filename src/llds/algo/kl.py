"""KL estimators between the policy and a reference policy, from per-token log-probs."""

from __future__ import annotations

import torch
from torch import Tensor

from llds.algo.arguments import check_tensors


def kl_penalty(log_probs: Tensor, ref_log_probs: Tensor, kind: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi || pi_ref) from samples of pi (Schulman's k1/k2/k3).

    - ``k1``: `log pi - log pi_ref` (unbiased, high variance, can be negative)
    - ``k2``: `0.5 (log pi - log pi_ref)^2`
    - ``k3`` / ``low_var_kl``: `exp(log pi_ref - log pi) - (log pi_ref - log pi) - 1`, >= 0,
      clamped to [-10, 10] as in veRL so a single wild token cannot dominate the loss.
    - ``abs``: `|log pi - log pi_ref|`
    Gradient flows through `log_probs` only.
    """
    check_tensors("kl_penalty", log_probs=log_probs, ref_log_probs=ref_log_probs)
    diff = log_probs - ref_log_probs.detach()
    if kind == "k1":
        return diff
    if kind == "k2":
        return 0.5 * diff.square()
    if kind in ("k3", "low_var_kl"):
        neg = (-diff).clamp(-20.0, 20.0)
        return (torch.exp(neg) - neg - 1.0).clamp(-10.0, 10.0)
    if kind == "abs":
        return diff.abs()
    raise ValueError(f"KL kind must be one of k1, k2, k3, low_var_kl, abs; got {kind!r}")
