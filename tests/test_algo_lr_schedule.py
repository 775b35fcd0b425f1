"""The one learning-rate schedule, against values worked out by hand."""

from __future__ import annotations

import math
import re

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


def test_piecewise_points_hold_then_climb_then_hold():
    from llds.algo.lr_schedule import lr_factor, piecewise_factor

    points = [(0, 1.0), (60, 1.0), (160, 10.0)]
    # by hand: flat to 60, then +0.09 per step to 10 at 160, flat after
    assert [piecewise_factor(s, points) for s in (0, 30, 60)] == [1.0, 1.0, 1.0]
    assert piecewise_factor(61, points) == pytest.approx(1.09)
    assert piecewise_factor(110, points) == pytest.approx(5.5)
    assert [piecewise_factor(s, points) for s in (160, 500)] == [10.0, 10.0]
    assert piecewise_factor(0, [(5, 2.0), (10, 0.0)]) == 2.0  # before the first point
    factor = lr_factor("cosine", 10, 100, points)  # points replace the schedule and warm-up
    assert factor(0) == 1.0 and factor(110) == pytest.approx(5.5)


def test_lr_points_are_checked_where_they_are_set():
    from llds.errors import ConfigError
    from llds.train.config import load_config

    REQUIRED = ["model.path=m", "data.train=t", "retriever.source=c"]

    with pytest.raises(ConfigError, match=re.escape("lr_points: steps must strictly increase")):
        load_config(None, [*REQUIRED, "optim.lr_points=[[0,1],[0,2]]"])
    with pytest.raises(ConfigError, match=re.escape("optim.lr_points: replaces the warm-up")):
        load_config(None, [*REQUIRED, "optim.lr_points=[[0,1],[5,2]]", "optim.warmup_steps=3"])
    with pytest.raises(ConfigError, match=re.escape("optim.lr_points")):
        load_config(None, [*REQUIRED, "optim.lr_points=[[0,-1]]"])
