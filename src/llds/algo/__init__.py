"""Pure tensor math for GRPO + LLDS: no I/O, no models. Every function is unit-tested by hand.

The names exported here are the project's stable public API.
"""

from llds.algo.advantages import group_advantages, group_index
from llds.algo.kl import kl_penalty
from llds.algo.llds import (
    GATES,
    LLDS_AGGREGATIONS,
    llds_gate,
    llds_loss,
    preserving_mask,
)
from llds.algo.logprobs import token_entropy, token_log_probs, token_log_probs_and_entropy
from llds.algo.masking import AGGREGATIONS, aggregate, masked_mean, masked_sum
from llds.algo.objective import (
    TermInputs,
    grpo_objective,
    llds_term,
    register_loss_term,
    registered_loss_terms,
)
from llds.algo.policy_loss import policy_loss
from llds.algo.rollout_correction import importance_weights, no_correction
from llds.algo.segments import action_segments, broadcast_segments, segment_sums
from llds.config.algo import AlgoConfig, LLDSConfig, RolloutCorrectionConfig, answer_weight_schedule

__all__ = [
    "AGGREGATIONS",
    "GATES",
    "LLDS_AGGREGATIONS",
    "AlgoConfig",
    "LLDSConfig",
    "RolloutCorrectionConfig",
    "TermInputs",
    "action_segments",
    "aggregate",
    "answer_weight_schedule",
    "broadcast_segments",
    "group_advantages",
    "group_index",
    "grpo_objective",
    "importance_weights",
    "kl_penalty",
    "llds_gate",
    "llds_loss",
    "llds_term",
    "masked_mean",
    "masked_sum",
    "no_correction",
    "policy_loss",
    "preserving_mask",
    "register_loss_term",
    "registered_loss_terms",
    "segment_sums",
    "token_entropy",
    "token_log_probs",
    "token_log_probs_and_entropy",
]
