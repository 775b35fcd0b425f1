"""Scoring a rollout batch with each distinct prompt computed once over the whole batch.

Why: the G rollouts of a GRPO group share one prompt (the theorem study: about 216 tokens,
half of each row), and causal attention makes the prompt's keys, values and hidden states
independent of what follows it. Packing whole rows by length (`pack_by_length`) scatters a
group over several micro-batches, so sharing the prompt inside a micro-batch saves little;
packing the groups together instead pads their responses to the longest. Here the two are
decoupled: the distinct prompts run once, packed by their own length, and the responses
("tails") are then packed by theirs and run against their prompts' gathered keys and values.
Every row's log-probs are those of the whole-row forward to float rounding, and with autograd
on the gradient through the shared prompt pass is the sum of the rows' (exact).

Two runners compute the passes: `SegmentRunner`, llds's Llama-family forward whose response
attention is a context part and a causal part merged by log-sum-exp
(`llds.models.segment_forward`), and `TransformersRunner`, the model's own forward with the
prompts' keys and values handed in as a transformers cache (any model that returns a
`DynamicCache`). `runner_for` picks one, or None where neither applies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor

from llds.models.kv_cache import cache_argument, returned_cache
from llds.rollout.batch import RolloutBatch

KV = list[tuple[Tensor, Tensor]]
"""Per layer (keys, values), `[rows, KVH, width, D]`."""


@dataclass
class PromptPass:
    """What the tails of a batch need from its distinct prompts, right-padded to the batch's
    prompt width P (a prompt's token j at column j, whatever the micro-batch, so that its
    keys meet the attention kernels in the same places in every pass): per-layer keys and
    values `[U, KVH, P, D]`, the columns each prompt holds `[U, P]` (1 / 0), the state at each
    prompt's last position `[U, X]` (the backbone's final hidden state, or the logits; it
    predicts response token 0) and each row's prompt `[B]`."""

    keys: list[Tensor]
    values: list[Tensor]
    mask: Tensor
    last: Tensor
    of_row: Tensor


class TransformersRunner:
    """The model's own forward (`net`: a causal LM, or its backbone when `hidden`) with the
    prompts' keys and values handed to the tails as a `DynamicCache`."""

    def __init__(self, net, hidden: bool) -> None:
        self.net, self.hidden = net, hidden

    def prompts(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, KV] | None:
        """Left-padded prompts `ids [n, w]`: the state at their last column and their keys and
        values moved to right padding (`w` wide); None when the model returns no cache of
        readable per-layer tensors."""
        out = self.net(
            input_ids=ids,
            attention_mask=mask,
            position_ids=(mask.cumsum(-1) - 1).clamp(min=0),
            use_cache=True,
            **({} if self.hidden else {"logits_to_keep": 1}),
        )
        layers = _cache_layers(returned_cache(out), ids.shape[1])
        if layers is None:
            return None
        states = (out.last_hidden_state if self.hidden else out.logits)[:, -1]
        return states, _right_padded(layers, mask.sum(-1))

    def tails(self, ids: Tensor, mask: Tensor, kv: KV, prompt_mask: Tensor) -> Tensor:
        """States `[n, W, X]` of the right-padded tails `ids` after the right-padded prompts
        whose keys and values are `kv` (`mask`: the tails' own attention mask; the prompts'
        padding is a hole in the full mask, which the position ids step over)."""
        from transformers import DynamicCache

        full = torch.cat([prompt_mask, mask], dim=1)
        out = self.net(
            input_ids=ids,
            attention_mask=full,
            position_ids=(full.cumsum(-1) - 1).clamp(min=0)[:, prompt_mask.shape[1] :],
            use_cache=True,
            **{cache_argument(self.net): DynamicCache(ddp_cache_data=kv)},
        )
        return out.last_hidden_state if self.hidden else out.logits


class SegmentRunner:
    """llds's segment forward (`SegmentForward`): tails attend to the prompts' keys and values
    and to their own without a padding mask; `hidden`: return final hidden states, else
    logits. `scope` wraps every call (the LoRA reference: adapters off)."""

    def __init__(
        self, segments, hidden: bool, scope: Callable[[], contextlib.AbstractContextManager]
    ) -> None:
        self.segments, self.hidden, self.scope = segments, hidden, scope

    def _out(self, states: Tensor) -> Tensor:
        return states if self.hidden else self.segments.logits(states)

    def prompts(self, ids: Tensor, mask: Tensor) -> tuple[Tensor, KV]:
        """As `TransformersRunner.prompts`: the prompts run right-padded (no padding mask
        needed: attention is causal)."""
        lengths = mask.sum(-1)
        shift = ids.shape[1] - lengths  # left padding of each row
        cols = torch.arange(ids.shape[1], device=ids.device)[None]
        right = ids.gather(1, (cols + shift[:, None]).clamp(max=ids.shape[1] - 1))
        with self.scope():
            states, kv = self.segments(right, torch.zeros_like(lengths), None, keep_kv=True)
            last = self._out(states[torch.arange(len(ids), device=ids.device), lengths - 1])
        return last, kv

    def tails(self, ids: Tensor, mask: Tensor, kv: KV, prompt_mask: Tensor) -> Tensor:
        """As `TransformersRunner.tails`."""
        from llds.models.segment_forward import Context

        rows = torch.arange(len(ids), device=ids.device)
        context = Context([k for k, _ in kv], [v for _, v in kv], prompt_mask.bool(), rows)
        with self.scope():
            states, _ = self.segments(ids, prompt_mask.sum(-1), context)
            return self._out(states)


