"""Randomly initialised tiny causal LMs: fast enough to train on a CPU in tests and demos."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from llds.errors import UserInputError
from llds.io import atomic_directory

ARCHS = ("qwen2", "llama")


def tiny_causal_lm(
    vocab_size: int,
    *,
    hidden_size: int = 128,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int | None = None,
    max_position_embeddings: int = 2048,
    tie_word_embeddings: bool = True,
    seed: int = 0,
    arch: str = "qwen2",
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
) -> Any:
    """A fresh Qwen2ForCausalLM (or LlamaForCausalLM); the same arguments give the same weights.

    The global torch RNG is left untouched (weights are drawn inside a forked RNG state).
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    if arch not in ARCHS:
        raise UserInputError(f"arch must be one of {ARCHS}, got {arch!r}")
    if hidden_size % num_heads or num_heads % num_kv_heads:
        raise UserInputError(
            f"hidden_size ({hidden_size}) must divide by num_heads ({num_heads}) "
            f"and num_heads by num_kv_heads ({num_kv_heads})"
        )
    config_cls, model_cls = (
        (Qwen2Config, Qwen2ForCausalLM) if arch == "qwen2" else (LlamaConfig, LlamaForCausalLM)
    )
    config = config_cls(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size or 4 * hidden_size,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = model_cls(config)
    return model


def tiny_causal_lm_for(tokenizer: Any, **kwargs: Any) -> Any:
    """`tiny_causal_lm` sized to a tokenizer, with its bos/eos/pad ids in the config."""
    return tiny_causal_lm(
        len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **kwargs,
    )


def save_tiny(model: Any, tokenizer: Any, directory: str | Path) -> Path:
    """Save model + tokenizer as a normal HF directory (loadable by `load_policy`), atomically.

    Everything is written to a temporary folder beside `directory` and swapped in at the end;
    a previous save at the same place is replaced only once the new one is complete.
    """
    target = Path(directory)
    with atomic_directory(target) as tmp:
        model.save_pretrained(tmp)
        tokenizer.save_pretrained(tmp)
    return target
