"""The policy's settings: which model, its compute dtype and device, and LoRA adapters."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llds.config.schema import section

DEFAULT_LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


@section(key="model.lora")
class LoRAConfig:
    """Low-rank adapters (peft's LoRA) instead of full fine-tuning: only the adapters train.

    The KL reference is the same model with its adapters switched off (no second copy of the
    weights); checkpoints hold the adapter (`adapter/`) and its optimizer state, not the merged
    weights: `llds eval` and a resume put it on the base (`model.path`), `llds export` merges."""

    r: int = Field(default=16, ge=1)
    """rank of each adapter"""
    alpha: float = Field(default=32.0, gt=0)
    """scale numerator: the update is (alpha / r) * B @ A"""
    dropout: float = Field(default=0.0, ge=0, lt=1)
    """dropout on the adapters' input"""
    target_modules: list[str] = Field(
        default_factory=lambda: list(DEFAULT_LORA_TARGETS), min_length=1
    )
    """module names that get adapters (these fit Llama/Qwen2/SmolLM2 blocks)"""


@section(key="model")
class ModelConfig:
    """The trained model."""

    path: str = ""
    """HF model directory or hub id (resolved from the local cache), or `smollm2` (the packaged
    SmolLM2-135M-Instruct); required"""
    dtype: Literal["float32", "bfloat16", "float16", "auto", "bfloat16_if_supported"] = "float32"
    """compute dtype of the policy (autocast). The trained weights and the optimizer state are
    always float32 (master weights): a bf16 weight cannot take a 1e-6 step. `auto` computes in
    the checkpoint's stored dtype; `bfloat16_if_supported` in bfloat16 where the device has
    bf16 instructions (AVX512-BF16 or AMX on a CPU), float32 elsewhere, decided at start and
    logged."""
    device: str = "auto"
    """`auto` (CUDA when available), `cpu`, `cuda`, `cuda:1`, ..."""
    chat: bool | None = None
    """apply the tokenizer's chat template to prompts; null = when it has one"""
    gradient_checkpointing: bool = False
    """recompute activations in the backward pass (less memory, more compute)"""
    lora: LoRAConfig | None = None
    """train low-rank adapters (needs `pip install peft`); null = full fine-tuning"""
