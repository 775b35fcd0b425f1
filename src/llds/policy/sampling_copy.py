"""The policy copy that rollouts sample from when `rollout.dtype` is set.

Why a copy: with `model.dtype: bfloat16` the policy keeps float32 master weights and runs its
matrix products in bf16 through autocast. For decoding, one forward per token, that was measured
to be no faster than float32 on a CPU, while sampling from a copy stored in bf16 (no autocast)
was 1.3-1.5x faster there (1.6-1.7x with `llds_grouped` attention) and 1.15-1.17x faster on one
GPU (benchmarks/README.md). The copy is
refreshed from the trained weights after every update, so it always holds the current policy,
rounded to its dtype. The training forward (pi_old, the update, the displacement pass) keeps
using the policy itself.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from llds.errors import ConfigError
from llds.policy.precision import COMPUTE_DTYPES
from llds.policy.setup import frozen_copy

if TYPE_CHECKING:
    from torch import nn


def make_sampling_copy(model: nn.Module, dtype: str, attn_implementation: str | None) -> nn.Module:
    """A frozen copy of `model` in `dtype` (eval mode, no gradients), with its own attention
    kernel when `attn_implementation` is given."""
    if dtype not in COMPUTE_DTYPES:  # the dtype names model.dtype takes, less auto
        raise ConfigError(f"rollout.dtype: {dtype!r} is none of {', '.join(COMPUTE_DTYPES)}")
    clone = frozen_copy(model, getattr(torch, dtype))
    if attn_implementation is not None:
        _set_attention(clone, attn_implementation)
    return clone


def refresh_sampling_copy(source: nn.Module, clone: nn.Module) -> None:
    """Copy `source`'s current weights into `clone` in place, cast to the clone's dtype."""
    with torch.no_grad():
        clone.load_state_dict(source.state_dict())


@dataclass(frozen=True)
class Sampler:
    """The model rollouts and periodic evaluations sample from, and everything that follows
    from whether it is the policy's own forward (`policy`) or a copy in another dtype: the
    context it samples in, its refresh after an update, whether its log-probs are pi_old's and
    whether a rollout correction has anything to correct. Decided once, here."""

    model: nn.Module
    policy: nn.Module

    @property
    def is_copy(self) -> bool:
        """A copy samples (`rollout.dtype`): its numbers are not the policy's forward."""
        return self.model is not self.policy

    def context(self, autocast: contextlib.AbstractContextManager):
        """The run's autocast when the policy samples itself; none for a copy, whose stored
        dtype is its compute dtype."""
        return contextlib.nullcontext() if self.is_copy else autocast

    def refresh(self) -> None:
        """After the policy's weights changed: the copy takes them (nothing for the policy)."""
        if self.is_copy:
            refresh_sampling_copy(self.policy, self.model)


def sampler_for(policy: nn.Module, dtype: str | None, attn_implementation: str | None) -> Sampler:
    """The policy itself, or with `dtype` (`rollout.dtype`) a copy of it in that dtype."""
    if dtype is None:
        return Sampler(policy, policy)
    return Sampler(make_sampling_copy(policy, dtype, attn_implementation), policy)


def _set_attention(model: nn.Module, name: str) -> None:
    """Switch the transformers model inside `model` (wrappers such as peft included)."""
    from llds.models.grouped_attention import (
        GROUPED_ATTENTION,
        check_full_attention,
        register_grouped_attention,
    )
    from llds.models.kv_cache import transformers_model_in

    inner = transformers_model_in(model)
    if inner is None:
        raise ConfigError(
            f"rollout.attn_implementation: the policy ({type(model).__name__}) is not a "
            "transformers model, so its attention kernel cannot be chosen; leave "
            "rollout.attn_implementation unset"
        )
    try:
        if name == GROUPED_ATTENTION:
            register_grouped_attention()
            check_full_attention(inner.config)
        inner.set_attn_implementation(name)
    except (ValueError, ImportError) as exc:
        raise ConfigError(f"rollout.attn_implementation: {name!r}: {exc}") from None
