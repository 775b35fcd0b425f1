"""A Llama-family forward over one segment of each row: a prompt, or the response after its
prompt, attending to a given context's keys and values and causally to its own.

Why: scoring a GRPO batch computes each group's prompt once (`llds.policy.prompt_once`) and
then every response against its prompt's keys and values. Through transformers' forward that
means a per-row copy of the prompt in a cache, a padding mask, and SDPA over the whole masked
rectangle; here the response's attention is two products merged by their log-sum-exp
(`prefix_attention`), over the model's own modules and weights (so LoRA adapters and
autocast apply as usual, and gradients flow to the prompt's keys and values). The models are
those `StaticDecoder` serves (`static_decode_unsupported`); the hidden states equal the
transformers forward's to float rounding.

A segment is right-padded: row `b` has real tokens in columns `[0, lengths[b])` at positions
`starts[b] + column`; the padding columns compute values nobody reads.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from llds.models.prefix_attention import segment_attention
from llds.models.static_decoder import LlamaParts, project_qkv


@dataclass
class Context:
    """Keys and values each row attends to before its own: per layer `[U, KVH, P, D]`, the
    columns each holds (`visible [U, P]` bool) and the context row of each segment row `[n]`."""

    keys: list[Tensor]
    values: list[Tensor]
    visible: Tensor
    of_row: Tensor


class SegmentForward:
    """Calls of one transformers Llama-family model on segments (see the module docstring)."""

    def __init__(self, model: nn.Module) -> None:
        parts = LlamaParts.of(model, "the segment forward")
        self.body, self.lm_head = parts.body, parts.lm_head
        self.heads, self.kv_heads = parts.heads, parts.kv_heads

    def __call__(
        self, ids: Tensor, starts: Tensor, context: Context | None, *, keep_kv: bool = False
    ) -> tuple[Tensor, list[tuple[Tensor, Tensor]]]:
        """The final-norm hidden states `[n, W, H]` of `ids [n, W]` at positions
        `starts[:, None] + column`, and with `keep_kv` each layer's keys and values of the
        segment `[n, KVH, W, D]` (for a later segment's context)."""
        n, width = ids.shape
        positions = starts[:, None] + torch.arange(width, device=ids.device)[None]
        hidden = self.body.embed_tokens(ids)
        cos, sin = self.body.rotary_emb(hidden, positions)
        cos, sin = cos[:, None], sin[:, None]
        kept: list[tuple[Tensor, Tensor]] = []
        for i, layer in enumerate(self.body.layers):
            attn = layer.self_attn
            q, k, v = project_qkv(
                attn, layer.input_layernorm(hidden), cos, sin, self.heads, self.kv_heads
            )
            if keep_kv:
                kept.append((k, v))
            seen = None
            if context is not None:
                rows = context.of_row
                seen = (context.keys[i][rows], context.values[i][rows], context.visible[rows])
            out = segment_attention(q.to(k.dtype), (k, v), seen, attn.scaling)
            hidden = hidden + attn.o_proj(out.transpose(1, 2).reshape(n, width, -1))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.body.norm(hidden), kept

    def logits(self, hidden: Tensor) -> Tensor:
        """The LM head on final-norm hidden states."""
        return self.lm_head(hidden)
