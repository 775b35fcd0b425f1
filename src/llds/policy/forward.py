"""Per-token log-probs (and entropy) of the response tokens of a rollout (sub-)batch."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

import torch
from torch import Tensor

from llds.algo.logprobs import token_log_probs_and_entropy
from llds.models.kv_cache import cache_argument, returned_cache
from llds.policy.prompt_once import (
    MiniBatchPrompts,
    run_prompts,
    runner_for,
    tail_micro_batches,
    tail_states,
)
from llds.rollout.batch import RolloutBatch


def response_log_probs(
    model,
    batch: RolloutBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
    actions_only: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """`log pi(y_t | context)` for the response columns, `[B, R]` float32.

    Only the columns the model wrote (`batch.loss_mask`) go through the LM head: prompts,
    observations and padding are context, and their logits (`[B, R, V]`, the largest tensors of
    a step) are never read. Those columns come back as 0. `actions_only=False`, or a model the
    head cannot be split from (see `split_lm_head`: a non-linear head, an FSDP-sharded root),
    runs the head on every response column (`logits_to_keep`).
    Rows with the same prompt (a GRPO group) run that prompt once (see `_shared_prompt_outputs`)
    unless `share_prompts=False`: a sharded model needs exactly one model call per micro-batch
    on every rank, and the shared path makes one or two depending on the data.
    """
    split = split_lm_head(model) if actions_only else None
    lp, ent, _ = _scores(
        model,
        batch,
        split,
        temperature,
        with_entropy=with_entropy,
        share_prompts=share_prompts,
        pool_hidden=False,
    )
    return lp, ent


def response_log_probs_and_hidden(
    model, batch: RolloutBatch, *, temperature: float = 1.0
) -> tuple[Tensor, Tensor] | None:
    """`response_log_probs` and `pooled_response_hidden` from one forward pass, or None when the
    head cannot be split off the backbone (then they are two passes).

    The backbone's last hidden state at response column t scores token t + 1 and is the state
    the hidden similarity pools for token t, so the pooled states come with the log-probs for
    the price of one more column."""
    split = split_lm_head(model)
    if split is None:
        return None
    lp, _, pooled = _scores(
        model, batch, split, temperature, with_entropy=False, share_prompts=True, pool_hidden=True
    )
    assert pooled is not None
    return lp, pooled


def _scores(
    model,
    batch: RolloutBatch,
    split: tuple[object, object] | None,
    temperature: float,
    *,
    with_entropy: bool,
    share_prompts: bool,
    pool_hidden: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`(log-probs, entropy, pooled hidden)` of the response columns (see the two callers); the
    pooled hidden needs `split` and runs the sequence through its last column."""
    r, p = batch.response_len, batch.prompt_len
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    mask = batch.attention_mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    net = split[0] if split is not None else model
    written = _written(batch, split, device)
    end = None if pool_hidden else -1  # the last column predicts nothing, but is pooled
    states = None
    if share_prompts and r > 1:
        states = _shared_prompt_outputs(
            net, ids, mask, positions, p, hidden=split is not None, end=end
        )
    if states is None:
        out = net(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            **({} if split is not None else {"logits_to_keep": r + 1}),
        )
        # position P-1+t predicts response token t
        states = out.last_hidden_state[:, p - 1 : end] if split is not None else out.logits[:, :-1]
    return _scores_of_states(
        states,
        batch,
        split,
        written,
        temperature,
        with_entropy=with_entropy,
        pool_hidden=pool_hidden,
    )


def _written(batch: RolloutBatch, split, device: torch.device) -> tuple[Tensor, ...] | None:
    """The model-written columns' (row, column) indices when the head runs on them alone;
    taken before the forward is queued: a boolean index of a GPU tensor, or a copy to it, would
    make the host wait for the forward to finish."""
    if split is None:
        return None
    return batch.loss_mask.bool().nonzero().to(device).unbind(1)


