"""The GRPO (+LLDS) objective of one micro-batch, as one pure function.

    loss = policy_loss + kl_coef * KL(pi_theta || pi_ref) - entropy_coef * H + LLDS

The trainer, the one-step probe and the Python API compose the loss only through
`grpo_objective`; the TRL and veRL adapters add its LLDS part, `llds_term`, to their framework's
policy loss; every term is one of the tested functions of `llds.algo`. Denominators can be
given (`num_sequences`, `num_tokens`, `num_preserving`) so that micro-batches and processes add
up to the loss of the whole mini-batch.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from llds.algo.kl import kl_penalty
from llds.algo.llds import llds_loss
from llds.algo.masking import aggregate
from llds.algo.policy_loss import policy_loss

POLICY_STATS = ("clip_frac_low", "clip_frac_high", "approx_kl", "ratio_mean")
LLDS_STATS = ("gate_frac", "penalized_token_frac", "mean_penalty")


@dataclass(frozen=True)
class Objective:
    """The coefficients and choices of the objective (see `AlgoConfig` for their meaning)."""

    clip_low: float = 0.2
    clip_high: float | None = None
    ratio_type: str = "token"
    dual_clip: float | None = None
    aggregation: str = "token-mean"
    kl_coef: float = 0.0
    kl_kind: str = "low_var_kl"
    entropy_coef: float = 0.0
    llds_coef: float = 0.0
    llds_gate: str = "action"
    llds_aggregation: str = "seq-mean-token-mean"


def grpo_objective(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    objective: Objective,
    *,
    ref_log_probs: Tensor | None = None,
    entropy: Tensor | None = None,
    answer_mask: Tensor | None = None,
    answer_weight: float = 1.0,
    llds_acts: bool = True,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
    num_preserving: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """`(loss, stats)` of one micro-batch; stats are detached and named like the trainer's
    metrics (`policy/*`, `llds/*`).

    The KL term is added when `ref_log_probs` is given, the entropy bonus when `entropy` is
    given and `entropy_coef > 0`, LLDS when `llds_coef > 0`. With `llds_acts=False` LLDS is
    evaluated on detached log-probs for its statistics and adds nothing (value and gradient 0):
    the first optimizer step of a rollout batch, where d is only rounding noise.
    """
    o = objective
    pg, st = policy_loss(
        log_probs,
        old_log_probs,
        advantages,
        loss_mask,
        clip_low=o.clip_low,
        clip_high=o.clip_high,
        ratio_type=o.ratio_type,
        dual_clip=o.dual_clip,
        aggregation=o.aggregation,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    loss = pg
    stats: dict[str, Tensor] = {"policy/pg_loss": pg.detach()}
    stats.update({f"policy/{k}": st[k] for k in (*POLICY_STATS, "ratio_max", "ratio_min")})
    if ref_log_probs is not None:
        kl_tok = kl_penalty(log_probs, ref_log_probs, o.kl_kind)
        kl = aggregate(
            kl_tok, loss_mask, o.aggregation, num_sequences=num_sequences, num_tokens=num_tokens
        )
        loss = loss + o.kl_coef * kl
        stats["policy/kl"] = kl.detach()
    if entropy is not None and o.entropy_coef > 0:
        ent = aggregate(
            entropy, loss_mask, o.aggregation, num_sequences=num_sequences, num_tokens=num_tokens
        )
        loss = loss - o.entropy_coef * ent
    if o.llds_coef > 0:
        reg, lst = llds_term(
            log_probs,
            old_log_probs,
            advantages,
            loss_mask,
            o,
            answer_mask=answer_mask,
            answer_weight=answer_weight,
            acts=llds_acts,
            num_sequences=num_preserving,
            num_tokens=num_tokens,
        )
        if llds_acts:
            loss = loss + reg
        stats["llds/loss"] = lst["llds/loss"]
        stats.update({f"llds/{k}": lst[f"llds/{k}"] for k in LLDS_STATS})
    return loss, stats


def llds_term(
    log_probs: Tensor,
    old_log_probs: Tensor,
    advantages: Tensor,
    loss_mask: Tensor,
    objective: Objective,
    *,
    answer_mask: Tensor | None = None,
    answer_weight: float = 1.0,
    acts: bool = True,
    num_sequences: float | Tensor | None = None,
    num_tokens: float | Tensor | None = None,
) -> tuple[Tensor, dict[str, Tensor]]:
    """The LLDS term of the objective, `llds_coef * L_LLDS`, and its statistics (`llds/*`).

    `grpo_objective` adds it to the policy loss; the TRL and veRL adapters, which keep their
    framework's own policy loss, add it to theirs. With `acts=False` the penalty is evaluated on
    detached log-probs: the statistics describe it, the term is exactly 0 with no gradient.
    """
    o = objective
    reg, st = llds_loss(
        log_probs if acts else log_probs.detach(),
        old_log_probs,
        advantages,
        loss_mask,
        coef=o.llds_coef,
        gate=o.llds_gate,
        answer_mask=answer_mask,
        answer_weight=answer_weight,
        aggregation=o.llds_aggregation,
        num_sequences=num_sequences,
        num_tokens=num_tokens,
    )
    stats = {f"llds/{k}": v for k, v in st.items()}
    stats["llds/loss"] = reg.detach() if acts else reg.detach() * 0
    return (reg if acts else reg.detach() * 0), stats
