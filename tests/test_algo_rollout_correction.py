"""Importance weights for a sampler that is not the trained policy (TIS, MIS, rejection), checked
against weights computed by hand, and the policy loss they weight."""

from __future__ import annotations

import math

import pytest
import torch

from llds.algo import (
    AlgoConfig,
    RolloutCorrectionConfig,
    TermInputs,
    grpo_objective,
    importance_weights,
    no_correction,
    policy_loss,
)
from llds.errors import ConfigError

L = math.log
# pi_old / pi_sampler per token: row 0 = [1, 3, 0.5 | pad], row 1 = [0.4, 1 | pad, pad],
# row 2 = [3, 3, 1 | pad]; the padded column holds a wild ratio that must never matter
OLD = torch.tensor([[0.0, L(3.0), L(0.5), 9.0], [L(0.4), 0.0, 9.0, 9.0], [L(3), L(3), 0.0, 9.0]])
SAMPLER = torch.zeros(3, 4)
MASK = torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]], dtype=torch.bool)


def weights(mode: str, level: str, cap: float = 2.0) -> tuple[torch.Tensor, torch.Tensor]:
    return importance_weights(OLD, SAMPLER, MASK, mode=mode, level=level, cap=cap)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("mode", "level", "expected", "clipped"),
    [
        # token level: rho per token; TIS truncates at 2, MIS zeroes above 2
        (
            "tis",
            "token",
            [[1, 2, 0.5, 1], [0.4, 1, 1, 1], [2, 2, 1, 1]],
            [[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]],
        ),
        (
            "mis",
            "token",
            [[1, 0, 0.5, 1], [0.4, 1, 1, 1], [0, 0, 1, 1]],
            [[0, 1, 0, 0], [0, 0, 0, 0], [1, 1, 0, 0]],
        ),
        # reject, token level: a row with any token outside [1/2, 2] is dropped (row 0: 3 > 2;
        # row 1: 0.4 < 1/2; row 2: 3 > 2); kept rows weigh 1
        (
            "reject",
            "token",
            [[0, 0, 0, 1], [0, 0, 1, 1], [0, 0, 0, 1]],
            [[1, 1, 1, 0], [1, 1, 0, 0], [1, 1, 1, 0]],
        ),
        # sequence level: rho = product over the row's model tokens: 1.5, 0.4, 9
        (
            "tis",
            "sequence",
            [[1.5, 1.5, 1.5, 1], [0.4, 0.4, 1, 1], [2, 2, 2, 1]],
            [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]],
        ),
        (
            "mis",
            "sequence",
            [[1.5, 1.5, 1.5, 1], [0.4, 0.4, 1, 1], [0, 0, 0, 1]],
            [[0, 0, 0, 0], [0, 0, 0, 0], [1, 1, 1, 0]],
        ),
        # reject, sequence level: 1.5 is inside [1/2, 2]; 0.4 and 9 are outside
        (
            "reject",
            "sequence",
            [[1, 1, 1, 1], [0, 0, 1, 1], [0, 0, 0, 1]],
            [[0, 0, 0, 0], [1, 1, 0, 0], [1, 1, 1, 0]],
        ),
    ],
)
def test_weights_by_hand(mode, level, expected, clipped):
    w, c = weights(mode, level)
    assert torch.allclose(w, torch.tensor(expected, dtype=torch.float32), atol=1e-6)
    assert torch.equal(c, torch.tensor(clipped, dtype=torch.bool))


def test_the_cap_is_inclusive_and_changes_the_weights():
    w, c = weights("tis", "token", cap=3.0)  # rho = 3 sits exactly on the cap: kept
    assert torch.allclose(w[0, :3], torch.tensor([1.0, 3.0, 0.5]), atol=1e-6)
    assert not c[0].any()
    w, _ = weights("reject", "sequence", cap=3.0)  # 0.4 < 1/3 is false: row 1 kept now
    assert torch.equal(w[1], torch.ones(4))


