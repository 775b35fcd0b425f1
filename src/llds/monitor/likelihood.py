"""Lazy Likelihood Displacement metrics from per-token log-probs (pure tensor functions).

`Delta_i = sum_t (log pi_new - log pi_old)` over the model tokens of response i. LLD shows up as
correct responses whose likelihood stays flat or falls although GRPO pushes it up; the paper's
early warning is the likelihood of correct responses drifting down while reward still rises.
Missing groups (e.g. no correct response this step) give NaN, logged as null.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import Tensor

from llds import metrics as keys
from llds.algo.masking import masked_fill_zero
from llds.algo.segments import action_segments, segment_sums

NAN = float("nan")


def _mean(x: Tensor) -> float:
    return float(x.float().mean()) if x.numel() else NAN


def likelihood_metrics(
    logp: Tensor,
    loss_mask: Tensor,
    action_index: Tensor,
    correct: Tensor,
    num_searches: Tensor,
) -> dict[str, float]:
    """Per-token log-likelihood at rollout time: correct vs incorrect, first vs later actions,
    and NLL by the number of tool rounds."""
    mask = loss_mask.bool()
    tokens = mask.sum(-1)
    has = tokens > 0
    per_row = masked_fill_zero(logp, mask).sum(-1) / tokens.clamp(min=1)
    correct = correct.bool()
    out = {
        keys.LOGP_CORRECT: _mean(per_row[has & correct]),
        keys.LOGP_INCORRECT: _mean(per_row[has & ~correct]),
        "lld/logp_first_action": _mean(logp[action_index == 0]),
        "lld/logp_later_actions": _mean(logp[action_index > 0]),
    }
    for n in sorted(set(num_searches[has].tolist())):
        rows = has & (num_searches == n)
        out[f"lld/nll_by_searches/{int(n)}"] = -_mean(per_row[rows])
    return out


def displacement_metrics(
    logp_before: Tensor,
    logp_after: Tensor,
    loss_mask: Tensor,
    action_index: Tensor,
    correct: Tensor,
    advantages: Tensor | None = None,
) -> dict[str, float]:
    """How the step's updates moved the likelihood of the responses they were computed on.

    With `advantages` (`[B]`), also the paper's quantities (Def. 4.1 / Eq. 2): the displacement
    `Delta = log pi_new(y) - log pi_old(y)` of the responses GRPO pushes up (advantage > 0,
    which exist only in groups with mixed rewards) and of those it pushes down (advantage < 0);
    see `advantage_displacement`. The `*_correct` metrics also count correct responses of
    all-correct groups (advantage 0), which GRPO does not push at all."""
    mask = loss_mask.bool()
    delta = masked_fill_zero(logp_after - logp_before, mask)
    has = mask.sum(-1) > 0
    correct = correct.bool()
    per_row = delta.sum(-1)
    per_row_tok = per_row / mask.sum(-1).clamp(min=1)
    per_action = segment_sums(delta, action_index)
    n_actions = int(action_index.max().item()) + 1 if action_index.numel() else 0
    action_exists = segment_sums(mask.float(), action_index, max(n_actions, 1)) > 0
    corr_actions = per_action[action_exists & (correct & has).unsqueeze(1)]
    inc_actions = per_action[action_exists & (~correct & has).unsqueeze(1)]
    c, i = has & correct, has & ~correct
    out = {
        keys.DISP_CORRECT: _mean(per_row[c]),
        keys.DISP_INCORRECT: _mean(per_row[i]),
        "lld/disp_correct_per_token": _mean(per_row_tok[c]),
        "lld/disp_incorrect_per_token": _mean(per_row_tok[i]),
        "lld/disp_correct_action": _mean(corr_actions),
        "lld/disp_incorrect_action": _mean(inc_actions),
        keys.FRAC_CORRECT_FELL: _mean((per_row[c] < 0).float()),
        "lld/frac_correct_actions_fell": _mean((corr_actions < 0).float()),
    }
    if advantages is not None:
        first = per_action[:, 0] if per_action.shape[1] else per_row * 0
        later_exists = action_exists[:, 1:].any(-1) if action_exists.shape[1] > 1 else has & False
        out.update(
            advantage_displacement(per_row, first, per_row - first, later_exists, has, advantages)
        )
    return out


def advantage_displacement(
    per_row: Tensor,
    first_action: Tensor,
    later_actions: Tensor,
    has_later: Tensor,
    has: Tensor,
    advantages: Tensor,
) -> dict[str, float]:
    """The paper's LLD quantities from each response's log-likelihood change.

    `per_row[i]` is response i's summed change `Delta_i` over its model tokens, `first_action[i]`
    the part of it on the first action (the tokens before the first observation),
    `later_actions[i]` the rest (`has_later[i]`: the response has a later action). Positive
    responses (advantage > 0) are the ones GRPO raises; LLD is their `Delta <= 0`.
    """
    adv = advantages.reshape(-1).to(per_row.device)
    pos, neg = has & (adv > 0), has & (adv < 0)
    return {
        keys.DISP_POS: _mean(per_row[pos]),
        keys.FRAC_POS_FELL: _mean((per_row[pos] <= 0).float()),
        keys.DISP_POS_FIRST_ACTION: _mean(first_action[pos]),
        keys.DISP_POS_LATER_ACTIONS: _mean(later_actions[pos & has_later]),
        keys.DISP_NEG: _mean(per_row[neg]),
        "lld/pos_responses": float(pos.sum()),
    }


def lld_share_metrics(
    logp_before: Tensor,
    logp_after: Tensor,
    mask: Tensor,
    advantages: Tensor,
    group_ids: Sequence[str],
    rewards: Tensor,
    *,
    correct_threshold: float = 0.5,
    group_accuracy: Mapping[str, float] | None = None,
) -> dict[str, float]:
    """LLD as a share of responses: of the responses GRPO pushed up (advantage > 0), how many
    lost likelihood in the update (`sum_t log pi_after - log pi_before < 0` over their model
    tokens, strictly: unlike `lld/frac_pos_fell`, an unchanged response did not fall).

    Also split by the accuracy of the response's group (at most half / more than half of its
    responses have `reward >= correct_threshold`; `group_accuracy` gives each group's share when
    it is known from more rows than those passed, e.g. a sampled subset), and per action (a
    maximal run of mask tokens): each positive response's first action, and every later action
    of a positive response, each counted once. The counts come alongside (`lld/n_pos*`,
    `llds.metrics.SHARE_COUNTS`) so that shares pool over steps and processes
    (`pool_shares`); a share over nothing is left out."""
    m = mask.bool()
    delta = masked_fill_zero(logp_after.double() - logp_before.double(), m)
    per_row = delta.sum(-1)
    adv = advantages.reshape(-1).to(per_row.device)
    pos = m.any(-1) & (adv > 0)
    fell = per_row < 0
    if group_accuracy is None:
        group_accuracy = group_correct_share(group_ids, rewards, correct_threshold)
    hi = torch.tensor([group_accuracy[g] > 0.5 for g in group_ids], device=pos.device)
    action_index, num_actions = action_segments(m)
    width = max(int(num_actions.max()) if num_actions.numel() else 0, 1)
    per_action = segment_sums(delta, action_index, width)
    exists = segment_sums(m.double(), action_index, width) > 0
    later = exists[:, 1:] & pos.unsqueeze(1)
    counts = {
        keys.N_POS: pos.sum(),
        keys.N_POS_ACC_LO: (pos & ~hi).sum(),
        keys.N_POS_ACC_HI: (pos & hi).sum(),
        keys.N_POS_LATER_ACTIONS: later.sum(),
    }
    fallen = {
        keys.SHARE_POS_FELL: (fell & pos).sum(),
        keys.SHARE_POS_FELL_ACC_LO: (fell & pos & ~hi).sum(),
        keys.SHARE_POS_FELL_ACC_HI: (fell & pos & hi).sum(),
        keys.SHARE_POS_FELL_FIRST_ACTION: ((per_action[:, 0] < 0) & pos).sum(),
        keys.SHARE_POS_FELL_LATER_ACTIONS: ((per_action[:, 1:] < 0) & later).sum(),
    }
    out = {k: float(v) for k, v in counts.items()}
    for share, n in fallen.items():
        if out[keys.SHARE_COUNTS[share]] > 0:
            out[share] = float(n) / out[keys.SHARE_COUNTS[share]]
    return out


def share_by_part(
    logp_before: Tensor,
    logp_after: Tensor,
    mask: Tensor,
    advantages: Tensor,
    part_of_row: Sequence[int],
) -> dict[int, tuple[int, int]]:
    """`lld/share_pos_fell` split by a label of each row (its mini-batch index in the update):
    `{part: (positive responses that fell, positive responses)}`, parts with no positive
    response left out. Same definition as `lld_share_metrics`: a response pushed up (advantage
    > 0) fell when its summed log-likelihood over model tokens went strictly down."""
    m = mask.bool()
    per_row = masked_fill_zero(logp_after.double() - logp_before.double(), m).sum(-1)
    pos = (m.any(-1) & (advantages.reshape(-1).to(per_row.device) > 0)).tolist()
    fell = (per_row < 0).tolist()
    out: dict[int, tuple[int, int]] = {}
    for part, p, f in zip(part_of_row, pos, fell, strict=True):
        if p:
            n_fell, n = out.get(part, (0, 0))
            out[part] = (n_fell + int(f), n + 1)
    return dict(sorted(out.items()))


def group_correct_share(
    group_ids: Sequence[str], rewards: Tensor, correct_threshold: float = 0.5
) -> dict[str, float]:
    """Each group's share of responses with `reward >= correct_threshold`."""
    correct: dict[str, list[bool]] = {}
    for g, r in zip(group_ids, rewards.reshape(-1).tolist(), strict=True):
        correct.setdefault(g, []).append(r >= correct_threshold)
    return {g: sum(c) / len(c) for g, c in correct.items()}


