"""Masked extremes (the ratio's max and min of a micro-batch) against boolean indexing, the
plain way to compute them, on random values, empty masks and infinities."""

from __future__ import annotations

import pytest
import torch

from llds.algo.masking import masked_max, masked_min


def _reference(values: torch.Tensor, mask: torch.Tensor, pick) -> torch.Tensor:
    return pick(values[mask]) if mask.any() else torch.tensor(0.0)


@pytest.mark.parametrize("seed", range(5))
def test_masked_extremes_equal_boolean_indexing(seed: int) -> None:
    g = torch.Generator().manual_seed(seed)
    for trial in range(300):
        rows, cols = (int(x) for x in torch.randint(1, 7, (2,), generator=g))
        values = torch.randn(rows, cols, generator=g) * 3
        if trial % 7 == 0:
            values[0, 0] = float("-inf")
        if trial % 11 == 0:
            values[-1, -1] = float("inf")
        mask = torch.rand(rows, cols, generator=g) < (0.0 if trial % 5 == 0 else 0.5)
        assert torch.equal(masked_max(values, mask), _reference(values, mask, torch.max))
        assert torch.equal(masked_min(values, mask), _reference(values, mask, torch.min))


def test_an_empty_mask_gives_zero_and_all_minus_infinity_stays() -> None:
    values = torch.tensor([[float("-inf"), 2.0]])
    assert masked_max(values, torch.tensor([[False, False]])) == 0.0
    assert masked_max(values, torch.tensor([[True, False]])) == float("-inf")
    assert masked_min(values, torch.tensor([[True, True]])) == float("-inf")
    assert masked_min(torch.tensor([3.0, 1.0]), torch.tensor([1, 0])) == 3.0