def test_off_and_no_correction_are_exactly_one():
    for w, c in (weights("off", "token"), no_correction(MASK)):
        assert torch.equal(w, torch.ones(3, 4)) and w.dtype == torch.float32
        assert not c.any()
    lp = torch.randn(3, 4)  # the same policy on both sides: exp(0) is exactly 1
    w, c = importance_weights(lp, lp.clone(), MASK, mode="tis", level="sequence", cap=2.0)
    assert torch.equal(w, torch.ones(3, 4)) and not c.any()


def test_weights_carry_no_gradient():
    old = OLD.clone().requires_grad_(True)
    w, _ = importance_weights(old, SAMPLER, MASK, mode="tis", level="token", cap=2.0)
    assert not w.requires_grad


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="cap"):
        weights("tis", "token", cap=1.0)
    with pytest.raises(ValueError, match="level"):
        weights("tis", "tokens")
    with pytest.raises(ValueError, match="mode"):
        weights("clip", "token")
    with pytest.raises(ConfigError, match=r"algo\.rollout_correction\.cap"):
        RolloutCorrectionConfig(cap=1.0)
    with pytest.raises(ConfigError, match=r"algo\.rollout_correction\.mode"):
        RolloutCorrectionConfig(mode="clip")  # type: ignore[arg-type]


def test_new_switches_default_to_off():
    algo = AlgoConfig()
    assert algo.rollout_correction.mode == "off" and algo.filter_void_turns is False


def test_weighted_policy_loss_equals_the_hand_weighted_loss():
    """ratio 1 (log pi = log pi_old), A = 1: each token's surrogate is -1; weights 2, 0.5, 0 over
    3 tokens give -(2 + 0.5 + 0) / 3, and d loss / d log pi_t = -w_t / 3."""
    logp = torch.tensor([[-1.0, -2.0, -0.5, -3.0]], requires_grad=True)
    old = logp.detach().clone()
    mask = torch.tensor([[1, 1, 1, 0]], dtype=torch.bool)
    w = torch.tensor([[2.0, 0.5, 0.0, 7.0]])
    loss, _ = policy_loss(logp, old, torch.tensor([1.0]), mask, weights=w)
    assert loss.item() == pytest.approx(-2.5 / 3)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-2 / 3, -0.5 / 3, 0.0, 0.0]]))


def test_policy_loss_without_weights_is_bit_identical():
    g = torch.Generator().manual_seed(0)
    logp = torch.randn(3, 4, generator=g)
    old = logp + 0.3 * torch.randn(3, 4, generator=g)
    adv = torch.tensor([1.0, -0.5, 2.0])
    base, _ = policy_loss(logp, old, adv, MASK)
    none, _ = policy_loss(logp, old, adv, MASK, weights=None)
    ones, _ = policy_loss(logp, old, adv, MASK, weights=torch.ones(3, 4))
    assert torch.equal(base, none) and torch.equal(base, ones)


def test_objective_passes_the_weights_to_the_policy_term_only():
    g = torch.Generator().manual_seed(1)
    logp = torch.randn(3, 4, generator=g)
    old = logp + 0.1 * torch.randn(3, 4, generator=g)
    adv = torch.tensor([1.0, -1.0, 0.5])
    w, _ = weights("tis", "token")
    algo = AlgoConfig(kl_coef=0.1)
    _, plain = grpo_objective(TermInputs(logp, old, adv, MASK, ref_log_probs=old), algo)
    _, st = grpo_objective(TermInputs(logp, old, adv, MASK, ref_log_probs=old, is_weights=w), algo)
    expected, _ = policy_loss(logp, old, adv, MASK, weights=w)
    assert torch.equal(st["policy/pg_loss"], expected)
    assert not torch.equal(st["policy/pg_loss"], plain["policy/pg_loss"])
    assert torch.equal(st["policy/kl"], plain["policy/kl"])
