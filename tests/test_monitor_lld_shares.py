"""Pooled LLD shares against a tiny batch whose likelihood changes are set by hand."""

from __future__ import annotations

import pytest
import torch

from llds.monitor.likelihood import lld_share_metrics, pool_shares

# rows 0,1 in group a (1 of 2 correct: low accuracy), rows 2,3 in group b (all correct: high)
GROUPS = ["a", "a", "b", "b"]
REWARDS = torch.tensor([1.0, 0.0, 1.0, 1.0])
ADV = torch.tensor([1.0, -1.0, 0.5, 0.2])
MASK = torch.tensor(
    [
        [1, 1, 0, 1, 1],  # actions {0,1} {3,4}
        [1, 1, 1, 0, 0],
        [1, 0, 1, 0, 1],  # three one-token actions
        [1, 1, 1, 1, 1],  # one action
    ],
    dtype=torch.bool,
)
DELTA = torch.tensor(
    [
        [0.1, -0.3, 9.0, 0.2, 0.1],  # first -0.2 (fell), later +0.3; total +0.1
        [-1.0, -1.0, -1.0, 0.0, 0.0],  # negative advantage: not counted
        [0.2, 9.0, -0.1, 9.0, -0.3],  # first +0.2; later -0.1, -0.3 (fell); total -0.2
        [-0.01, -0.01, -0.01, -0.01, -0.01],  # total and first -0.05
    ]
)
BEFORE = -torch.rand(4, 5, generator=torch.Generator().manual_seed(1)) * 3


def shares(rows=(0, 1, 2, 3), **kw):
    rows = list(rows)
    return lld_share_metrics(
        BEFORE[rows],
        BEFORE[rows] + DELTA[rows],
        MASK[rows],
        ADV[rows],
        [GROUPS[r] for r in rows],
        REWARDS[rows],
        **kw,
    )


def test_values_by_hand():
    m = shares()
    assert m["lld/n_pos"] == 3
    assert m["lld/share_pos_fell"] == pytest.approx(2 / 3)  # rows 2 and 3 of 0, 2, 3
    assert m["lld/n_pos_acc_lo"] == 1 and m["lld/share_pos_fell_acc_lo"] == 0.0  # row 0
    assert m["lld/n_pos_acc_hi"] == 2 and m["lld/share_pos_fell_acc_hi"] == 1.0  # rows 2, 3
    assert m["lld/share_pos_fell_first_action"] == pytest.approx(2 / 3)  # rows 0 and 3
    assert m["lld/n_pos_later_actions"] == 3  # row 0's second, row 2's second and third
    assert m["lld/share_pos_fell_later_actions"] == pytest.approx(2 / 3)


def test_threshold_moves_groups_between_accuracy_halves():
    """With rewards counted correct only from 2, every group has at most half correct."""
    m = shares(correct_threshold=2.0)
    assert m["lld/n_pos_acc_lo"] == 3 and m["lld/n_pos_acc_hi"] == 0
    assert m["lld/share_pos_fell_acc_lo"] == pytest.approx(2 / 3)
    assert "lld/share_pos_fell_acc_hi" not in m


def test_group_accuracy_of_a_subset_can_come_from_the_whole_batch():
    """Rows 0 and 2 alone would make both groups all correct; the full batch's accuracy puts
    group a in the low half."""
    sub = shares([0, 2])
    assert sub["lld/n_pos_acc_hi"] == 2
    told = lld_share_metrics(
        BEFORE[[0, 2]],
        BEFORE[[0, 2]] + DELTA[[0, 2]],
        MASK[[0, 2]],
        ADV[[0, 2]],
        ["a", "b"],
        REWARDS[[0, 2]],
        group_accuracy={"a": 0.5, "b": 1.0},
    )
    assert told["lld/n_pos_acc_lo"] == 1 and told["lld/n_pos_acc_hi"] == 1


def test_share_over_nothing_is_left_out():
    m = lld_share_metrics(BEFORE, BEFORE + DELTA, MASK, -ADV.abs(), GROUPS, REWARDS)
    assert m == {
        "lld/n_pos": 0.0,
        "lld/n_pos_acc_lo": 0.0,
        "lld/n_pos_acc_hi": 0.0,
        "lld/n_pos_later_actions": 0.0,
    }


def test_positive_row_without_model_tokens_is_not_counted():
    mask = MASK.clone()
    mask[3] = False
    m = lld_share_metrics(BEFORE, BEFORE + DELTA, mask, ADV, GROUPS, REWARDS)
    assert m["lld/n_pos"] == 2 and m["lld/share_pos_fell"] == pytest.approx(1 / 2)


def test_pooling_halves_equals_the_whole_batch():
    acc = {"a": 0.5, "b": 1.0}
    whole = shares(group_accuracy=acc)
    pooled = pool_shares([shares([0, 1], group_accuracy=acc), shares([2, 3], group_accuracy=acc)])
    assert pooled.keys() == whole.keys()
    for k, v in whole.items():
        assert pooled[k] == pytest.approx(v), k


def test_pooling_weights_shares_by_their_counts():
    """Not the mean of the two shares (0.75): 1 of 4 and 2 of 2 fell, so 3 of 6."""
    parts = [
        {"lld/n_pos": 4.0, "lld/share_pos_fell": 0.25},
        {"lld/n_pos": 2.0, "lld/share_pos_fell": 1.0},
    ]
    p = pool_shares(parts)
    assert p["lld/n_pos"] == 6 and p["lld/share_pos_fell"] == pytest.approx(0.5)
    assert "lld/share_pos_fell_acc_lo" not in p and p["lld/n_pos_acc_lo"] == 0
