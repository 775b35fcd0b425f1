import pytest
import torch

from llds.algo import token_entropy, token_log_probs, token_log_probs_and_entropy


def _naive(logits, labels, temperature=1.0):
    x = logits if logits.dtype == torch.float64 else logits.float()
    logq = torch.log_softmax(x / temperature, dim=-1)
    lp = logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    ent = -(logq.exp() * logq).sum(-1)
    return lp, ent


@pytest.mark.parametrize("chunk", [1, 7, 64, 10_000])
def test_values_and_gradients_match_full_softmax(chunk):
    torch.manual_seed(0)
    logits = (3 * torch.randn(3, 11, 50, dtype=torch.float64)).requires_grad_(True)
    labels = torch.randint(0, 50, (3, 11))
    g_lp, g_ent = torch.randn(3, 11), torch.randn(3, 11)

    lp, ent = token_log_probs_and_entropy(logits, labels, chunk_size=chunk, temperature=0.7)
    (lp * g_lp + ent * g_ent).sum().backward()
    ours = logits.grad.clone()

    logits.grad = None
    lp_ref, ent_ref = _naive(logits.double(), labels, temperature=0.7)
    (lp_ref * g_lp + ent_ref * g_ent).sum().backward()
    assert torch.allclose(lp.double(), lp_ref, atol=1e-5)
    assert torch.allclose(ent.double(), ent_ref, atol=1e-5)
    assert torch.allclose(ours, logits.grad, atol=1e-5)


def test_entropy_by_hand_and_shapes():
    logits = torch.log(torch.tensor([[0.5, 0.25, 0.25], [1.0, 1e-12, 1e-12]]))
    ent = token_entropy(logits)
    assert ent[0].item() == pytest.approx(1.5 * 0.6931471805599453, abs=1e-6)
    assert ent[1].item() == pytest.approx(0.0, abs=1e-6)
    lp = token_log_probs(logits, torch.tensor([1, 0]))
    assert lp.tolist() == pytest.approx([-1.3862943611, 0.0], abs=1e-6)


def test_bfloat16_logits_are_computed_in_float32():
    torch.manual_seed(1)
    logits = torch.randn(2, 5, 300).to(torch.bfloat16).requires_grad_(True)
    labels = torch.randint(0, 300, (2, 5))
    lp = token_log_probs(logits, labels, chunk_size=3)
    assert lp.dtype == torch.float32
    lp_ref, _ = _naive(logits.detach().float(), labels)
    assert torch.allclose(lp, lp_ref, atol=1e-5)
    lp.sum().backward()
    assert logits.grad.dtype == torch.bfloat16


def test_shape_mismatch():
    with pytest.raises(ValueError, match="labels"):
        token_log_probs(torch.zeros(2, 3, 5), torch.zeros(2, 4, dtype=torch.long))