def _scores_of_states(
    states: Tensor,
    batch: RolloutBatch,
    split: tuple[object, object] | None,
    written: tuple[Tensor, ...] | None,
    temperature: float,
    *,
    with_entropy: bool,
    pool_hidden: bool,
) -> tuple[Tensor, Tensor | None, Tensor | None]:
    """`_scores` from the states that predict the response tokens, `[B, R, X]` (`[B, R + 1, H]`
    with `pool_hidden`): the backbone's hidden states with `split` (the head then runs on the
    `written` tokens only), else the logits."""
    labels = batch.input_ids[:, batch.prompt_len :].to(states.device)
    t = temperature if temperature > 0 else 1.0
    if split is None:
        lp, ent = token_log_probs_and_entropy(
            states, labels, temperature=t, with_entropy=with_entropy
        )
        return lp, ent, None
    assert written is not None
    pooled = None
    if pool_hidden:
        weight = batch.loss_mask.to(states.device).float().unsqueeze(-1)
        pooled = (states[:, 1:].float() * weight).sum(1) / weight.sum(1).clamp(min=1)
        states = states[:, :-1]
    logits = split[1](states[written])  # [N, V]: the model-written tokens only
    lp, ent = token_log_probs_and_entropy(
        logits, labels[written], temperature=t, with_entropy=with_entropy
    )
    zeros = torch.zeros(labels.shape, dtype=lp.dtype, device=states.device)
    lp = zeros.index_put(written, lp)
    return lp, (None if ent is None else zeros.index_put(written, ent)), pooled


