import math

import pytest
import torch

from llds.algo import aggregate, policy_loss

NAN = float("nan")


def _batch():
    # row 0: A = +1, ratios 1.5, 0.5, 1.1 ; row 1: A = -1, ratios 1.5, 0.5, then padding
    ratios = torch.tensor([[1.5, 0.5, 1.1], [1.5, 0.5, 1.0]])
    old = torch.zeros(2, 3)
    logp = ratios.log()
    logp[1, 2] = NAN  # padding may hold garbage
    logp.requires_grad_(True)
    adv = torch.tensor([1.0, -1.0])
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]])
    return logp, old, adv, mask


# per-token losses by hand: -min(rA, clip(r, 0.8, 1.2) A)
ROW0 = [-1.2, -0.5, -1.1]
ROW1 = [1.5, 0.8]


@pytest.mark.parametrize(
    ("mode", "expected"),
    [
        ("token-mean", (sum(ROW0) + sum(ROW1)) / 5),
        ("seq-mean-token-mean", (sum(ROW0) / 3 + sum(ROW1) / 2) / 2),
        ("seq-mean-token-sum", (sum(ROW0) + sum(ROW1)) / 2),
        ("seq-mean-token-sum-norm", (sum(ROW0) / 3 + sum(ROW1) / 3) / 2),
    ],
)
def test_ppo_clip_values_by_hand(mode, expected):
    logp, old, adv, mask = _batch()
    loss, _ = policy_loss(logp, old, adv, mask, clip_low=0.2, aggregation=mode)
    assert loss.item() == pytest.approx(expected, abs=1e-6)


def test_ppo_clip_gradient_closed_form():
    logp, old, adv, mask = _batch()
    loss, _ = policy_loss(logp, old, adv, mask, aggregation="token-mean")
    loss.backward()
    # unclipped token: d(-A r)/dlogp = -A r ; clipped token: 0 ; all / 5 tokens
    expected = torch.tensor([[0.0, -0.5 / 5, -1.1 / 5], [1.5 / 5, 0.0, 0.0]])
    assert torch.allclose(logp.grad, expected, atol=1e-6)


def test_stats_by_hand():
    logp, old, adv, mask = _batch()
    _, s = policy_loss(logp, old, adv, mask)
    assert s["clip_frac_high"].item() == pytest.approx(1 / 5)  # A>0, r=1.5 > 1.2
    assert s["clip_frac_low"].item() == pytest.approx(1 / 5)  # A<0, r=0.5 < 0.8
    assert s["ratio_max"].item() == pytest.approx(1.5)
    assert s["ratio_min"].item() == pytest.approx(0.5)
    kl = -(2 * math.log(1.5) + 2 * math.log(0.5) + math.log(1.1)) / 5
    assert s["approx_kl"].item() == pytest.approx(kl, abs=1e-6)


def test_clip_higher_is_asymmetric():
    logp = torch.log(torch.tensor([[1.25, 0.75]]))
    adv = torch.tensor([1.0])
    mask = torch.ones(1, 2)
    loss, s = policy_loss(logp, torch.zeros(1, 2), adv, mask, clip_low=0.2, clip_high=0.28)
    # r=1.25 is inside [0.8, 1.28]; r=0.75 with A>0 is not clipped from below
    assert loss.item() == pytest.approx(-(1.25 + 0.75) / 2)
    assert s["clip_frac_high"].item() == 0.0


def test_dual_clip_bounds_negative_advantage_loss():
    logp = torch.log(torch.tensor([[5.0]]))
    loss, _ = policy_loss(logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert loss.item() == pytest.approx(5.0)
    loss, _ = policy_loss(
        logp, torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1), dual_clip=3.0
    )
    assert loss.item() == pytest.approx(3.0)


def test_gspo_sequence_ratio_value_and_gradient():
    logp = torch.tensor([[0.1, 0.3, 7.0]], requires_grad=True)
    mask = torch.tensor([[1, 1, 0]])
    loss, s = policy_loss(
        logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, clip_low=0.3, ratio_type="sequence"
    )
    sr = math.exp(0.2)  # exp(mean(0.1, 0.3))
    assert loss.item() == pytest.approx(-sr, abs=1e-6)
    assert s["ratio_max"].item() == pytest.approx(sr)
    loss.backward()
    assert torch.allclose(logp.grad, torch.tensor([[-sr / 2, -sr / 2, 0.0]]), atol=1e-6)


def test_accumulation_denominators_reproduce_full_batch():
    torch.manual_seed(0)
    logp = torch.randn(4, 5)
    old = logp + 0.1 * torch.randn(4, 5)
    adv = torch.tensor([1.0, -0.5, 0.3, -1.0])
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [0, 1, 1, 0, 0]])
    for mode in ("token-mean", "seq-mean-token-mean", "seq-mean-token-sum"):
        full, _ = policy_loss(logp, old, adv, mask, aggregation=mode)
        kw = {"num_tokens": mask.sum(), "num_sequences": 4}
        parts = sum(
            policy_loss(logp[s], old[s], adv[s], mask[s], aggregation=mode, **kw)[0]
            for s in (slice(0, 1), slice(1, 4))
        )
        assert parts.item() == pytest.approx(full.item(), abs=1e-6)


def test_aggregate_rejects_unknown_mode():
    with pytest.raises(ValueError, match="token-mean"):
        aggregate(torch.zeros(1, 1), torch.ones(1, 1), "mean")
