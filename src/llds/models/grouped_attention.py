"""A decode-friendly attention for sampling on a CPU: grouped queries over a preallocated cache.

Why: a bf16 sampling copy decoding one token per row spent about a third of each token step
(8 rows, 256 tokens, a 2-core CPU; benchmarks/README.md) in two copies per layer and token that
transformers' eager attention and `DynamicCache` make and nothing needs:

- `DynamicCache` concatenates every new key/value onto the old ones, so each token step
  rewrites the whole cache of every layer (and allocates it anew);
- eager attention repeats every key/value head for each query head it serves (grouped-query
  attention: SmolLM2-135M has 9 query heads over 3 key/value heads), another full copy of the
  cache, three times its size.

`SlabCache` keeps each layer's keys and values in a preallocated slab that grows in chunks of
`CHUNK` positions, so a token step writes one column. `grouped_query_attention` folds the query
heads that share a key/value head into one matrix product against that head, so nothing is
repeated, and reads the slab whole: the slab's unwritten columns are masked out. The logits are
the eager path's: to the last bit on the SmolLM2-135M bf16 copy measured, within float rounding
in the tests (the same products, only grouped).

The two work together: the cache hands the attention more columns than it has written, which
only `grouped_query_attention` knows to mask. So `decode_cache_for` gives a `SlabCache` exactly
to models switched to `GROUPED_ATTENTION`, which the rollout engine then uses for its episodes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch import nn
from transformers import AttentionInterface
from transformers.cache_utils import Cache, DynamicLayer
from transformers.masking_utils import AttentionMaskInterface, eager_mask

from llds.models.kv_cache import transformers_model_in

if TYPE_CHECKING:
    from torch import Tensor

GROUPED_ATTENTION = "llds_grouped"
"""The `attn_implementation` name (`rollout.attn_implementation: llds_grouped`)."""

CHUNK = 128
"""Positions a slab grows by: one regrowth (a copy of the cache) per 128 tokens, and at most 127
masked columns read per token step."""


def grouped_query_attention(
    module: nn.Module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask: Tensor | None,
    scaling: float,
    dropout: float = 0.0,
    **kwargs: Any,
) -> tuple[Tensor, None]:
    """Attention with the signature transformers calls: `query` `[B, H, q, D]`, `key`/`value`
    `[B, KVH, K, D]` with `H` a multiple of `KVH`, `attention_mask` an additive
    `[B, 1, q, L]` with `L <= K`. Columns `L..K` of the keys (a slab's unwritten part) get no
    weight. Returns `[B, q, H, D]` and no attention weights."""
    for name in ("sliding_window", "softcap", "s_aux"):
        if kwargs.get(name) is not None:
            raise NotImplementedError(
                f"{GROUPED_ATTENTION} attention does not implement {name}; use eager attention"
            )
    batch, heads, q_len, dim = query.shape
    kv_heads, columns = key.shape[1], key.shape[2]
    groups = heads // kv_heads
    # query head h reads key/value head h // groups (transformers' repeat_kv order)
    grouped = query.reshape(batch, kv_heads, groups * q_len, dim)
    scores = torch.matmul(grouped, key.transpose(2, 3)).mul_(scaling)
    by_head = scores.view(batch, kv_heads, groups, q_len, columns)
    written = columns if attention_mask is None else attention_mask.shape[-1]
    if attention_mask is not None:
        by_head[..., :written].add_(attention_mask[:, :, None])
    if written < columns:
        by_head[..., written:] = float("-inf")
    weights = nn.functional.softmax(scores, dim=-1, dtype=torch.float32).to(query.dtype)
    weights = nn.functional.dropout(weights, p=dropout, training=module.training)
    out = torch.matmul(weights, value)  # [B, KVH, groups * q, D]
    return out.view(batch, heads, q_len, dim).transpose(1, 2).contiguous(), None


def register_grouped_attention() -> None:
    """Make `GROUPED_ATTENTION` a name `set_attn_implementation` accepts (idempotent); its
    masks are eager attention's additive ones."""
    AttentionInterface.register(GROUPED_ATTENTION, grouped_query_attention)
    AttentionMaskInterface.register(GROUPED_ATTENTION, eager_mask)


class SlabLayer(DynamicLayer):
    """One layer's keys and values in a slab `[B, KVH, capacity, D]`; `update` writes the new
    positions and returns the whole slab (see the module docstring for who may read it)."""

    def lazy_initialization(self, key_states: Tensor, value_states: Tensor) -> None:
        super().lazy_initialization(key_states, value_states)
        self.written = 0
        self.keys = self.values = None

    def update(
        self, key_states: Tensor, value_states: Tensor, *args: Any, **kwargs: Any
    ) -> tuple[Tensor, Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        start, end = self.written, self.written + key_states.shape[-2]
        if self.keys is None or end > self.keys.shape[-2]:
            self._grow(key_states, value_states, -(-end // CHUNK) * CHUNK)
        self.keys[:, :, start:end] = key_states
        self.values[:, :, start:end] = value_states
        self.written = end
        return self.keys, self.values

    def _grow(self, key_states: Tensor, value_states: Tensor, capacity: int) -> None:
        # zeros, not empty: a masked column gets weight 0, and 0 * NaN garbage would be NaN
        batch, heads, _, dim = key_states.shape
        keys = key_states.new_zeros(batch, heads, capacity, dim)
        values = value_states.new_zeros(batch, heads, capacity, value_states.shape[-1])
        if self.written:
            keys[:, :, : self.written] = self.keys[:, :, : self.written]
            values[:, :, : self.written] = self.values[:, :, : self.written]
        self.keys, self.values = keys, values

    def get_seq_length(self) -> int:
        return self.written if self.is_initialized else 0

    # DynamicLayer's mask sizes, row selection and repetition read `get_seq_length` and index
    # the batch dimension, so they serve a slab as they are

    def crop(self, max_length: int) -> None:
        raise NotImplementedError("a SlabCache is not cropped (the rollout engine never does)")


class SlabCache(Cache):
    """A `DynamicCache` counterpart whose layers are `SlabLayer`s, for `GROUPED_ATTENTION`."""

    def __init__(self) -> None:
        super().__init__(layer_class_to_replicate=SlabLayer)


def decode_cache_for(model: nn.Module) -> Cache | None:
    """A fresh `SlabCache` when the transformers model in `model` uses `GROUPED_ATTENTION`;
    None otherwise (the model then builds its own cache)."""
    inner = transformers_model_in(model)
    if inner is not None and getattr(inner.config, "_attn_implementation", None) == (
        GROUPED_ATTENTION
    ):
        return SlabCache()
    return None


def check_full_attention(config: Any) -> None:
    """Refuse a model config with sliding-window or other non-full attention layers, which a
    slab that keeps every position does not serve. Raises ValueError naming the layer types."""
    text = config.get_text_config(decoder=True)
    kinds = set(getattr(text, "layer_types", None) or ["full_attention"])
    window = getattr(text, "sliding_window", None)
    if not getattr(text, "use_sliding_window", True):
        window = None
    if kinds != {"full_attention"} or window:
        raise ValueError(
            f"{GROUPED_ATTENTION} serves full attention only; this model's layers are "
            f"{sorted(kinds)} (sliding_window={window})"
        )
