"""The update's view of the GLOBAL rollout batch, every process's rows together.

Mini-batches are drawn from the global batch as one process would draw them, and the loss's
denominators (tokens, sequences, LLDS-preserving sequences) and LLDS-MA's answer weight are
counted over all processes: the gradients summed over processes then equal the single-process
gradient, on any number of processes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

from llds.algo import preserving_mask
from llds.train.distributed import Dist


@dataclass(frozen=True)
class Counts:
    """A mini-batch's denominators over every process (each at least 1)."""

    tokens: torch.Tensor
    sequences: torch.Tensor
    preserving: torch.Tensor
    """sequences with a token LLDS preserves (the denominator of its per-sequence mean)"""


def global_counts(dist: Dist, loss_mask: torch.Tensor, adv: torch.Tensor) -> Counts:
    """The denominators of a mini-batch whose local rows have `loss_mask` and advantages `adv`."""
    return Counts(
        tokens=dist.sum(loss_mask.sum()).float().clamp(min=1),
        sequences=dist.sum(loss_mask.any(-1).sum()).float().clamp(min=1),
        preserving=dist.sum(preserving_mask(adv, loss_mask).any(-1).sum()).float().clamp(min=1),
    )


def mini_batches(
    gen: torch.Generator,
    global_rows: Sequence[int],
    n_global: int,
    parts: int,
    order: Literal["shuffled", "rollout"] = "shuffled",
    group_size: int = 1,
) -> list[list[int]]:
    """One epoch's mini-batches as this process's local row indices. `global_rows` gives each
    local row's global index; global row `q * group_size + i` is rollout `i` of question `q`.

    `shuffled`: a permutation of the `n_global` rows drawn from `gen`, cut into `parts`
    near-equal parts (a group's rollouts may land in different parts). `rollout`: the questions
    in rollout order cut into `parts` runs of whole groups, the first ones a group larger when
    they do not divide evenly, as the authors' veRL slices its batch; `gen` is not drawn from,
    so every epoch repeats the same cut. A part may hold none of this process's rows: every
    process still takes the same number of optimizer steps."""
    local_of = {gid: local for local, gid in enumerate(global_rows)}
    if order == "rollout":
        runs = split(list(range(n_global // group_size)), parts)
        cut = [[q * group_size + i for q in run for i in range(group_size)] for run in runs]
    else:
        cut = split(torch.randperm(n_global, generator=gen).tolist(), parts)
    return [[local_of[gid] for gid in part if gid in local_of] for part in cut]


def split(order: list[int], parts: int) -> list[list[int]]:
    """`order` cut into `parts` consecutive pieces whose sizes differ by at most one (the first
    ones larger); pieces are empty when there are fewer items than parts."""
    size, extra = divmod(len(order), parts)
    out, start = [], 0
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append(order[start:end])
        start = end
    return out


def global_mean_searches(batch: Any, dist: Dist) -> float:
    """Valid searches per rollout over the GLOBAL batch (every process's rollouts), for
    LLDS-MA's answer weight: each rank then weights answers alike. A per-rank weight would
    differ between ranks whenever the clip at 1 acts on one of them."""
    episodes = batch.episodes
    searches = dist.sum(sum(e.num_valid_searches for e in episodes))
    rollouts = dist.sum(len(episodes))
    return float(searches) / max(1.0, float(rollouts))
