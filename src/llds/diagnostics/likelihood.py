"""Lazy Likelihood Displacement metrics from per-token log-probs (pure tensor functions).

`Delta_i = sum_t (log pi_new - log pi_old)` over the model tokens of response i. LLD shows up as
correct responses whose likelihood stays flat or falls although GRPO pushes it up; the paper's
early warning is the likelihood of correct responses drifting down while reward still rises.
Missing groups (e.g. no correct response this step) give NaN, logged as null.
"""

from __future__ import annotations

from collections.abc import Sequence

from torch import Tensor

from llds import metrics as keys
from llds.algo.masking import masked_fill_zero
from llds.algo.segments import segment_sums

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
) -> dict[str, float]:
    """How the step's updates moved the likelihood of the responses they were computed on."""
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
    return {
        keys.DISP_CORRECT: _mean(per_row[c]),
        keys.DISP_INCORRECT: _mean(per_row[i]),
        "lld/disp_correct_per_token": _mean(per_row_tok[c]),
        "lld/disp_incorrect_per_token": _mean(per_row_tok[i]),
        "lld/disp_correct_action": _mean(corr_actions),
        "lld/disp_incorrect_action": _mean(inc_actions),
        keys.FRAC_CORRECT_FELL: _mean((per_row[c] < 0).float()),
        "lld/frac_correct_actions_fell": _mean((corr_actions < 0).float()),
    }


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
