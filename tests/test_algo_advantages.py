import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from llds.algo import group_advantages


def test_grpo_zscore_by_hand():
    r = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0])
    adv = group_advantages(r, ["a", "a", "a", "b", "b", "b"])
    # group a: mean 1/3, unbiased std sqrt(((2/3)^2 + 2 (1/3)^2) / 2) = sqrt(1/3)
    std = math.sqrt(1 / 3)
    expected = [(2 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), (-1 / 3) / (std + 1e-6), 0, 0, 0]
    assert torch.allclose(adv, torch.tensor(expected), atol=1e-6)
    assert torch.equal(adv[3:], torch.zeros(3))  # all-equal group: exactly zero


def test_dr_grpo_centering_only():
    r = torch.tensor([1.0, 0.0, 0.0, 3.0, 1.0])
    adv = group_advantages(r, torch.tensor([7, 7, 7, 9, 9]), normalize_std=False)
    assert torch.allclose(adv, torch.tensor([2 / 3, -1 / 3, -1 / 3, 1.0, -1.0]))


def test_singleton_and_inexact_equal_groups_are_exactly_zero():
    # 0.1 is not representable: a naive (r - mean) / (0 + eps) would give ~1e-11, not 0
    r = torch.tensor([0.1, 0.1, 0.1, 5.0], dtype=torch.float64)
    adv = group_advantages(r, ["g", "g", "g", "solo"])
    assert torch.equal(adv, torch.zeros(4, dtype=torch.float64))


def test_groups_are_not_pooled_across_ids_with_same_row_index():
    r = torch.tensor([1.0, 0.0, 1.0, 1.0])
    adv = group_advantages(r, [("nq", 0), ("nq", 0), ("hotpot", 0), ("hotpot", 0)])
    assert adv[2] == 0 and adv[3] == 0 and adv[0] > 0 > adv[1]


def test_length_mismatch_is_an_error():
    with pytest.raises(ValueError, match="group ids"):
        group_advantages(torch.zeros(3), ["a", "b"])


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 4), st.floats(-3, 3, allow_nan=False)), min_size=1, max_size=30
    )
)
def test_advantages_sum_to_zero_per_group(pairs):
    gids = [g for g, _ in pairs]
    r = torch.tensor([x for _, x in pairs], dtype=torch.float64)
    adv = group_advantages(r, gids)
    for g in set(gids):
        idx = [i for i, x in enumerate(gids) if x == g]
        assert abs(float(adv[idx].sum())) < 1e-9
        if len(idx) > 1 and float(r[idx].std()) > 1e-3:
            # z-scores have unit unbiased std (up to eps)
            assert abs(float(adv[idx].std()) - 1.0) < 1e-3
