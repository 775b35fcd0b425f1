"""The counter-based sampling noise: a pure function of (seed, position, token), uniform, and
an exact Gumbel-max sampler, checked against an independent pure-Python mixer and by counts."""

from __future__ import annotations

import math

import torch

from llds.rollout.noise import gumbel_noise, mix32, uniform_noise
from llds.rollout.sampling import sample_next_token


def _mix32_python(x: int) -> int:
    """The same mixer written with Python integers (no tensors, no int64 concerns)."""
    x ^= x >> 16
    x = (x * 0x7FEB352D) % 2**32
    x ^= x >> 15
    x = (x * 0x646CA68B) % 2**32
    return x ^ (x >> 16)


def test_mix32_equals_an_independent_python_mixer():
    values = [0, 1, 2, 12345, 2**31 - 1, 2**31, 2**32 - 1, 0xDEADBEEF]
    got = mix32(torch.tensor(values, dtype=torch.long)).tolist()
    assert got == [_mix32_python(v) for v in values]
    assert all(0 <= g < 2**32 for g in got)


def test_noise_of_a_row_does_not_depend_on_its_batch_mates():
    seeds = torch.tensor([7, 2**61 + 5, 123456789, 7], dtype=torch.long)
    positions = torch.tensor([0, 40, 3, 1], dtype=torch.long)
    batch = uniform_noise(seeds, positions, 300)
    for r in range(4):
        alone = uniform_noise(seeds[r : r + 1], positions[r : r + 1], 300)
        assert torch.equal(alone[0], batch[r])
    # the same seed at another position, and seeds that differ only in their high bits, differ
    assert not torch.equal(batch[0], batch[3])
    high = uniform_noise(torch.tensor([5, 5 + 2**40]), torch.tensor([0, 0]), 300)
    assert (high[0] != high[1]).float().mean() > 0.99


def test_uniforms_are_uniform_and_uncorrelated():
    seeds = torch.arange(64, dtype=torch.long).repeat_interleave(64)
    positions = torch.arange(64, dtype=torch.long).repeat(64)
    u = uniform_noise(seeds, positions, 256)  # 1,048,576 draws
    assert float(u.min()) > 0 and float(u.max()) < 1
    counts = torch.histc(u.flatten(), bins=32, min=0.0, max=1.0)
    expected = u.numel() / 32
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2 < 80  # 31 degrees of freedom: P(chi2 > 80) < 1e-5 for uniform draws
    flat = u.flatten() - 0.5
    for lag in (1, 256, 256 * 64):  # next token, next position, next seed
        corr = float((flat[:-lag] * flat[lag:]).mean() / flat.var())
        assert abs(corr) < 0.01
    # a Gumbel variable has mean Euler's gamma and variance pi^2 / 6
    g = gumbel_noise(seeds, positions, 256)
    assert abs(float(g.mean()) - 0.5772) < 0.01
    assert abs(float(g.var()) - math.pi**2 / 6) < 0.02


def test_gumbel_max_samples_the_softmax():
    logits = torch.tensor([2.0, 1.0, 0.0, -1.0, 0.5])
    n = 40_000
    rows = logits.expand(n, -1)
    picked = sample_next_token(
        rows,
        temperature=0.7,
        row_seeds=torch.arange(n, dtype=torch.long),
        positions=torch.full((n,), 3, dtype=torch.long),
    )
    freq = torch.bincount(picked, minlength=5).float() / n
    probs = torch.softmax(logits / 0.7, -1)
    se = (probs * (1 - probs) / n).sqrt()
    assert bool(((freq - probs).abs() < 5 * se).all()), (freq, probs)


def test_row_seeds_need_positions_of_the_same_shape():
    logits = torch.zeros(3, 10)
    try:
        sample_next_token(logits, row_seeds=torch.zeros(3, dtype=torch.long))
    except ValueError as exc:
        assert "positions" in str(exc)
    else:
        raise AssertionError("row_seeds without positions was accepted")
