"""Attention over a shared context plus each row's own keys, merged by their log-sum-exp.

Why: the G rollouts of a GRPO group share one prompt. Attending to it as part of each row's
keys, as transformers' forward does with a cache, means a copy of the prompt's keys and
values per row, a padding mask over the whole key range, and with that mask SDPA computes the
full rectangle (no `is_causal`). Splitting the keys into the context (the prompt: every column
visible up to its length) and the row's own keys (causal) gives two attentions whose softmax
merge exactly:

    out = (e^(l_c - m) out_c + e^(l_o - m) out_o) / (e^(l_c - m) + e^(l_o - m))

with `l` each part's log-sum-exp of its scores and `m` the larger of the two (the softmax over
the concatenated keys, to float rounding). `segment_attention` serves a segment of many
queries per row (the scoring passes), `decode_attention` one query per row against a context
shared by a group of rows (the decode step).
"""

from __future__ import annotations

import torch
from torch import Tensor
from torch.nn import functional as F


def merge_with_lse(parts: list[tuple[Tensor, Tensor]]) -> tuple[Tensor, Tensor]:
    """The softmax attention over the union of several key sets, from each set's output
    `[..., W, D]` and float32 log-sum-exp `[..., W]`: the output (in the outputs' dtype) and
    the union's log-sum-exp."""
    peak = torch.stack([lse for _, lse in parts]).amax(0)
    peak = peak.clamp(min=-1e30)  # a query no part shows anything stays finite (padding)
    out: Tensor | None = None
    total: Tensor | None = None
    for part, lse in parts:
        weight = torch.exp(lse - peak)
        term = part.float() * weight[..., None]
        out = term if out is None else out + term
        total = weight if total is None else total + weight
    assert out is not None and total is not None
    return (out / total[..., None]).to(parts[0][0].dtype), peak + torch.log(total)


def merge(parts: list[tuple[Tensor, Tensor]]) -> Tensor:
    """`merge_with_lse`'s output alone."""
    return merge_with_lse(parts)[0]


_FLASH = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_FLASH_BACKWARD = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward


class _TwoPartFlash(torch.autograd.Function):
    """Attention over a context (every visible column) and the segment's own keys (causal) on
    a CPU: the flash-attention kernel SDPA runs there, once per part, merged by log-sum-exp.
    Its backward hands each part's kernel backward the merged output and log-sum-exp, which
    gives each part's share of the gradient of the attention over all keys (as ring attention
    does), so training and scoring compute the same forward."""

    @staticmethod
    def forward(ctx, q, ctx_k, ctx_v, bias, own_k, own_v, scaling):
        out_c, lse_c = _FLASH(q, ctx_k, ctx_v, 0.0, False, attn_mask=bias, scale=scaling)
        out_o, lse_o = _FLASH(q, own_k, own_v, 0.0, True, scale=scaling)
        out, lse = merge_with_lse([(out_c, lse_c.float()), (out_o, lse_o.float())])
        ctx.save_for_backward(q, ctx_k, ctx_v, bias, own_k, own_v, out, lse.to(lse_c.dtype))
        ctx.scaling = scaling
        return out

    @staticmethod
    def backward(ctx, grad):
        q, ctx_k, ctx_v, bias, own_k, own_v, out, lse = ctx.saved_tensors
        grad = grad.contiguous()
        gq_c, gk_c, gv_c = _FLASH_BACKWARD(
            grad, q, ctx_k, ctx_v, out, lse, 0.0, False, attn_mask=bias, scale=ctx.scaling
        )
        gq_o, gk_o, gv_o = _FLASH_BACKWARD(
            grad, q, own_k, own_v, out, lse, 0.0, True, scale=ctx.scaling
        )
        return gq_c + gq_o, gk_c, gv_c, None, gk_o, gv_o, None


def segment_attention(
    q: Tensor,
    own: tuple[Tensor, Tensor],
    context: tuple[Tensor, Tensor, Tensor] | None,
    scaling: float,
) -> Tensor:
    """Queries `q [n, H, W, D]` of a right-padded segment against its own keys and values
    (`[n, KVH, W, D]`, causally) and a context's (`(keys, values, visible)`: `[n, KVH, P, D]`
    and `[n, P]` bool, every visible column; each row must see one), `[n, H, W, D]` out.

    On a CPU: two flash-attention calls (the own part `is_causal`, skipping its upper
    triangle) merged by their log-sum-exp, with autograd through both (`_TwoPartFlash`);
    elsewhere one SDPA call over the concatenated keys with the equivalent mask."""
    groups = q.shape[1] // own[0].shape[1]

    def heads(t: Tensor) -> Tensor:  # grouped-query heads repeated (transformers' order)
        return t.repeat_interleave(groups, dim=1) if groups > 1 else t

    own_k, own_v = heads(own[0]), heads(own[1])
    if context is None:
        return F.scaled_dot_product_attention(q, own_k, own_v, is_causal=True, scale=scaling)
    ctx_k, ctx_v, visible = heads(context[0]), heads(context[1]), context[2]
    tensors = (q, own_k, own_v, ctx_k, ctx_v)
    if all(t.device.type == "cpu" for t in tensors) and len({t.dtype for t in tensors}) == 1:
        bias = torch.zeros(visible.shape, dtype=q.dtype, device=q.device)
        bias = bias.masked_fill(~visible, float("-inf"))[:, None, None, :]
        return _TwoPartFlash.apply(q, ctx_k, ctx_v, bias, own_k, own_v, scaling)
    n, _, width, _ = q.shape
    cols = torch.arange(width, device=q.device)
    causal = (cols[None, :] <= cols[:, None]).expand(n, 1, width, width)
    seen = visible[:, None, None, :].expand(n, 1, width, visible.shape[-1])
    return F.scaled_dot_product_attention(
        q,
        torch.cat([ctx_k, own_k], dim=2),
        torch.cat([ctx_v, own_v], dim=2),
        attn_mask=torch.cat([seen, causal], dim=-1),
        scale=scaling,
    )


def scores_lse(q: Tensor, keys: Tensor, values: Tensor, visible: Tensor, scaling: float):
    """Grouped queries `q [B, KVH, Q, D]` against `keys`/`values [B, KVH, T, D]` with
    `visible` (broadcastable to `[B, KVH, Q, T]`): the attention output `[B, KVH, Q, D]` and
    its float32 log-sum-exp `[B, KVH, Q]`, from materialized scores (a few queries per key
    head: the decode step; no autograd: computed in place)."""
    scores = torch.matmul(q, keys.transpose(2, 3)).float().mul_(scaling)
    scores.masked_fill_(~visible, float("-inf"))
    # a query that sees nothing here (padding) gets weights 0, not NaN, and a huge negative lse
    peak = scores.amax(-1, keepdim=True).clamp_(min=-1e30)
    weights = scores.sub_(peak).exp_()
    total = weights.sum(-1, keepdim=True)
    out = torch.matmul(weights.to(values.dtype), values).float().div_(total)
    return out.to(values.dtype), (peak + total.log()).squeeze(-1)
