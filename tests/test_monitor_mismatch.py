"""Sampler-vs-trained mismatch metrics against hand-computed values on tiny tensors."""

from __future__ import annotations

import math

import pytest
import torch

from llds.monitor.mismatch import correction_metrics, mismatch_metrics

SAMPLER = torch.tensor([[-1.0, -2.0, 0.0], [-0.5, 0.0, 0.0]])
TRAINED = torch.tensor([[-1.1, -1.8, 5.0], [-0.5, 3.0, 0.0]])  # masked-out columns differ wildly
MASK = torch.tensor([[1, 1, 0], [1, 0, 0]], dtype=torch.bool)


def test_values_by_hand():
    m = mismatch_metrics(SAMPLER, TRAINED, MASK)
    # log-ratios over the 3 masked tokens: -0.1, 0.2, 0.0
    r1, r2, r3 = math.exp(-0.1), math.exp(0.2), 1.0
    assert m["mismatch/k3_kl"] == pytest.approx(((r1 - 0.9) + (r2 - 1.2) + 0.0) / 3, abs=1e-7)
    assert m["mismatch/abs_logp_diff_max"] == pytest.approx(0.2, abs=1e-6)
    assert m["mismatch/abs_logp_diff_mean"] == pytest.approx(0.1, abs=1e-6)
    assert m["mismatch/chi2_token"] == pytest.approx((r1**2 + r2**2 + r3**2) / 3 - 1, abs=1e-6)
    ess = (r1 + r2 + r3) ** 2 / (3 * (r1**2 + r2**2 + r3**2))
    assert m["mismatch/is_ess"] == pytest.approx(ess, abs=1e-7)
    assert 0 < m["mismatch/is_ess"] < 1


def test_same_policy_is_no_mismatch():
    m = mismatch_metrics(SAMPLER, SAMPLER.clone(), MASK)
    assert m["mismatch/k3_kl"] == 0.0
    assert m["mismatch/abs_logp_diff_max"] == 0.0
    assert m["mismatch/chi2_token"] == 0.0
    assert m["mismatch/is_ess"] == 1.0


def test_empty_mask_gives_nothing():
    assert mismatch_metrics(SAMPLER, TRAINED, torch.zeros_like(MASK)) == {}
    assert correction_metrics(torch.ones(2, 3), torch.zeros(2, 3), torch.zeros_like(MASK)) == {}


def test_k3_estimates_the_kl_from_the_samplers_samples():
    """Mean k3 over tokens drawn from the sampler approaches the exact KL(sampler || trained)."""
    p = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    q = torch.tensor([0.3, 0.3, 0.4], dtype=torch.float64)
    exact = float((p * (p / q).log()).sum())
    gen = torch.Generator().manual_seed(0)
    x = torch.multinomial(p, 200_000, replacement=True, generator=gen).view(1, -1)
    m = mismatch_metrics(p.log()[x], q.log()[x], torch.ones_like(x, dtype=torch.bool))
    assert m["mismatch/k3_kl"] == pytest.approx(exact, rel=0.03)


def test_a_wild_token_stays_finite():
    m = mismatch_metrics(torch.tensor([[-40.0]]), torch.tensor([[-1.0]]), torch.tensor([[True]]))
    assert m["mismatch/abs_logp_diff_max"] == pytest.approx(39.0)
    assert all(math.isfinite(v) for v in m.values())


def test_token_level_correction():
    weights = torch.tensor([[1.0, 0.5, 9.0], [2.0, 0.0, 0.0]])
    clipped = torch.tensor([[False, True, True], [False, False, False]])
    m = correction_metrics(weights, clipped, MASK)
    assert m["mismatch/is_weight_mean"] == pytest.approx((1.0 + 0.5 + 2.0) / 3)
    assert m["mismatch/is_clipped_frac"] == pytest.approx(1 / 3)


def test_sequence_level_correction_counts_each_token():
    """A per-sequence weight counts once per model token of its row (2 and 1 tokens here)."""
    m = correction_metrics(torch.tensor([0.5, 2.0]), torch.tensor([True, False]), MASK)
    assert m["mismatch/is_weight_mean"] == pytest.approx((0.5 * 2 + 2.0) / 3)
    assert m["mismatch/is_clipped_frac"] == pytest.approx(2 / 3)