def distinct_prompts(batch: RolloutBatch) -> tuple[list[int], Tensor] | None:
    """(one row holding each distinct prompt, each row's index among them); None when no
    prompt repeats, where sharing saves nothing."""
    p = batch.prompt_len
    key = torch.cat([batch.input_ids[:, :p], batch.attention_mask[:, :p]], dim=1)
    uniq, of_row = torch.unique(key, dim=0, return_inverse=True)
    if uniq.shape[0] == len(batch):
        return None
    rows = torch.arange(len(batch))
    first = torch.full((uniq.shape[0],), len(batch), dtype=torch.long)
    first = first.scatter_reduce(0, of_row, rows, reduce="amin")
    return first.tolist(), of_row


def run_prompts(
    runner, batch: RolloutBatch, token_budget: int, device: torch.device
) -> PromptPass | None:
    """Each distinct prompt of `batch` through `runner` once (on `device`), in micro-batches
    packed by length under `token_budget`; None when no prompt repeats or the runner cannot
    hand out the prompts' keys and values."""
    from llds.policy.forward import pack_by_length  # forward imports this module

    found = distinct_prompts(batch)
    if found is None:
        return None
    first, of_row = found
    p = batch.prompt_len
    lengths = batch.attention_mask[first, :p].sum(-1).tolist()
    keys: list[Tensor] = []
    values: list[Tensor] = []
    last: Tensor | None = None
    for group in pack_by_length(lengths, range(len(first)), token_budget):
        width = max(lengths[u] for u in group)
        rows = [first[u] for u in group]
        got = runner.prompts(
            batch.input_ids[rows, p - width : p].to(device),
            batch.attention_mask[rows, p - width : p].to(device),
        )
        if got is None:
            return None
        state, layers = got
        if last is None:
            last = state.new_zeros(len(first), state.shape[-1])
            for k, v in layers:
                keys.append(k.new_zeros(len(first), k.shape[1], p, k.shape[3]))
                values.append(v.new_zeros(len(first), v.shape[1], p, v.shape[3]))
        index = torch.tensor(group, device=state.device)
        last = last.index_copy(0, index, state)
        for i, (k, v) in enumerate(layers):
            # out of place: with autograd on, the tails' gradient reaches every prompt pass
            keys[i] = _put(keys[i], index, k)
            values[i] = _put(values[i], index, v)
    assert last is not None
    held = torch.tensor(lengths, device=last.device)
    mask = (torch.arange(p, device=last.device)[None, :] < held[:, None]).long()
    return PromptPass(keys, values, mask, last, of_row.to(last.device))


def _put(store: Tensor, rows: Tensor, part: Tensor) -> Tensor:
    """`store` with `part` in rows `rows`, its first columns of dimension 2 (a new tensor when
    autograd records, so that every part keeps its gradient path)."""
    if not torch.is_grad_enabled():
        store[rows, :, : part.shape[2]] = part
        return store
    padded = torch.nn.functional.pad(part, (0, 0, 0, store.shape[2] - part.shape[2]))
    return store.index_copy(0, rows, padded)


def _cache_layers(cache, width: int) -> KV | None:
    """The per-layer (keys, values) of a transformers cache holding `width` positions, or None
    for a cache this module cannot read (no per-layer tensors, or another length)."""
    layers = getattr(cache, "layers", None)
    if not layers or cache.get_seq_length() != width:
        return None
    out = []
    for layer in layers:
        k, v = getattr(layer, "keys", None), getattr(layer, "values", None)
        if not isinstance(k, Tensor) or not isinstance(v, Tensor) or k.shape[-2] != width:
            return None
        out.append((k, v))
    return out


def _right_padded(kv: KV, lengths: Tensor) -> KV:
    """Per-layer keys and values `[n, KVH, w, D]` of left-padded rows (`lengths[i]` real
    positions) moved to right padding."""
    width = kv[0][0].shape[2]
    cols = torch.arange(width, device=lengths.device)[None]
    index = (cols + (width - lengths)[:, None]).clamp(max=width - 1)[:, None, :, None]
    return [(k.gather(2, index.expand_as(k)), v.gather(2, index.expand_as(v))) for k, v in kv]


