"""Mismatch between the policy that sampled the rollouts and the policy being trained.

When rollouts come from another engine or a low-precision copy (`rollout.dtype`), "on-policy"
GRPO is off-policy by the ratio `rho = pi_trained / pi_sampler` of every sampled token. These
pure functions measure how far apart the two are, from the per-token log-probs of the sampled
tokens under each, so every engine logs the same keys (`docs/diagnostics.md` has the formulas).
"""

from __future__ import annotations

from torch import Tensor

from llds import metrics as keys

LOG_RATIO_BOUND = 20.0
"""`|log rho|` is clamped to this before `exp` in the ratio-based metrics, so one wild token gives
a large finite value instead of inf (`e^20` is about 5e8); the log-prob differences are raw."""


def mismatch_metrics(sampler_logp: Tensor, trained_logp: Tensor, mask: Tensor) -> dict[str, float]:
    """KL, log-prob differences, chi-squared and effective sample size over the masked tokens.

    `sampler_logp`, `trained_logp`: `[B, T]` log-probs of the sampled tokens under the sampling
    policy and under the trained one (pi_old as the trainer computes it); `mask`: `[B, T]`, true
    on model tokens. With `l = trained - sampler` and `rho = exp(l)`, the k3 estimator
    `rho - 1 - l` is non-negative per token and its mean over samples drawn from the sampler
    estimates `KL(sampler || trained)` with low variance. `{}` when no token is masked."""
    m = mask.bool()
    if not bool(m.any()):
        return {}
    log_ratio = (trained_logp.double() - sampler_logp.double())[m]
    rho = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND).exp()
    n = rho.numel()
    return {
        keys.MISMATCH_K3_KL: float((rho - 1 - log_ratio).mean()),
        keys.MISMATCH_ABS_LOGP_DIFF_MAX: float(log_ratio.abs().max()),
        keys.MISMATCH_ABS_LOGP_DIFF_MEAN: float(log_ratio.abs().mean()),
        keys.MISMATCH_CHI2_TOKEN: float((rho * rho).mean() - 1),
        keys.MISMATCH_IS_ESS: float(rho.sum() ** 2 / (n * (rho * rho).sum())),
    }


def correction_metrics(weights: Tensor, clipped: Tensor, mask: Tensor) -> dict[str, float]:
    """What a rollout correction (truncated / masked importance sampling, rejection) did.

    `weights`: the importance weights the loss uses, per token `[B, T]` or per sequence `[B]`
    (broadcast over the row's tokens); `clipped`: same shape, true where the weight was
    truncated, masked or its sequence rejected; `mask`: `[B, T]` model tokens. The mean weight
    and the share of tokens touched are over masked tokens; `{}` when none is."""
    m = mask.bool()
    if not bool(m.any()):
        return {}
    w = weights.double()
    c = clipped.bool()
    if w.dim() == 1:
        w = w.unsqueeze(1).expand_as(m)
    if c.dim() == 1:
        c = c.unsqueeze(1).expand_as(m)
    return {
        keys.MISMATCH_IS_WEIGHT_MEAN: float(w[m].mean()),
        keys.MISMATCH_IS_CLIPPED_FRAC: float(c[m].double().mean()),
    }