def pool_shares(parts: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Pool `lld_share_metrics` results (of several steps, processes or mini-batches): counts
    summed, each share weighted by its count; a share over nothing is left out."""
    counts = {n: sum(float(p.get(n, 0.0)) for p in parts) for n in set(keys.SHARE_COUNTS.values())}
    out = dict(sorted(counts.items()))
    for share, n in keys.SHARE_COUNTS.items():
        fallen = sum(float(p[share]) * float(p[n]) for p in parts if share in p)
        if counts[n] > 0:
            out[share] = fallen / counts[n]
    return out


def mixed_group_rows(group_ids: Sequence[str], correct: Sequence[bool]) -> list[int]:
    """The rows of groups holding both correct and incorrect responses (those the hidden-state
    similarity compares), in batch order."""
    verdicts: dict[str, set[bool]] = {}
    for g, ok in zip(group_ids, correct, strict=True):
        verdicts.setdefault(g, set()).add(ok)
    return [r for r, g in enumerate(group_ids) if len(verdicts[g]) == 2]


def group_hidden_similarity(
    pooled: Tensor, group_ids: Sequence[str], correct: Sequence[bool]
) -> float:
    """Mean cosine similarity between the hidden representations of correct and incorrect
    responses of the same group (the paper's Fig. 3b): the mean over every (correct,
    incorrect) pair of a group, then over groups that have both; NaN when none has.

    `pooled` is `[B, H]`: one vector per response (the trainer uses the last layer's hidden
    states averaged over the response's model tokens)."""
    unit = torch.nn.functional.normalize(pooled.float(), dim=-1)
    rows: dict[str, tuple[list[int], list[int]]] = {}
    for r, (g, ok) in enumerate(zip(group_ids, correct, strict=True)):
        rows.setdefault(g, ([], []))[0 if ok else 1].append(r)
    sims = [float((unit[good] @ unit[bad].T).mean()) for good, bad in rows.values() if good and bad]
    return sum(sims) / len(sims) if sims else NAN


def shared_first_search_share(
    group_ids: Sequence[str], correct: Sequence[bool], first_docs: Sequence[Sequence[str] | None]
) -> float:
    """Share of wrong responses whose first search retrieved exactly the documents that the
    first search of a correct response in the same group retrieved (the paper's similar
    negatives: they share the prefix that LLD pushes down)."""
    good: dict[str, set[tuple[str, ...]]] = {}
    for g, ok, docs in zip(group_ids, correct, first_docs, strict=True):
        if ok and docs:
            good.setdefault(g, set()).add(tuple(docs))
    wrong = [
        (g, docs) for g, ok, docs in zip(group_ids, correct, first_docs, strict=True) if not ok
    ]
    eligible = [(g, d) for g, d in wrong if g in good]
    if not eligible:
        return NAN
    return sum(1 for g, d in eligible if d and tuple(d) in good[g]) / len(eligible)
