"""How many rollouts decode together: as many as a memory budget of key/value cache holds.

Why: more rows per decode step amortize the step's fixed work (its Python, its kernel calls)
over more tokens; the theorem study's 320 rollouts in one chunk instead of five of 64 made
its rollout faster with the same tokens. What bounds the rows is the cache: a row holds keys
and values for every layer up to `rollout.max_total_tokens`, which for a 4-layer 128-wide
model is 3 MB and for SmolLM2-135M 71 MB, so a fixed row count is either too few for the one
or too many for the other. The budget (`rollout.cache_memory_mb`) sizes both.
"""

from __future__ import annotations

from torch import nn

from llds.models.kv_cache import transformers_model_in


def cache_bytes_per_row(model: nn.Module, positions: int) -> int | None:
    """Bytes of keys and values one row holds at `positions` (every layer, the model's
    parameter dtype); None when the model's config does not say its layers and heads."""
    inner = transformers_model_in(model)
    config = getattr(inner, "config", None)
    layers = getattr(config, "num_hidden_layers", None)
    heads = getattr(config, "num_attention_heads", None)
    hidden = getattr(config, "hidden_size", None)
    if not (layers and heads and hidden):
        return None
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    item = next(model.parameters()).element_size()
    return 2 * layers * kv_heads * head_dim * positions * item


def chunk_rows(model: nn.Module, positions: int, max_rows: int, memory_mb: int) -> int:
    """Rows per chunk: `max_rows`, or fewer when their caches at `positions` would exceed
    `memory_mb` (at least 1)."""
    per_row = cache_bytes_per_row(model, positions)
    if per_row is None or per_row <= 0:
        return max_rows
    return max(1, min(max_rows, memory_mb * 2**20 // per_row))
