"""One copy of each group's prompt keys and values for the rows of a static decoder.

Why: the G rollouts of a GRPO group decode after the same prompt. With a copy of the prompt
in every row's cache (`StaticDecoder.copy_rows`), each decode step reads the prompt's keys
and values G times, and at the theorem study's shapes that reading is about a quarter of the
rollout. Here each group's prompt is cached once; a decode step attends to it with the
queries of all the group's rows at once (one matrix product per group and key/value head,
the prompt read once), attends to each row's own tokens as before, and merges the two by
their log-sum-exp (`prefix_attention.merge`): the same softmax over the same keys, to float
rounding. Cascade or prefix-shared attention, as vLLM's prefix caching and FlashInfer's
cascade kernels call it.

Row `b`'s own tokens stay at slot = position in the decoder's row cache; its slots below
`starts[b]` (its prompt) are neither written nor read.
"""

from __future__ import annotations

import torch
from torch import Tensor

from llds.models.prefix_attention import merge, scores_lse

ROUND = 64
"""Prompt slots are allocated in multiples of this (fewer regrowths, fewer compiled shapes)."""


class SharedPrefix:
    """The prompt store `[groups, KVH, width, D]` per layer, each cache row's group and the
    slot its own tokens start at. Allocated once per decoder and reused from chunk to chunk
    (a compiled step keeps its addresses), growing only for a longer prompt."""

    def __init__(self, layers: int, rows: int, kv_heads: int, head_dim: int) -> None:
        self.shape = (layers, rows, kv_heads, head_dim)
        self.keys: list[Tensor] = []
        self.values: list[Tensor] = []
        self.width = 0
        self.lengths: Tensor | None = None  # [groups] prompt length of each group
        self.row_group: Tensor | None = None  # [rows] group of each cache row
        self.starts: Tensor | None = None  # [rows] first own slot of each row
        self.first_own = 0
        """the smallest `starts`: own slots are read from here (0 in a compiled step)"""
        self._members: tuple[int, tuple[Tensor, Tensor, Tensor]] | None = None  # (rows, index)

    def reserve(self, width: int, like: Tensor) -> None:
        """Room for prompts of `width` tokens, in `like`'s dtype and device (what they held is
        dropped: a new chunk's prompts are written next)."""
        layers, rows, kv_heads, head_dim = self.shape
        if width <= self.width and self.keys and self.keys[0].dtype == like.dtype:
            return
        self.width = -(-width // ROUND) * ROUND
        shape = (rows, kv_heads, self.width, head_dim)
        self.keys = [like.new_zeros(shape) for _ in range(layers)]
        self.values = [like.new_zeros(shape) for _ in range(layers)]

    def assign(self, row_group: Tensor, lengths: Tensor, *, compiled: bool) -> None:
        """Cache row `b` decodes after group `row_group[b]`'s prompt; group `u`'s prompt has
        `lengths[u]` tokens."""
        self.lengths = lengths
        self.row_group = row_group
        self.starts = lengths[row_group]
        self.first_own = 0 if compiled else int(self.starts.min())
        self._members = None

    def swap(self, into: Tensor, outof: Tensor) -> None:
        """Rows move as the decoder's cache rows do (`StaticDecoder.swap_rows`)."""
        assert self.row_group is not None and self.starts is not None
        self.row_group[into] = self.row_group[outof]
        self.starts[into] = self.starts[outof]
        self._members = None

    def tensors(self) -> list[Tensor]:
        return [*self.keys, *self.values]

    # ------------------------------------------------------------------ attention
    def context(self, layer: int, rows: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The prompt of each of `rows` as `(keys, values, visible)`, `[R, KVH, W, D]` and
        `[R, W]` (a gathered copy: for a prefill of many tokens per row)."""
        assert self.row_group is not None and self.lengths is not None
        groups = self.row_group[rows]
        slots = torch.arange(self.width, device=rows.device)
        visible = slots[None, :] < self.lengths[groups][:, None]
        return self.keys[layer][groups], self.values[layer][groups], visible

    def decode_attention(
        self,
        layer: int,
        q: Tensor,
        own: tuple[Tensor, Tensor],
        own_visible: Tensor,
        scaling: float,
    ) -> Tensor:
        """One query per row (`q [n, H, 1, D]`, the first n cache rows) against its group's
        prompt, read once per group, and its own keys and values (`own`, `[n, KVH, T, D]`,
        `own_visible` broadcastable to `[n, 1, 1, T]`), merged; `[n, H, 1, D]`."""
        n, heads, _, dim = q.shape
        kv_heads = own[0].shape[1]
        assert self._members is not None and self._members[0] == n, "prepare(n) first"
        gather, scatter, visible = self._members[1]
        groups = visible.shape[0]
        # each group's rows' queries side by side: [groups, KVH, members * H / KVH, D]
        together = q.reshape(n * heads, dim)[gather]
        out_p, lse_p = scores_lse(
            together, self.keys[layer][:groups], self.values[layer][:groups], visible, scaling
        )
        grouped = q.reshape(n, kv_heads, heads // kv_heads, dim)
        out_o, lse_o = scores_lse(grouped, own[0], own[1], own_visible, scaling)
        out = merge(
            [
                (out_p.reshape(-1, dim)[scatter], lse_p.reshape(-1)[scatter]),
                (out_o.reshape(n, heads, dim), lse_o.reshape(n, heads)),
            ]
        )
        return out.view(n, heads, 1, dim)

    def prepare(self, n: int, heads: int, kv_heads: int) -> None:
        """Index the first `n` cache rows by group for `decode_attention` (outside a compiled
        step: it reads a count on the host), unless they are indexed already."""
        if self._members is None or self._members[0] != n:
            self._members = (n, self._member_index(n, heads, kv_heads))

    def _member_index(self, n: int, heads: int, kv_heads: int) -> tuple[Tensor, Tensor, Tensor]:
        """`(gather [groups, KVH, M * G, ...], scatter [n, H], visible)` for the first `n`
        cache rows, M the most rows a group has there and G = H / KVH: where each group's
        table of queries reads them from the rows' `[n * H]` flattened queries (a group with
        fewer rows reads row 0 in the rest, whose results nobody reads), where each row's
        head reads its result back from that table flattened, and the prompt columns each
        group sees (`[groups, 1, 1, width]`)."""
        assert self.row_group is not None and self.lengths is not None
        group = self.row_group[:n]
        groups, per_kv = self.lengths.numel(), heads // kv_heads
        device = group.device
        order = torch.argsort(group, stable=True)
        counts = torch.bincount(group, minlength=groups)
        width = max(1, int(counts.max()))
        rank = torch.empty(n, dtype=torch.long, device=device)
        rank[order] = (
            torch.arange(n, device=device) - (torch.cumsum(counts, 0) - counts)[group[order]]
        )
        members = torch.zeros(groups, width, dtype=torch.long, device=device)
        members[group, rank] = torch.arange(n, device=device)
        kv = torch.arange(kv_heads, device=device)[None, :, None, None]
        within = torch.arange(per_kv, device=device)[None, None, None, :]
        # table [u, kv, m, j] holds head kv * G + j of row members[u, m]
        gather = members[:, None, :, None] * heads + kv * per_kv + within
        gather = gather.reshape(groups, kv_heads, width * per_kv)
        head = torch.arange(heads, device=device)
        scatter = ((group[:, None] * kv_heads + head // per_kv) * width + rank[:, None]) * per_kv
        scatter = scatter + head % per_kv
        slots = torch.arange(self.width, device=device)
        visible = (slots[None, :] < self.lengths[:, None])[:, None, None, :]
        return gather, scatter, visible
