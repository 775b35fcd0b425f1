"""LLD metrics against values worked out by hand on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from llds import metrics as keys
from llds.algo.segments import action_segments
from llds.monitor.likelihood import displacement_metrics, group_hidden_similarity

MASK = torch.tensor(
    [
        [1, 1, 0, 0, 1, 1],  # two actions: t0-1 and t4-5
        [1, 1, 1, 0, 0, 0],  # one action
        [1, 0, 1, 0, 0, 0],  # two actions: t0 and t2
        [0, 0, 0, 0, 0, 0],  # nothing written (excluded everywhere)
    ]
)
DELTA = torch.tensor(
    [
        [0.1, -0.3, 9.0, 9.0, 0.2, -0.5],  # first -0.2, later -0.3, total -0.5
        [0.4, 0.1, 0.2, 9.0, 9.0, 9.0],  # first 0.7, total 0.7
        [-1.0, 9.0, 0.5, 9.0, 9.0, 9.0],  # first -1.0, later 0.5, total -0.5
        [5.0, 5.0, 5.0, 5.0, 5.0, 5.0],
    ]
)


def _metrics(advantages: torch.Tensor, correct=(True, True, False, True)) -> dict[str, float]:
    before = torch.randn(4, 6)
    action_index, _ = action_segments(MASK)
    return displacement_metrics(
        before, before + DELTA, MASK, action_index, torch.tensor(correct), advantages
    )


def test_paper_displacement_by_hand() -> None:
    m = _metrics(torch.tensor([1.0, 0.5, -1.2, 2.0]))  # row 3 is positive but empty
    assert m[keys.DISP_POS] == pytest.approx((-0.5 + 0.7) / 2, abs=1e-6)
    assert m[keys.FRAC_POS_FELL] == 0.5
    assert m[keys.DISP_POS_FIRST_ACTION] == pytest.approx((-0.2 + 0.7) / 2, abs=1e-6)
    assert m[keys.DISP_POS_LATER_ACTIONS] == pytest.approx(-0.3, abs=1e-6)  # only row 0 has one
    assert m[keys.DISP_NEG] == pytest.approx(-0.5, abs=1e-6)
    assert m["lld/pos_responses"] == 2.0
    # the older correctness-based metric counts the same rows here (rows 0, 1 correct)
    assert m[keys.DISP_CORRECT] == pytest.approx(0.1, abs=1e-6)


def test_zero_advantage_rows_are_not_positive() -> None:
    """A correct response of an all-correct group has advantage 0: GRPO does not push it, so it
    is in `disp_correct` but not in `disp_pos`."""
    m = _metrics(torch.tensor([0.0, 0.5, -1.2, 0.0]))
    assert m[keys.DISP_POS] == pytest.approx(0.7, abs=1e-6)
    assert m[keys.FRAC_POS_FELL] == 0.0
    assert math.isnan(m[keys.DISP_POS_LATER_ACTIONS])  # no positive row with a later action
    assert m[keys.DISP_CORRECT] == pytest.approx(0.1, abs=1e-6)


def test_no_change_counts_as_fell() -> None:
    """Def. 4.1: LLD is a non-increase; an unmoved positive response counts."""
    action_index, _ = action_segments(MASK)
    before = torch.zeros(4, 6)
    m = displacement_metrics(
        before, before, MASK, action_index, torch.ones(4, dtype=torch.bool), torch.ones(4)
    )
    assert m[keys.FRAC_POS_FELL] == 1.0 and m[keys.DISP_POS] == 0.0
    assert math.isnan(m[keys.DISP_NEG])


def test_without_advantages_only_the_old_metrics() -> None:
    action_index, _ = action_segments(MASK)
    m = displacement_metrics(
        torch.zeros(4, 6), DELTA, MASK, action_index, torch.tensor([True, True, False, True])
    )
    assert keys.DISP_POS not in m and keys.DISP_CORRECT in m


def test_hidden_similarity_by_hand() -> None:
    pooled = torch.tensor(
        [[1.0, 0.0], [1.0, 1.0], [0.0, 3.0], [2.0, 0.0], [2.0, 1.0], [1.0, 0.0], [-4.0, 0.0]]
    )
    groups = ["a", "a", "a", "b", "b", "c", "c"]
    correct = [True, False, False, True, True, True, False]
    # group a: cos(r0, r1) = 1/sqrt(2), cos(r0, r2) = 0; group b has no incorrect; group c: -1
    want = ((1 / math.sqrt(2) + 0.0) / 2 + -1.0) / 2
    assert group_hidden_similarity(pooled, groups, correct) == pytest.approx(want)
    assert math.isnan(group_hidden_similarity(pooled[3:5], groups[3:5], correct[3:5]))
