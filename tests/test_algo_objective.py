"""`grpo_objective` is exactly the sum of its tested terms, and LLDS that must not act adds
nothing, to the value or the gradient."""

from __future__ import annotations

import pytest
import torch

from llds.algo import (
    AlgoConfig,
    LLDSConfig,
    TermInputs,
    aggregate,
    grpo_objective,
    kl_penalty,
    llds_loss,
    policy_loss,
    register_loss_term,
    registered_loss_terms,
)
from llds.algo.objective import active_terms
from llds.errors import ConfigError


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
    o = AlgoConfig(
        clip_low=0.2,
        kl_coef=0.05,
        entropy_coef=0.01,
        llds=LLDSConfig(coef=0.3),
        aggregation="token-mean",
    )
    loss, stats = grpo_objective(TermInputs(logp, old, adv, mask, ref, ent), o)
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
    with_llds = AlgoConfig(llds=LLDSConfig(coef=5.0))
    without = AlgoConfig(llds=LLDSConfig(enabled=False))
    # the rollout batch's first update: LLDS does not act there (`first_update: zero`)
    quiet, stats = grpo_objective(TermInputs(logp, old, adv, mask, first_update=True), with_llds)
    plain, _ = grpo_objective(TermInputs(logp, old, adv, mask), without)
    assert float(quiet.detach()) == float(plain.detach())
    (gq,) = torch.autograd.grad(quiet, logp)
    (gp,) = torch.autograd.grad(plain, logp)
    assert torch.equal(gq, gp)
    assert float(stats["llds/loss"]) == 0.0 and float(stats["llds/gate_frac"]) > 0  # measured
    acting, _ = grpo_objective(TermInputs(logp, old, adv, mask), with_llds)
    assert float(acting.detach()) > float(plain.detach())


def test_disabled_llds_adds_nothing_and_reports_nothing():
    logp, old, adv, mask, _, _ = _case(2)
    x = TermInputs(logp, old, adv, mask)
    off, stats = grpo_objective(x, AlgoConfig(llds=LLDSConfig(enabled=False)))
    zero, _ = grpo_objective(x, AlgoConfig(llds=LLDSConfig(coef=0.0)))
    pg, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, aggregation="token-mean")
    assert float(off.detach()) == float(zero.detach()) == float(pg.detach())
    assert not any(k.startswith("llds/") for k in stats)


def _squared_ratio_gap(x: TermInputs, algo: AlgoConfig):
    """A toy term: coef * mean over model tokens of (log pi - log pi_old)^2."""
    d2 = (x.log_probs - x.old_log_probs) ** 2
    value = aggregate(d2, x.loss_mask, "token-mean")
    return algo.extra_terms["toy_gap"] * value, {"toy/gap": value.detach()}


def test_a_registered_term_is_added_only_when_configured():
    if "toy_gap" not in registered_loss_terms():
        register_loss_term("toy_gap")(_squared_ratio_gap)
    logp, old, adv, mask, _, _ = _case(3)
    plain = AlgoConfig(llds=LLDSConfig(enabled=False))
    with_toy = AlgoConfig(llds=LLDSConfig(enabled=False), extra_terms={"toy_gap": 0.5})
    base, base_stats = grpo_objective(TermInputs(logp, old, adv, mask), plain)
    loss, stats = grpo_objective(TermInputs(logp, old, adv, mask), with_toy)
    by_hand = (((logp - old) ** 2) * mask).sum() / mask.sum()
    torch.testing.assert_close(loss, base + 0.5 * by_hand)
    torch.testing.assert_close(stats["toy/gap"], by_hand.detach())
    assert "toy/gap" not in base_stats
    assert [n for n, _ in active_terms(with_toy)] == ["policy", "kl", "entropy", "llds", "toy_gap"]


def test_registry_refuses_unknown_and_taken_names():
    with pytest.raises(ConfigError, match=r"algo.extra_terms: \['nope'\] not registered"):
        active_terms(AlgoConfig(extra_terms={"nope": 1.0}))
    with pytest.raises(ConfigError, match=r"algo\.extra_terms"):  # a built-in is not an extra
        active_terms(AlgoConfig(extra_terms={"kl": 1.0}))
    with pytest.raises(ValueError, match="already registered"):
        register_loss_term("kl")(_squared_ratio_gap)


def test_algo_config_ranges_live_on_the_fields():
    for bad in ({"clip_low": 5.0}, {"clip_low": 0.0}, {"dual_clip": 1.0}, {"kl_coef": -1.0}):
        with pytest.raises(ConfigError, match=rf"^algo\.{next(iter(bad))}: "):
            AlgoConfig(**bad)
    with pytest.raises(ConfigError, match=r"^algo\.llds\.gate: "):
        LLDSConfig(gate="everything")
    with pytest.raises(ConfigError, match=r"^algo\.llds\.coef: "):
        LLDSConfig(coef=float("nan"))
