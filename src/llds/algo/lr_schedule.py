"""The one learning-rate schedule of the project (GRPO training and the SFT warm start).

Linear warm-up over `warmup` steps, then `constant`, `linear` or `cosine` decay from `base_lr`
to `min_ratio * base_lr` at step `total`. The trainer hands it to `torch.optim.lr_scheduler.
LambdaLR` with `base_lr=1.0` (a factor); the SFT loop sets `base_lr` to its learning rate.
"""

from __future__ import annotations

import math
from collections.abc import Callable
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


def lr_factor(schedule: Schedule, warmup: int, total: int) -> Callable[[int], float]:
    """`step -> factor` for `LambdaLR` (the schedule with `base_lr=1`)."""

    def factor(step: int) -> float:
        return scheduled_lr(step, base_lr=1.0, schedule=schedule, warmup=warmup, total=total)

    return factor