def tail_micro_batches(
    batch: RolloutBatch, token_budget: int, rows: list[int] | None = None
) -> list[list[int]]:
    """`rows` (default all) cut into tail micro-batches over the responses alone (the prompt
    is context, read from the prompt pass), under `token_budget` rows x padded response width,
    cut where padding costs more than a call (`pack_least_padding`)."""
    from llds.policy import forward  # read at call time: forward imports this module

    every = list(range(len(batch))) if rows is None else rows
    lengths = batch.responses().attention_mask.sum(-1).tolist()
    return forward.pack_least_padding(lengths, every, token_budget)


def tail_states(
    runner, sub: RolloutBatch, of_row: Tensor, prompts: PromptPass, *, pool_hidden: bool
) -> Tensor:
    """The states that predict the response tokens 0..R-1 of `sub` (rows of the batch whose
    prompts `prompts` holds; `of_row`: each one's prompt), `[n, R, X]` (with `pool_hidden`: and
    the last response column's too, `[n, R + 1, X]`)."""
    p, r = sub.prompt_len, sub.response_len
    first = prompts.last[of_row][:, None]  # the prompt's last position predicts token 0
    end = r if pool_hidden else r - 1  # the last column predicts nothing, but is pooled
    if end <= 0:
        return first
    cut = slice(0, p)  # `sub` holds prompts of p tokens at most
    pairs = zip(prompts.keys, prompts.values, strict=True)
    kv = [(k[of_row, :, cut], v[of_row, :, cut]) for k, v in pairs]
    device = prompts.last.device
    rest = runner.tails(
        sub.input_ids[:, p : p + end].to(device),
        sub.attention_mask[:, p : p + end].to(device),
        kv,
        prompts.mask[of_row, cut],
    )
    return torch.cat([first, rest], dim=1)


def runner_for(model, split: tuple[object, object] | None):
    """The runner of `model`'s prompt-once passes: `SegmentRunner` where llds's segment forward
    serves the model (also the LoRA reference, its policy run with the adapters off), else
    `TransformersRunner` (the backbone of `split` when the head is split off, else `model`)."""
    from llds.models.segment_forward import SegmentForward
    from llds.models.static_decoder import static_decode_unsupported
    from llds.policy.lora import WithoutAdapters

    hidden = split is not None
    if isinstance(model, WithoutAdapters):
        policy = model.model
        if static_decode_unsupported(policy) is None:
            return SegmentRunner(SegmentForward(policy), hidden, lambda: _adapters_off(policy))
    elif static_decode_unsupported(model) is None:
        return SegmentRunner(SegmentForward(model), hidden, contextlib.nullcontext)
    return TransformersRunner(split[0] if split is not None else model, hidden)


@contextlib.contextmanager
def _adapters_off(policy) -> Iterator[None]:
    with torch.no_grad(), policy.disable_adapter():
        yield


class MiniBatchPrompts:
    """The update's prompt-once passes over one mini-batch (`rows` of `batch`): its distinct
    prompts run once with autograd on, its micro-batches' tails read detached copies of their
    keys and values (so each micro-batch's backward stops there and accumulates their
    gradient), and `backward` then runs the prompt pass's backward once with the gradient
    summed over the micro-batches: the mini-batch's exact gradient, the prompts computed once.
    `ready` is false when no prompt repeats (the caller runs whole rows)."""

    def __init__(
        self, runner, batch: RolloutBatch, rows: list[int], token_budget: int, device
    ) -> None:
        self.runner = runner
        self.local = {row: i for i, row in enumerate(rows)}
        self.graph = run_prompts(runner, batch.select(rows), token_budget, device)
        self.ready = self.graph is not None
        self.read: PromptPass | None = None
        if self.graph is not None:
            g = self.graph
            self.read = PromptPass(
                [_leaf(k) for k in g.keys],
                [_leaf(v) for v in g.values],
                g.mask,
                _leaf(g.last),
                g.of_row,
            )

    def tail_states(self, sub: RolloutBatch, micro: list[int]) -> Tensor:
        """`tail_states` of the micro-batch `sub` (rows `micro` of the batch)."""
        assert self.read is not None
        index = torch.tensor([self.local[r] for r in micro], device=self.read.of_row.device)
        return tail_states(self.runner, sub, self.read.of_row[index], self.read, pool_hidden=False)

    def backward(self) -> None:
        """The prompt pass's backward with the gradients its copies gathered (none: nothing
        read them with a gradient)."""
        assert self.graph is not None and self.read is not None
        pairs = [
            (out, leaf.grad)
            for out, leaf in zip(
                (*self.graph.keys, *self.graph.values, self.graph.last),
                (*self.read.keys, *self.read.values, self.read.last),
                strict=True,
            )
            if leaf.grad is not None and out.requires_grad
        ]
        if pairs:
            torch.autograd.backward([o for o, _ in pairs], [g for _, g in pairs])
        self.graph = self.read = None


def _leaf(t: Tensor) -> Tensor:
    """A detached copy that gathers the gradient of what reads it."""
    return t.detach().requires_grad_(t.requires_grad)
