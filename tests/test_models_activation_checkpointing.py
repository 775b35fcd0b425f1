"""`model.gradient_checkpointing: true` turns on activation checkpointing under the name this
transformers release uses, without the deprecated alias's warning, and leaves generation's
cache on."""

from __future__ import annotations

import warnings

import torch

from conftest import make_tiny_model
from llds.models.hf import enable_activation_checkpointing
from llds.models.tiny import save_tiny
from llds.policy.setup import load_model
from llds.train.config import ModelConfig


def _checkpointed_layers(model) -> int:
    return sum(bool(getattr(m, "gradient_checkpointing", False)) for m in model.modules())


def test_enable_sets_every_decoder_layer_and_warns_nothing(world_tokenizer) -> None:
    model = make_tiny_model(world_tokenizer, seed=0, layers=3)
    assert _checkpointed_layers(model) == 0
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model, use_reentrant=False)
    assert _checkpointed_layers(model) >= 3  # one flag per decoder layer at least


def test_the_config_key_checkpoints_and_keeps_the_same_gradient(world_tokenizer, tmp_path) -> None:
    save_tiny(make_tiny_model(world_tokenizer, seed=4), world_tokenizer, tmp_path / "m")
    ids = torch.randint(
        5, len(world_tokenizer), (2, 12), generator=torch.Generator().manual_seed(1)
    )

    def grads(flag: bool):
        with warnings.catch_warnings():
            warnings.simplefilter("error", FutureWarning)
            model, _ = load_model(
                ModelConfig(path=str(tmp_path / "m"), device="cpu", gradient_checkpointing=flag)
            )
        model.train()
        model(input_ids=ids, labels=ids).loss.backward()
        return model, [p.grad for p in model.parameters()]

    plain, g0 = grads(False)
    checkpointed, g1 = grads(True)
    assert _checkpointed_layers(plain) == 0 and _checkpointed_layers(checkpointed) > 0
    assert checkpointed.config.use_cache is True
    for a, b in zip(g0, g1, strict=True):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-6)
