import math

import pytest
import torch

from llds.algo import kl_penalty


def test_estimators_by_hand():
    lp, ref = torch.tensor([-1.0, -2.0]), torch.tensor([-2.0, -1.5])
    # diff = log pi - log ref = [1, -0.5]
    assert torch.allclose(kl_penalty(lp, ref, "k1"), torch.tensor([1.0, -0.5]))
    assert torch.allclose(kl_penalty(lp, ref, "k2"), torch.tensor([0.5, 0.125]))
    k3 = [math.exp(-1) + 1 - 1, math.exp(0.5) - 0.5 - 1]
    assert torch.allclose(kl_penalty(lp, ref, "k3"), torch.tensor(k3))
    assert torch.allclose(kl_penalty(lp, ref, "low_var_kl"), torch.tensor(k3))
    assert torch.allclose(kl_penalty(lp, ref, "abs"), torch.tensor([1.0, 0.5]))


def test_k3_is_clamped_and_gradient_only_through_policy():
    lp = torch.tensor([-30.0, -1.0], requires_grad=True)
    ref = torch.tensor([0.0, -1.0], requires_grad=True)
    k = kl_penalty(lp, ref, "k3")
    assert k[0].item() == 10.0 and k[1].item() == 0.0
    k.sum().backward()
    assert ref.grad is None
    # d/dlp [exp(ref - lp) - (ref - lp) - 1] = -exp(ref - lp) + 1 = 0 at lp == ref
    assert lp.grad[1].item() == pytest.approx(0.0)


def test_unknown_kind():
    with pytest.raises(ValueError, match="k3"):
        kl_penalty(torch.zeros(1), torch.zeros(1), "k9")
