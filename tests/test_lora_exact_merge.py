"""`merge_exactly` folds adapters into the base with a fixed-order float64 sum: the result
equals an independent NumPy computation bit for bit, does not depend on torch's thread count,
and computes what the adapted model computes (peft's own merge agrees to float rounding)."""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch

from conftest import make_tiny_model
from llds.policy.config import LoRAConfig
from llds.policy.lora import attach_lora, merge_exactly

pytest.importorskip("peft")


def _adapted(world_tokenizer, seed: int = 0):
    """A tiny model with rank-4 adapters on every projection, B made non-zero (fresh adapters
    have B = 0 and merge to the base itself)."""
    model = make_tiny_model(world_tokenizer, seed=seed)
    cfg = LoRAConfig(r=4, alpha=8.0)
    torch.manual_seed(seed)  # peft draws A from the global generator
    peft_model = attach_lora(model, cfg)
    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=gen) * 0.05)
    return peft_model


def _numpy_merge(peft_model) -> dict[str, np.ndarray]:
    """The same fold written out in NumPy: W + (alpha / r) * sum_k B[:, k] A[k, :], float64."""
    out = {}
    for name, module in peft_model.named_modules():
        if not hasattr(module, "lora_A") or not hasattr(module, "base_layer"):
            continue
        a = module.lora_A["default"].weight.detach().numpy().astype(np.float64)
        b = module.lora_B["default"].weight.detach().numpy().astype(np.float64)
        delta = np.zeros((b.shape[0], a.shape[1]))
        for k in range(a.shape[0]):
            delta = delta + np.outer(b[:, k], a[k, :])
        w = module.base_layer.weight.detach().numpy().astype(np.float64)
        plain = name.removeprefix("base_model.model.")
        out[plain + ".weight"] = (w + module.scaling["default"] * delta).astype(np.float32)
    return out


def test_the_exact_merge_equals_numpy_bit_for_bit_and_the_adapted_model(world_tokenizer):
    peft_model = _adapted(world_tokenizer)
    expected = _numpy_merge(peft_model)
    assert len(expected) == 2 * 7  # 2 layers x q, k, v, o, gate, up, down
    ids = torch.tensor([[5, 9, 17, 33, 2, 41]])
    with torch.no_grad():
        adapted_logits = peft_model(input_ids=ids).logits
    peft_merged = copy.deepcopy(peft_model).merge_and_unload()
    plain = merge_exactly(peft_model)
    assert not any("lora" in n for n, _ in plain.named_parameters())
    weights = dict(plain.named_parameters())
    for name, value in expected.items():
        assert np.array_equal(weights[name].detach().numpy(), value), name
    with torch.no_grad():
        logits = plain(input_ids=ids).logits
    assert torch.allclose(logits, adapted_logits, atol=1e-5)
    theirs = dict(peft_merged.named_parameters())
    worst = max((weights[n] - theirs[n]).abs().max().item() for n in expected)
    assert worst < 1e-6  # peft's matrix product: the same to float rounding


def test_the_exact_merge_does_not_depend_on_the_thread_count(world_tokenizer):
    threads = torch.get_num_threads()
    merges = []
    try:
        for n in (1, 2):
            torch.set_num_threads(n)
            merges.append(dict(merge_exactly(_adapted(world_tokenizer, seed=3)).named_parameters()))
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(merges[0][k], merges[1][k]) for k in merges[0])
