"""The algorithm's settings, defined once next to the math they parameterise.

The native trainer, the probe and the TRL and veRL adapters all read these.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class LLDSConfig:
    enabled: bool = True
    coef: float = 0.2
    gate: str = "action"
    aggregation: str = "seq-mean-token-mean"
    mask_answer: bool = False
    """LLDS-MA: weight the final answer span by beta"""
    answer_weight: float | None = None
    """fixed beta for LLDS-MA; null = the paper's schedule min(V / baseline, 1)"""
    answer_baseline: float = 2.0
    first_update: Literal["zero", "computed"] = "zero"
    """LLDS on the first optimizer step of each rollout batch, where pi_theta == pi_old and
    `d = log pi_old - log pi_theta` is only float rounding noise. `zero`: LLDS is exactly 0 there
    (value and gradient), as in exact arithmetic. `computed`: evaluate it on whatever d the
    floats give, as the authors' code does; the gate then opens on noise."""


@dataclass
class AlgoConfig:
    normalize_std: bool = True
    clip_low: float = 0.2
    clip_high: float | None = None
    ratio_type: Literal["token", "sequence"] = "token"
    dual_clip: float | None = None
    aggregation: str = "token-mean"
    kl_coef: float = 0.001
    kl_kind: Literal["k1", "k2", "k3", "low_var_kl", "abs"] = "low_var_kl"
    entropy_coef: float = 0.0
    old_logprobs: Literal["auto", "rollout", "recompute"] = "auto"
    """where pi_old comes from. `rollout`: the log-probs the rollout engine computed from the very
    logits it sampled from (no extra forward pass). `recompute`: a separate no-grad forward over
    the batch, as most trainers do; needed when generation numerics differ from the training
    forward's (low-precision kernels). `auto`: rollout for float32 models without LLDS (both
    agree to float rounding), recompute otherwise: LLDS's hinge max(0, pi_old - pi_theta) sits
    at exactly 0 on the first optimizer step, where rounding noise alone would open it."""
    llds: LLDSConfig = field(default_factory=LLDSConfig)
    format_reward: bool = False
