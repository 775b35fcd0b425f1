"""The metrics of one step's rollout batch: reward, search behaviour, turns (`turns/*`), group
mix, degenerate text, the likelihood of correct and incorrect responses at rollout time
(`lld/logp_*`, NLL by number of searches, the observation-match share of the paper's Fig. 5) and,
when another policy sampled the batch, its mismatch with the trained one (`mismatch/*`)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable

import torch

from llds import metrics as keys
from llds.algo import masked_mean
from llds.monitor.degenerate import punctuation_run_frac
from llds.monitor.likelihood import likelihood_metrics, shared_first_search_share
from llds.monitor.mismatch import mismatch_metrics
from llds.monitor.turns import turn_metrics, void_turn_count
from llds.rollout import RolloutBatch


def rollout_metrics(
    batch: RolloutBatch,
    adv: torch.Tensor,
    old_logp: torch.Tensor,
    entropy: torch.Tensor | None,
    sum_over_processes: Callable[[float], float | torch.Tensor] = float,
    *,
    sampler_logp: torch.Tensor | None = None,
) -> dict[str, float]:
    """Means over this process's rollouts (the trainer averages them over processes);
    `sum_over_processes` turns the one count that is logged as a global sum into it.

    `sampler_logp` (`[B, R]`): the sampled tokens' log-probs under the policy that sampled them,
    given only when that is not the policy `old_logp` comes from (a sampling copy, another
    engine); then the `mismatch/*` metrics compare the two. Same policy: no `mismatch/*` keys."""
    eps = batch.episodes
    n = max(1, len(eps))
    correct = torch.tensor([e.em > 0 for e in eps])
    groups: dict[str, list[float]] = {}
    for e in eps:
        groups.setdefault(e.group_id, []).append(e.em)
    mixed = sum(1 for g in groups.values() if 0 < sum(g) < len(g))
    all_right = sum(1 for g in groups.values() if sum(g) == len(g))
    stops = Counter(e.stop_reason for e in eps)
    m: dict[str, float] = {
        keys.REWARD_MEAN: float(batch.rewards.mean()),
        keys.REWARD_EM: sum(e.em for e in eps) / n,
        "reward/f1": sum(e.f1 for e in eps) / n,
        "reward/sub_em": sum(e.sub_em for e in eps) / n,
        keys.VALID_SEARCHES: sum(e.num_valid_searches for e in eps) / n,
        "rollout/turns": sum(e.num_turns for e in eps) / n,
        "rollout/invalid_actions": sum(e.num_invalid for e in eps) / n,
        keys.RESPONSE_TOKENS: float(batch.loss_mask.sum()) / n,
        "rollout/answered_frac": stops["answer"] / n,
        # a count over the global batch (every rank logs the same sum)
        keys.CONTEXT_CAPPED: float(sum_over_processes(sum(e.context_capped for e in eps))),
        "rollout/valid_format_frac": sum(e.valid_format for e in eps) / n,
        keys.PUNCT_RUN_FRAC: punctuation_run_frac([" ".join(e.action_texts) for e in eps]),
        "groups/mixed_frac": mixed / max(1, len(groups)),
        "groups/all_correct_frac": all_right / max(1, len(groups)),
        keys.ENTROPY: float(masked_mean(entropy, batch.loss_mask))
        if entropy is not None
        else float("nan"),
        "advantage/abs_mean": float(adv.abs().mean()),
    }
    m.update(
        turn_metrics(
            [e.num_turns for e in eps],
            [void_turn_count(e.action_texts) for e in eps],
            [e.num_valid_searches for e in eps],
        )
    )
    if sampler_logp is not None:
        m.update(mismatch_metrics(sampler_logp, old_logp, batch.loss_mask))
    searches = torch.tensor([e.num_valid_searches for e in eps])
    m.update(likelihood_metrics(old_logp, batch.loss_mask, batch.action_index, correct, searches))
    m["lld/shared_first_search_wrong_frac"] = shared_first_search_share(
        batch.group_ids,
        correct.tolist(),
        [e.retrieved_ids[0] if e.retrieved_ids else None for e in eps],
    )
    return m
