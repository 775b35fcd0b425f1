"""pi_old's and the reference's log-probs of a step's rollouts: taken from the rollout's own
sampling passes where they equal the policy's forward, else one no-grad forward each."""

from __future__ import annotations

import torch

from llds.algo.llds_in_force import LLDSInForce
from llds.policy.forward import batched_log_probs
from llds.policy.precision import Precision
from llds.rollout import RolloutBatch
from llds.train.config import AlgoConfig, TrainConfig


def old_logprobs_from_rollout(
    algo: AlgoConfig,
    batch: RolloutBatch,
    *,
    sampled_by_copy: bool,
    llds: LLDSInForce,
    mixed_precision: bool,
) -> bool:
    """Take pi_old from the rollout (saving a forward pass over the whole batch) when the
    config allows it and the engine recorded them; see `AlgoConfig.old_logprobs`."""
    if (
        algo.old_logprobs == "recompute"
        or batch.rollout_logprobs is None
        or batch.rollout_entropy is None
    ):
        return False
    if algo.old_logprobs == "rollout":
        return True
    if sampled_by_copy:  # sampled by a copy, not by the policy's own forward
        return False
    # auto: float32 sampling logits equal the training forward's to rounding; LLDS's first
    # step is exactly 0 whatever pi_old's rounding. The authors' first-step LLDS acts on that
    # rounding, so it gets their recomputed pi_old (`llds`: the step's, a rollback turns it on).
    return not llds.acts_on_first_update and not mixed_precision


def old_logprobs(
    cfg: TrainConfig,
    batch: RolloutBatch,
    model: torch.nn.Module,
    precision: Precision,
    *,
    sampled_by_copy: bool,
    llds: LLDSInForce,
) -> tuple[bool, torch.Tensor, torch.Tensor]:
    """`(taken from the rollout, pi_old's log-probs, their entropies)`: the rollout's own when
    `old_logprobs_from_rollout` allows it, else one no-grad forward of `model`."""
    if old_logprobs_from_rollout(
        cfg.algo,
        batch,
        sampled_by_copy=sampled_by_copy,
        llds=llds,
        mixed_precision=precision.mixed,
    ):
        assert batch.rollout_logprobs is not None and batch.rollout_entropy is not None
        return True, batch.rollout_logprobs, batch.rollout_entropy
    model.eval()
    with precision.autocast():
        logp, entropy = batched_log_probs(
            model,
            batch,
            cfg.optim.logprob_tokens,
            temperature=cfg.rollout.temperature,
            with_entropy=True,
            prefix_sharing=cfg.rollout.prefix_sharing,
        )
    return False, logp, entropy


def reference_logprobs(
    cfg: TrainConfig, batch: RolloutBatch, ref_model: torch.nn.Module | None, precision: Precision
) -> torch.Tensor | None:
    """The reference model's log-probs (the KL term), None without one."""
    if ref_model is None:
        return None
    with precision.autocast():
        logp, _ = batched_log_probs(
            ref_model,
            batch,
            cfg.optim.logprob_tokens,
            temperature=cfg.rollout.temperature,
            prefix_sharing=cfg.rollout.prefix_sharing,
        )
    return logp
