"""Per-token log-probs (and entropy) of the response tokens of a rollout (sub-)batch."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import Tensor

from llds.algo.logprobs import token_log_probs_and_entropy
from llds.rollout.batch import RolloutBatch


def response_log_probs(
    model,
    batch: RolloutBatch,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
    share_prompts: bool = True,
) -> tuple[Tensor, Tensor | None]:
    """`log pi(y_t | context)` for every response column, `[B, R]` float32.

    Only the response columns go through the LM head (`logits_to_keep`): prompts are often
    longer than responses and their logits are never used. Rows with the same prompt (a GRPO
    group) run that prompt once (see `_shared_prompt_logits`) unless `share_prompts=False`: a
    sharded model needs exactly one model call per micro-batch on every rank, and the shared
    path makes one or two depending on the data.
    """
    r, p = batch.response_len, batch.prompt_len
    device = next(model.parameters()).device
    ids = batch.input_ids.to(device)
    mask = batch.attention_mask.to(device)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)
    shared = share_prompts and r > 1
    logits = _shared_prompt_logits(model, ids, mask, positions, p) if shared else None
    if logits is None:
        out = model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            use_cache=False,
            logits_to_keep=r + 1,
        )
        logits = out.logits[:, :-1, :]  # position P-1+t predicts response token t
    labels = ids[:, p:]
    t = temperature if temperature > 0 else 1.0
    return token_log_probs_and_entropy(logits, labels, temperature=t, with_entropy=with_entropy)


def _shared_prompt_logits(
    model, ids: Tensor, mask: Tensor, positions: Tensor, p: int
) -> Tensor | None:
    """Response-column logits `[B, R, V]` with each distinct prompt run once, or None.

    The G rollouts of a group share their prompt, and causal attention makes the prompt's hidden
    states independent of what follows. So the distinct prompts go through the model once, their
    key/value cache is gathered out to the rows, and only the responses run per row. Autograd
    sums the rows' gradients through the shared prompt pass, which is exactly the gradient of
    running it per row; only float rounding differs. None when no prompt repeats, or when the
    model cannot carry a cache with gradients (activation checkpointing drops it in training).
    """
    if model.training and _checkpointing(model):
        return None
    key = torch.cat([ids[:, :p], mask[:, :p]], dim=1)
    uniq, inverse = torch.unique(key, dim=0, return_inverse=True)
    b, u = ids.shape[0], uniq.shape[0]
    if u == b:
        return None
    rows = torch.arange(b, device=ids.device)
    first = torch.full((u,), b, dtype=torch.long, device=ids.device)
    first = first.scatter_reduce(0, inverse, rows, reduce="amin")  # one row per distinct prompt
    head = model(
        input_ids=ids[first, :p],
        attention_mask=mask[first, :p],
        position_ids=positions[first, :p],
        use_cache=True,
        logits_to_keep=1,
    )
    cache = head.past_key_values
    if not hasattr(cache, "batch_select_indices") or cache.get_seq_length() != p:
        return None  # no cache, or one that cannot be gathered to rows: the plain path
    cache.batch_select_indices(inverse)  # the prompt's keys/values, one copy per row
    tail = model(
        input_ids=ids[:, p:-1],
        attention_mask=mask[:, :-1],
        position_ids=positions[:, p:-1],
        past_key_values=cache,
        use_cache=True,
    )
    # the prompt's last position predicts response token 0; response position t predicts t + 1
    return torch.cat([head.logits[inverse], tail.logits], dim=1)


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


def plan_micro_batches(batch: RolloutBatch, rows: list[int], token_budget: int) -> list[list[int]]:
    """`pack_by_length` over the real (unpadded) lengths of a rollout batch's rows."""
    return pack_by_length(batch.attention_mask.sum(-1).tolist(), rows, token_budget)


@torch.no_grad()
def batched_log_probs(
    model,
    batch: RolloutBatch,
    token_budget: int,
    *,
    temperature: float = 1.0,
    with_entropy: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """`response_log_probs` over the whole batch in micro-batches, no gradient."""
    b, r = len(batch), batch.response_len
    logp = torch.zeros(b, r)
    ent = torch.zeros(b, r) if with_entropy else None
    for rows in plan_micro_batches(batch, list(range(b)), token_budget):
        sub = batch.select(rows)
        lp, en = response_log_probs(model, sub, temperature=temperature, with_entropy=with_entropy)
        width = sub.response_len
        logp[rows, :width] = lp.float().cpu()
        if ent is not None and en is not None:
            ent[rows, :width] = en.float().cpu()
    return logp, ent


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
