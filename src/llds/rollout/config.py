"""Rollout settings: how one multi-turn episode is generated."""

from __future__ import annotations

import typing
from typing import Literal

from pydantic import Field

from llds.config.schema import Invalid, check, section

AttentionImplementation = Literal[
    "eager",
    "sdpa",
    "flash_attention_2",
    "flash_attention_3",
    "flex_attention",
    "llds_grouped",  # llds.models.grouped_attention.GROUPED_ATTENTION
]
ATTENTION_IMPLEMENTATIONS = typing.get_args(AttentionImplementation)


@section(key="rollout")
class RolloutConfig:
    """Search-R1's reference values are the defaults where the paper gives them.

    `max_turns` is the number of searches executed; a rollout still running after that gets one
    last turn in which a search is not executed. `max_turns=0` is single-turn generation (plain
    GRPO on prompts, no retriever needed). `temperature=0` means greedy decoding.
    """

    group_size: int = Field(default=5, ge=1)
    """rollouts per question (G); GRPO's advantages compare them, so training needs >= 2"""
    max_turns: int = Field(default=3, ge=0)
    """searches executed per rollout; 0 = single-turn generation without a retriever"""
    max_turn_tokens: int = Field(default=500, ge=1)
    """tokens the model may generate in one turn"""
    min_turn_tokens: int = Field(default=0, ge=0)
    """a turn does not end before this many tokens: end-of-sequence ids are masked out of the
    sampling and stop tags are not honoured until then (like HF `min_new_tokens`). Setting it to
    `max_turn_tokens` gives fixed-length turns, e.g. for throughput comparisons at equal work;
    the masked end-of-sequence mass makes sampling slightly off-policy, so leave it 0 in training"""
    max_obs_tokens: int = Field(default=500, ge=1)
    """tokens of retrieved passages kept per search (the observation)"""
    max_total_tokens: int = Field(default=4096, ge=8)
    """tokens of a whole rollout, prompt included"""
    topk: int = Field(default=3, ge=1)
    """passages per search (in training: set by `retriever.topk`)"""
    temperature: float = Field(default=1.0, ge=0)
    """sampling temperature; 0 = greedy"""
    top_p: float = Field(default=1.0, gt=0, le=1)
    """nucleus sampling mass; 1 = off"""
    top_k: int = Field(default=0, ge=0)
    """sample among the k likeliest tokens; 0 = off"""
    kv_reuse: bool = True
    """keep the KV cache across turns instead of re-encoding the conversation"""
    cache: Literal["auto", "static", "dynamic"] = "auto"
    """decode loop: `static` keeps each chunk's keys/values in a preallocated cache and its
    token loop on the model's device (Llama-family models: llama, qwen2, qwen3, mistral, full
    attention; not under FSDP); `dynamic` runs transformers' own forward and cache with a host
    round trip per token (any model). Both sample the same tokens for seeded requests. `auto`:
    static where it serves the model (and `kv_reuse` is on, and no `attn_implementation` is
    asked for), else dynamic"""
    compile: bool | Literal["auto"] = "auto"
    """`torch.compile` the static loop's decode step, with CUDA graphs on a GPU. `auto`: on a
    GPU, off on a CPU. On one H200 (0.5B-shaped model, 64 rows of 128 tokens) it made the
    rollout 4.3x faster than the eager loop in float32 and 10x faster than the uncompiled
    static loop in bf16, after a first chunk that compiles for 35-50 s; on a CPU it needs a C++
    compiler, its first chunk compiles for 20-80 s and then rollouts measured 1.1-1.3x faster
    than the static loop (docs/results/performance.md), which pays off on long runs only. The
    static loop's cache stays allocated from one chunk (and step) to the next, so that compiled
    graphs keep their addresses"""
    prefix_sharing: bool = False
    """compute each group's shared prompt once: the no-grad log-prob passes (pi_old when
    recomputed, the reference's, the diagnostics') and each mini-batch of the update run every
    distinct prompt once and the responses against its keys and values, in micro-batches of
    responses under the same token budgets, cut where padding costs more than a call
    (`llds.policy.prompt_once`); the decode too with `share_decode_prompts`. The same
    rollouts, log-probs to float rounding (1e-5 in float32) and the exact gradient, but other
    rounding than whole rows. On the theorem study's step (2-core CPU, with the default chunks)
    it measured 1.36x and 1.48x on two machines against the path without it and chunks of 64
    rollouts (the no-grad passes 1.52-1.59x, the update 1.39-1.52x;
    benchmarks/prefix_sharing.py). Off by default (it would change the rounding of every
    pass). Llama-family models run llds's own segment forward, others transformers' forward
    with a cache; never under FSDP"""
    share_decode_prompts: bool = False
    """with `prefix_sharing`, also the static loop's decode: one copy of each distinct prompt
    in the cache, attended to once per group and merged with each row's own keys by
    log-sum-exp (`llds.models.shared_prefix`). Off: each row decodes after its own copy of the
    prompt (prefilled once per group), as without `prefix_sharing`. Off by default: on the
    theorem study's 128-wide model (2-core CPU) the merge's extra small operations per token
    cost more than the prompt reads they save (320 rows: 9.29 s without, 10.44 s with)"""
    max_rows: int = Field(default=512, ge=1)
    """rows generated concurrently at most (more rows per forward is faster); fewer when
    `cache_memory_mb` holds fewer"""
    cache_memory_mb: int = Field(default=6144, ge=1)
    """key/value cache the rows generated concurrently may hold, in MiB, counted at
    `max_total_tokens` positions per row: a chunk has as many rows as fit (at most
    `max_rows`). 6144: 512 rows of the theorem world's 4-layer model (its study's 320 rollouts
    in one chunk, 1.09x faster than five of 64, the same rollouts), 90 of SmolLM2-135M at 1536
    tokens in float32 (71 MB a row; llds.rollout.chunk_rows)"""
    dtype: Literal["bfloat16", "float16", "float32"] | None = None
    """sample from a copy of the policy stored in this dtype (veRL's `rollout.dtype`), refreshed
    from the trained weights after every update, instead of from the policy itself. With
    `model.dtype: bfloat16` the policy keeps float32 weights and decodes through autocast, which
    measured no faster than float32 on a CPU; a bf16 copy decodes without autocast. The copy
    samples a slightly different distribution than the training forward computes, so pi_old is
    then recomputed from the policy (`algo.old_logprobs: auto`). Costs the model's size again in
    this dtype (under FSDP a second copy beside the unsharded one). null: sample from the
    policy"""
    sync_every: int = Field(default=1, ge=1)
    """refresh the sampling copy (`rollout.dtype`) from the trained weights every N training
    steps instead of after every one: rollouts then come from a policy up to N - 1 steps
    behind, as in an asynchronous or one-step-off trainer. pi_old is recomputed from the
    trained policy, so with `algo.rollout_correction.mode: off` nothing corrects the rollouts
    for the lag (the mismatch metrics `mismatch/*` measure it). 1: no lag"""
    attn_implementation: AttentionImplementation | None = None
    """attention kernel of the sampling copy (needs `dtype`): a transformers
    `attn_implementation`, e.g. `eager`, which decoded bf16 faster than `sdpa` on the CPU
    measured, or `llds_grouped`, llds's grouped-query attention over a preallocated KV cache,
    faster still there (`llds.models.grouped_attention`; full-attention models only; measured
    on a CPU only); null keeps the policy's. A kernel of the eager loop: with it, `cache: auto`
    takes the eager loop"""

    def __post_init__(self) -> None:
        if self.min_turn_tokens > self.max_turn_tokens:
            raise Invalid(
                "min_turn_tokens",
                f"{self.min_turn_tokens} is more than max_turn_tokens={self.max_turn_tokens}",
            )
        if self.attn_implementation is not None and self.cache == "static":
            raise Invalid(
                "attn_implementation",
                "picks the eager loop's attention kernel; the static loop (cache=static) runs its "
                "own: use cache=auto or dynamic",
            )
        if self.compile is True and self.cache == "dynamic":
            raise Invalid("compile", "compiles the static loop's step: needs cache=static or auto")
        if self.attn_implementation is not None and self.dtype is None:
            raise Invalid(
                "attn_implementation",
                "sets the kernel of the sampling copy, which only exists with rollout.dtype "
                "(e.g. rollout.dtype=bfloat16)",
            )

    def validate(self) -> None:
        """The cross-field checks again, after fields were assigned one by one."""
        check(self)
