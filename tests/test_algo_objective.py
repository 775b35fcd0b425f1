"""`grpo_objective` is exactly the sum of its tested terms, and LLDS that must not act adds
nothing, to the value or the gradient."""

from __future__ import annotations

import torch

from llds.algo import Objective, aggregate, grpo_objective, kl_penalty, llds_loss, policy_loss


def _case(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    b, t = 4, 7
    mask = torch.ones(b, t)
    mask[:, :2] = 0  # a prompt-like prefix
    mask[1, 4] = 0  # an observation inside row 1
    old = -torch.rand(b, t, generator=g) * 3
    logp = (old + 0.3 * torch.randn(b, t, generator=g)).requires_grad_()
    ref = old + 0.1 * torch.randn(b, t, generator=g)
    ent = torch.rand(b, t, generator=g)
    adv = torch.tensor([1.0, -0.5, 0.0, 2.0])
    return logp, old, adv, mask, ref, ent


def test_objective_is_the_sum_of_its_terms():
    logp, old, adv, mask, ref, ent = _case()
    o = Objective(
        clip_low=0.2, kl_coef=0.05, entropy_coef=0.01, llds_coef=0.3, aggregation="token-mean"
    )
    loss, stats = grpo_objective(logp, old, adv, mask, o, ref_log_probs=ref, entropy=ent)
    pg, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, aggregation="token-mean")
    kl = aggregate(kl_penalty(logp, ref, "low_var_kl"), mask, "token-mean")
    h = aggregate(ent, mask, "token-mean")
    reg, _ = llds_loss(logp, old, adv, mask, coef=0.3)
    expected = pg + 0.05 * kl - 0.01 * h + reg
    assert float(reg.detach()) > 0  # the case exercises LLDS
    torch.testing.assert_close(loss, expected, rtol=0, atol=0)
    (g1,) = torch.autograd.grad(loss, logp)
    (g2,) = torch.autograd.grad(expected, logp)
    torch.testing.assert_close(g1, g2, rtol=0, atol=0)
    assert float(stats["policy/kl"]) == float(kl.detach()) and float(stats["llds/loss"]) == float(
        reg.detach()
    )


def test_llds_that_must_not_act_adds_nothing():
    _, old, adv, mask, _, _ = _case(1)
    logp = (old - 0.2).requires_grad_()  # every token lost likelihood: every gate would open
    with_llds = Objective(llds_coef=5.0)
    without = Objective()
    quiet, stats = grpo_objective(logp, old, adv, mask, with_llds, llds_acts=False)
    plain, _ = grpo_objective(logp, old, adv, mask, without)
    assert float(quiet.detach()) == float(plain.detach())
    (gq,) = torch.autograd.grad(quiet, logp)
    (gp,) = torch.autograd.grad(plain, logp)
    assert torch.equal(gq, gp)
    assert float(stats["llds/loss"]) == 0.0 and float(stats["llds/gate_frac"]) > 0  # measured
    acting, _ = grpo_objective(logp, old, adv, mask, with_llds)
    assert float(acting.detach()) > float(plain.detach())
