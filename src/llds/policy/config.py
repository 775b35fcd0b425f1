"""The policy's settings: which model, its compute dtype and device, and LoRA adapters."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal


@dataclass
class LoRAConfig:
    """Low-rank adapters (peft's LoRA) instead of full fine-tuning: only the adapters train.

    The KL reference is the same model with its adapters switched off (no second copy of the
    weights); checkpoints hold the adapter (`adapter/`) and the merged weights (`model/`, what
    `llds eval` loads)."""

    r: int = 16
    """rank of each adapter"""
    alpha: float = 32.0
    """scale numerator: the update is (alpha / r) * B @ A"""
    dropout: float = 0.0
    target_modules: list[str] = field(
        default_factory=lambda: [
            "q_proj",
            "k_proj",
            "v_proj",
            "o_proj",
            "gate_proj",
            "up_proj",
            "down_proj",
        ]
    )
    """module names that get adapters (these fit Llama/Qwen2/SmolLM2 blocks)"""


@dataclass
class ModelConfig:
    path: str = ""
    """HF model directory or hub id (resolved from the local cache), or `smollm2` (the packaged
    SmolLM2-135M-Instruct)."""
    dtype: Literal["float32", "bfloat16", "float16", "auto"] = "float32"
    """compute dtype of the policy (autocast). The trained weights and the optimizer state are
    always float32 (master weights): a bf16 weight cannot take a 1e-6 step. `auto` computes in
    the checkpoint's stored dtype."""
    device: str = "auto"
    chat: bool | None = None
    """apply the tokenizer's chat template to prompts; null = when it has one"""
    gradient_checkpointing: bool = False
    lora: LoRAConfig | None = None
    """train low-rank adapters (needs `pip install peft`); null = full fine-tuning"""
