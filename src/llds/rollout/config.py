"""Rollout settings: how one multi-turn episode is generated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

ATTENTION_IMPLEMENTATIONS = (
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
    "llds_grouped",  # llds.models.grouped_attention.GROUPED_ATTENTION
)


@dataclass
class RolloutConfig:
    """Search-R1's reference values are the defaults where the paper gives them.

    `max_turns` is the number of searches executed; a rollout still running after that gets one
    last turn in which a search is not executed. `max_turns=0` is single-turn generation (plain
    GRPO on prompts, no retriever needed). `temperature=0` means greedy decoding.
    """

    group_size: int = 5
    max_turns: int = 3
    max_turn_tokens: int = 500
    min_turn_tokens: int = 0
    """a turn does not end before this many tokens: end-of-sequence ids are masked out of the
    sampling and stop tags are not honoured until then (like HF `min_new_tokens`). Setting it to
    `max_turn_tokens` gives fixed-length turns, e.g. for throughput comparisons at equal work;
    the masked end-of-sequence mass makes sampling slightly off-policy, so leave it 0 in training"""
    max_obs_tokens: int = 500
    max_total_tokens: int = 4096
    topk: int = 3
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    kv_reuse: bool = True
    max_rows: int = 64
    """rows generated concurrently (bounds memory; more rows per forward is faster)"""
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    """sample from a copy of the policy stored in this dtype (veRL's `rollout.dtype`), refreshed
    from the trained weights after every update, instead of from the policy itself. With
    `model.dtype: bfloat16` the policy keeps float32 weights and decodes through autocast, which
    measured no faster than float32 on a CPU; a bf16 copy decodes without autocast. The copy
    samples a slightly different distribution than the training forward computes, so pi_old is
    then recomputed from the policy (`algo.old_logprobs: auto`). Costs the model's size again in
    this dtype (under FSDP a second copy beside the unsharded one). None: sample from the
    policy"""
    attn_implementation: str | None = None
    """attention kernel of the sampling copy (needs `dtype`): a transformers
    `attn_implementation`, e.g. `eager`, which decoded bf16 faster than `sdpa` on the CPU
    measured, or `llds_grouped`, llds's grouped-query attention over a preallocated KV cache,
    faster still there (`llds.models.grouped_attention`; full-attention models only; measured
    on a CPU only); None keeps the policy's"""

    def validate(self) -> None:
        from llds.errors import ConfigError

        checks = {
            "group_size": self.group_size >= 1,
            "max_turns": self.max_turns >= 0,
            "max_turn_tokens": self.max_turn_tokens >= 1,
            "min_turn_tokens": 0 <= self.min_turn_tokens <= self.max_turn_tokens,
            "max_obs_tokens": self.max_obs_tokens >= 1,
            "max_total_tokens": self.max_total_tokens >= 8,
            "topk": self.topk >= 1,
            "temperature": self.temperature >= 0,
            "top_p": 0 < self.top_p <= 1,
            "top_k": self.top_k >= 0,
            "max_rows": self.max_rows >= 1,
        }
        for key, ok in checks.items():
            if not ok:
                raise ConfigError(f"rollout.{key}: invalid value {getattr(self, key)!r}")
        attn = self.attn_implementation
        if attn is not None and attn not in ATTENTION_IMPLEMENTATIONS:
            raise ConfigError(
                f"rollout.attn_implementation: {attn!r} is none of "
                + ", ".join(ATTENTION_IMPLEMENTATIONS)
            )
        if attn is not None and self.dtype is None:
            raise ConfigError(
                "rollout.attn_implementation: sets the kernel of the sampling copy, which only "
                "exists with rollout.dtype (e.g. rollout.dtype=bfloat16)"
            )
