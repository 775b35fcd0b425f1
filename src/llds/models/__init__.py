"""Policies and tokenizers: HF checkpoints, the SmolLM2 GGUF conversion, tiny random models, BPE.

Submodules import torch/transformers lazily (inside functions), so importing this package is cheap.
"""

from llds.models.bpe import EOS_TOKEN, PROTOCOL_TAGS, tokenizer_for_world, train_bpe_tokenizer
from llds.models.hf import load_policy, prepare_tokenizer, resolve_model_source
from llds.models.smollm2 import default_cache_dir, gguf_file, load_smollm2, smollm2_checkpoint
from llds.models.tiny import save_tiny, tiny_causal_lm, tiny_causal_lm_for

__all__ = [
    "EOS_TOKEN",
    "PROTOCOL_TAGS",
    "default_cache_dir",
    "gguf_file",
    "load_policy",
    "load_smollm2",
    "prepare_tokenizer",
    "resolve_model_source",
    "save_tiny",
    "smollm2_checkpoint",
    "tiny_causal_lm",
    "tiny_causal_lm_for",
    "tokenizer_for_world",
    "train_bpe_tokenizer",
]