def log_probs_from_states(
    model,
    batch: RolloutBatch,
    states_of: Callable[[], Tensor],
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`response_log_probs` from states another pass computes (`states_of()`: the states that
    predict the response tokens, as `MiniBatchPrompts.tail_states` gives them; backbone
    hidden states when the head splits off, else logits)."""
    split = split_lm_head(model)
    written = _written(batch, split, next(model.parameters()).device)
    lp, ent, _ = _scores_of_states(
        states_of(),
        batch,
        split,
        written,
        temperature,
        with_entropy=with_entropy,
        pool_hidden=False,
    )
    return lp, ent


def mini_batch_prompts(
    model, batch: RolloutBatch, rows: list[int], token_budget: int
) -> MiniBatchPrompts | None:
    """The update's prompt-once passes over the mini-batch `rows` (see `MiniBatchPrompts`),
    or None where they do not apply: no prompt repeats, or activation checkpointing (which
    would recompute the segment forward's layers differently from the model's own)."""
    if _checkpointing(model):
        return None
    split = split_lm_head(model)
    device = next(model.parameters()).device
    prompts = MiniBatchPrompts(runner_for(model, split), batch, rows, token_budget, device)
    return prompts if prompts.ready else None


def split_lm_head(model) -> tuple[object, object] | None:
    """`(backbone, lm_head)` when logits are a plain linear map of the backbone's last hidden
    state (no soft-capping, no adapter on the head); None otherwise. A peft model is unwrapped:
    its adapters live inside the backbone's layers, so the backbone call still runs them. A
    wrapper that knows its own split (the LoRA reference, `lm_head_split`) gives it."""
    own = getattr(model, "lm_head_split", None)
    if callable(own):
        return own()
    if hasattr(model, "get_base_model"):
        model = model.get_base_model()
    if _sharded_root(model):
        return None  # the root's hooks gather its parameters: it must be called as a whole
    if getattr(getattr(model, "config", None), "final_logit_softcapping", None):
        return None
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    prefix = getattr(model, "base_model_prefix", "")
    backbone = getattr(model, prefix, None) if prefix else None
    if not isinstance(head, torch.nn.Linear) or backbone is None or backbone is model:
        return None
    if getattr(backbone, "get_output_embeddings", lambda: None)() is not None:
        return None  # the "backbone" is itself a model with a head: not the split we need
    return backbone, head


def _shared_prompt_outputs(
    net, ids: Tensor, mask: Tensor, positions: Tensor, p: int, *, hidden: bool, end: int | None = -1
) -> Tensor | None:
    """`[B, R, X]` for the response columns with each distinct prompt run once, or None: the
    logits (X = V) of a causal LM, or with `hidden` the last hidden states (X = H) of its
    backbone, at the positions that predict response tokens 0..R-1 (`end=None`: and at the last
    response column too, `[B, R + 1, X]`).

    The G rollouts of a group share their prompt, and causal attention makes the prompt's hidden
    states independent of what follows. So the distinct prompts go through the model once, their
    key/value cache is gathered out to the rows, and only the responses run per row. Autograd
    sums the rows' gradients through the shared prompt pass, which is exactly the gradient of
    running it per row; only float rounding differs. None when no prompt repeats, or when the
    model cannot carry a cache with gradients (activation checkpointing drops it in training).
    """
    if net.training and _checkpointing(net):
        return None
    key = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    b, u = ids.shape[0], uniq.shape[0]
    if u == b:
        return None
    rows = torch.arange(b, device=ids.device)
    first = torch.full((u,), b, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # one row per distinct prompt
    head = net(
        input_ids=ids[first, :p],
        attention_mask=mask[first, :p],
        position_ids=positions[first, :p],
        use_cache=True,
        **({} if hidden else {"logits_to_keep": 1}),
    )
    cache = returned_cache(head)
    if not hasattr(cache, "batch_select_indices") or cache.get_seq_length() != p:
        return None  # no cache, or one that cannot be gathered to rows: the plain path
    cache.batch_select_indices(inverse)  # the prompt's keys/values, one copy per row
    tail = net(
        input_ids=ids[:, p:end],
        attention_mask=mask[:, :end],
        position_ids=positions[:, p:end],
        use_cache=True,
        **{cache_argument(net): cache},
    )
    last, rest = (
        (head.last_hidden_state[:, -1:], tail.last_hidden_state)
        if hidden
        else (head.logits, tail.logits)
    )
    # the prompt's last position predicts response token 0; response position t predicts t + 1
    return torch.cat([last[inverse], rest], dim=1)


def _sharded_root(model) -> bool:
    """The model itself is FSDP-wrapped (`fully_shard` on the root, or FSDP1's wrapper)."""
    try:
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel
    except ImportError:  # a torch build without distributed support
        return False
    return isinstance(model, (FSDPModule, FullyShardedDataParallel))


def _checkpointing(model) -> bool:
    """Activation checkpointing is on somewhere (HF sets the flag on each checkpointed layer)."""
    return any(getattr(m, "gradient_checkpointing", False) for m in model.modules())


def pack_by_length(
    lengths: Sequence[int], rows: Iterable[int], token_budget: int
) -> list[list[int]]:
    """Group `rows` so that rows x padded length stays under `token_budget` per micro-batch.

    Rows are sorted by length so that similar lengths share a micro-batch (little padding); the
    order is deterministic so a resumed run groups rows exactly as the original did. A row
    longer than the budget goes alone.
    """
    ordered = sorted(rows, key=lambda i: (-lengths[i], i))
    groups: list[list[int]] = []
    current: list[int] = []
    width = 0
    for i in ordered:
        w = max(width, lengths[i])
        if current and w * (len(current) + 1) > token_budget:
            groups.append(current)
            current, w = [], lengths[i]
        current.append(i)
        width = w
    if current:
        groups.append(current)
    return groups


PER_CALL_TOKENS = 128
"""What one more micro-batch costs (its calls' fixed work), in padded tokens: the price
`pack_least_padding` weighs padding against."""


def pack_least_padding(
    lengths: Sequence[int], rows: Iterable[int], token_budget: int, per_call: int = PER_CALL_TOKENS
) -> list[list[int]]:
    """`pack_by_length`'s micro-batches cut where they cost least: rows sorted the same way,
    split into runs that minimize padded tokens plus `per_call` per micro-batch (a dynamic
    program over the cut points), each run under `token_budget` (a longer row alone).

    Why: greedy filling pads every row of a micro-batch to its first (longest) row, and where
    lengths fall fast (responses of one turn beside four) that padding is a sixth of the
    tokens; a cut there costs one more call. Same rows, same order; only the cuts differ."""
    order = sorted(rows, key=lambda i: (-lengths[i], i))
    n = len(order)
    width = [lengths[i] for i in order]
    best = [0] * (n + 1)  # best[j]: the least cost of the first j rows
    cut = [0] * (n + 1)
    for j in range(1, n + 1):
        best[j] = best[j - 1] + width[j - 1] + per_call  # row j - 1 alone
        cut[j] = j - 1
        for i in range(j - 2, -1, -1):  # rows i..j-1 padded to width[i]
            if width[i] * (j - i) > token_budget:
                break
            cost = best[i] + width[i] * (j - i) + per_call
            if cost < best[j]:
                best[j], cut[j] = cost, i
    groups: list[list[int]] = []
    j = n
    while j > 0:
        groups.append(order[cut[j] : j])
        j = cut[j]
    return groups[::-1]


def plan_micro_batches(batch: RolloutBatch, rows: list[int], token_budget: int) -> list[list[int]]:
    """`pack_by_length` over the real (unpadded) lengths of a rollout batch's rows."""
    return pack_by_length(batch.attention_mask.sum(-1).tolist(), rows, token_budget)


def _micro_batch_scores(
    model,
    batch: RolloutBatch,
    token_budget: int,
    temperature: float,
    *,
    with_entropy: bool,
    actions_only: bool,
    pool_hidden: bool,
    prefix_sharing: bool,
) -> Iterator[tuple[list[int], RolloutBatch, tuple[Tensor, Tensor | None, Tensor | None]]]:
    """`(rows, sub-batch, _scores)` of each micro-batch of a no-grad pass over `batch`. With
    `prefix_sharing` each distinct prompt runs once over the whole batch and the responses in
    micro-batches of their own (`llds.policy.prompt_once`), where the model allows; else whole
    rows, packed by length, each micro-batch sharing the prompts it holds."""
    split = split_lm_head(model) if actions_only else None
    device = next(model.parameters()).device
    runner = runner_for(model, split) if prefix_sharing else None
    prompts = run_prompts(runner, batch, token_budget, device) if runner is not None else None
    if prompts is None:
        for rows in plan_micro_batches(batch, list(range(len(batch))), token_budget):
            sub = batch.select(rows)
            yield (
                rows,
                sub,
                _scores(
                    model,
                    sub,
                    split,
                    temperature,
                    with_entropy=with_entropy,
                    share_prompts=True,
                    pool_hidden=pool_hidden,
                ),
            )
        return
    for rows in tail_micro_batches(batch, token_budget):
        sub = batch.select(rows)
        written = _written(sub, split, device)
        of_row = prompts.of_row[torch.tensor(rows, device=prompts.of_row.device)]
        states = tail_states(runner, sub, of_row, prompts, pool_hidden=pool_hidden)
        yield (
            rows,
            sub,
            _scores_of_states(
                states,
                sub,
                split,
                written,
                temperature,
                with_entropy=with_entropy,
                pool_hidden=pool_hidden,
            ),
        )


@torch.no_grad()
def batched_log_probs(
    model,
    batch: RolloutBatch,
    token_budget: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    actions_only: bool = True,
    prefix_sharing: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`response_log_probs` over the whole batch in micro-batches, no gradient; with
    `prefix_sharing` each distinct prompt computed once (see `_micro_batch_scores`)."""
    b, r = len(batch), batch.response_len
    logp = torch.zeros(b, r)
    ent = torch.zeros(b, r) if with_entropy else None
    for rows, sub, (lp, en, _) in _micro_batch_scores(
        model,
        batch,
        token_budget,
        temperature,
        with_entropy=with_entropy,
        actions_only=actions_only,
        pool_hidden=False,
        prefix_sharing=prefix_sharing,
    ):
        width = sub.response_len
        logp[rows, :width] = lp.float().cpu()
        if ent is not None and en is not None:
            ent[rows, :width] = en.float().cpu()
    return logp, ent


@torch.no_grad()
def batched_log_probs_and_hidden(
    model,
    batch: RolloutBatch,
    token_budget: int,
    *,
    temperature: float = 1.0,
    prefix_sharing: bool = False,
) -> tuple[Tensor, Tensor] | None:
    """`(batched_log_probs, pooled_response_hidden)` of the whole batch from one forward per
    micro-batch (`response_log_probs_and_hidden`), no gradient; None when the head cannot be
    split off (then call the two). `prefix_sharing`: as in `batched_log_probs`."""
    if split_lm_head(model) is None:
        return None
    b, r = len(batch), batch.response_len
    logp = torch.zeros(b, r)
    pooled: Tensor | None = None
    flags = {"with_entropy": False, "actions_only": True, "pool_hidden": True}
    scores = _micro_batch_scores(
        model, batch, token_budget, temperature, prefix_sharing=prefix_sharing, **flags
    )
    for rows, sub, (lp, _, hidden) in scores:
        assert hidden is not None
        logp[rows, : sub.response_len] = lp.float().cpu()
        if pooled is None:
            pooled = torch.zeros(b, hidden.shape[-1])
        pooled[rows] = hidden.cpu()
    return logp, (pooled if pooled is not None else torch.zeros(0, 0))


@torch.no_grad()
def pooled_response_hidden(model, batch: RolloutBatch, token_budget: int) -> Tensor:
    """`[B, H]` float32: each row's last-layer hidden states averaged over its model-written
    response tokens (zeros for a row with none), in micro-batches, no gradient."""
    b = len(batch)
    device = next(model.parameters()).device
    out: Tensor | None = None
    for rows in plan_micro_batches(batch, list(range(b)), token_budget):
        sub = batch.select(rows)
        mask = sub.attention_mask.to(device)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        hidden = model(
            input_ids=sub.input_ids.to(device),
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            output_hidden_states=True,
            logits_to_keep=1,
        ).hidden_states[-1][:, sub.prompt_len :, :]
        weight = sub.loss_mask.to(device).float().unsqueeze(-1)
        pooled = (hidden.float() * weight).sum(1) / weight.sum(1).clamp(min=1)
        if out is None:
            out = torch.zeros(b, pooled.shape[-1])
        out[rows] = pooled.cpu()
    return out if out is not None else torch.zeros(0, 0)
