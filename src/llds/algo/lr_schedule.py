"""The one learning-rate schedule of the project (GRPO training and the SFT warm start).

Linear warm-up over `warmup` steps, then `constant`, `linear` or `cosine` decay from `base_lr`
to `min_ratio * base_lr` at step `total`; or, with `points`, a piecewise-linear factor through
`(step, factor)` points (a schedule of one's own: a re-warm-up, a late peak, a step decay). The
trainer hands it to `torch.optim.lr_scheduler.LambdaLR` with `base_lr=1.0` (a factor); the SFT
loop sets `base_lr` to its learning rate.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from typing import Literal

Schedule = Literal["constant", "cosine", "linear"]


def scheduled_lr(
    step: int,
    *,
    base_lr: float,
    schedule: Schedule,
    warmup: int,
    total: int,
    min_ratio: float = 0.0,
) -> float:
    """The learning rate of optimizer step `step` (0-based)."""
    if warmup > 0 and step < warmup:
        return base_lr * (step + 1) / warmup
    if schedule == "constant":
        return base_lr
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    if schedule == "linear":
        return base_lr * (min_ratio + (1 - min_ratio) * (1.0 - progress))
    if schedule == "cosine":
        return base_lr * (min_ratio + (1 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress)))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


def piecewise_factor(step: int, points: Sequence[tuple[int, float]]) -> float:
    """The factor at `step` on the line through `points` (sorted by step): the first point's
    factor before it, the last one's after it, linear in between."""
    if step <= points[0][0]:
        return float(points[0][1])
    for (s0, f0), (s1, f1) in itertools.pairwise(points):
        if step <= s1:
            return float(f0 + (f1 - f0) * (step - s0) / (s1 - s0))
    return float(points[-1][1])


def lr_factor(
    schedule: Schedule,
    warmup: int,
    total: int,
    points: Sequence[tuple[int, float]] | None = None,
) -> Callable[[int], float]:
    """`step -> factor` for `LambdaLR` (the schedule with `base_lr=1`); `points` replace the
    schedule and its warm-up."""
    if points:
        fixed = tuple(points)
        return lambda step: piecewise_factor(step, fixed)

    def factor(step: int) -> float:
        return scheduled_lr(step, base_lr=1.0, schedule=schedule, warmup=warmup, total=total)

    return factor
