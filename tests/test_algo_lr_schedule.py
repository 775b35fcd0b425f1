"""The one learning-rate schedule, against values worked out by hand."""

from __future__ import annotations

import math

import pytest
import torch

from llds.algo.lr_schedule import lr_factor, scheduled_lr


def test_warmup_then_cosine_to_a_floor() -> None:
    at = lambda s: scheduled_lr(  # noqa: E731
        s, base_lr=2.0, schedule="cosine", warmup=4, total=10, min_ratio=0.1
    )
    assert [at(s) for s in range(4)] == [0.5, 1.0, 1.5, 2.0]
    assert at(4) == pytest.approx(2.0)  # decay starts at the top
    assert at(7) == pytest.approx(2.0 * (0.1 + 0.9 * 0.5))  # half way: cos(pi/2) = 0
    assert at(10) == pytest.approx(0.2) and at(50) == pytest.approx(0.2)  # floor, then flat


def test_constant_and_linear() -> None:
    assert scheduled_lr(7, base_lr=3.0, schedule="constant", warmup=0, total=10) == 3.0
    lin = [scheduled_lr(s, base_lr=1.0, schedule="linear", warmup=2, total=6) for s in range(7)]
    assert lin == pytest.approx([0.5, 1.0, 1.0, 0.75, 0.5, 0.25, 0.0])


def test_unknown_schedule_is_named() -> None:
    with pytest.raises(ValueError, match="'step'"):
        scheduled_lr(3, base_lr=1.0, schedule="step", warmup=0, total=10)  # type: ignore[arg-type]


def test_lambda_lr_follows_the_schedule() -> None:
    """The trainer's scheduler gives the learning rates the function computes."""
    p = torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([p], lr=0.5)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor("cosine", 3, 9))
    seen = []
    for _ in range(9):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    want = [scheduled_lr(s, base_lr=0.5, schedule="cosine", warmup=3, total=9) for s in range(9)]
    assert seen == pytest.approx(want)
    assert seen[3] == pytest.approx(0.5) and seen[6] == pytest.approx(0.25)
    assert math.isclose(seen[0], 0.5 / 3)
