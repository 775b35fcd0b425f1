"""LoRA through peft: only adapters train, the reference is the model with adapters off, and a
saved adapter (and the merged weights) give the same log-probs."""

from __future__ import annotations

import sys

import pytest
import torch

from conftest import TRAIN_BASE, make_tiny_model, tiny_trainer
from llds.errors import ConfigError
from llds.policy.forward import response_log_probs, split_lm_head
from llds.policy.lora import (
    ADAPTER_DIR,
    WithoutAdapters,
    attach_lora,
    is_lora,
    load_adapter,
    merged,
)
from llds.rollout.batch import Episode, RolloutBatch
from llds.train.config import LoRAConfig, load_config

LORA = ["model.lora.r=4", "model.lora.alpha=8", "algo.kl_coef=0.01"]


def _batch(tok) -> RolloutBatch:
    gen = torch.Generator().manual_seed(0)
    episodes = []
    for k in range(2):
        prompt = torch.randint(5, len(tok), (6 + k,), generator=gen).tolist()
        ep = Episode(prompt_ids=prompt, example_id=str(k), group_id=str(k), golds=("x",))
        n = 5 + k
        reply = torch.randint(5, len(tok), (n,), generator=gen).tolist()
        ep.append(reply, action=True, logprobs=[0.0] * n, entropies=[0.0] * n)
        episodes.append(ep)
    return RolloutBatch.from_episodes(episodes, tok.pad_token_id)


def _logp(model, batch) -> torch.Tensor:
    """Log-probs of the model-written tokens (0 elsewhere: the head may skip those columns)."""
    with torch.no_grad():
        return response_log_probs(model, batch)[0] * batch.loss_mask


def _trainer(tmp_path, world, tok, retriever, extra=()):
    return tiny_trainer(tmp_path, world, tok, retriever, [*LORA, *extra], seed=1, resume=True)


def test_fresh_adapters_change_nothing_and_only_they_train(world_tokenizer) -> None:
    base = make_tiny_model(world_tokenizer, seed=2)
    batch = _batch(world_tokenizer)
    want = _logp(base, batch)
    model = attach_lora(base, LoRAConfig(r=4, alpha=8, target_modules=["q_proj", "v_proj"]))
    assert is_lora(model)
    assert torch.equal(_logp(model, batch), want)  # B = 0: the same function
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    # 2 layers x (q, v) x (A, B)
    assert len(trainable) == 2 * 2 * 2


def test_training_moves_adapters_only_and_the_reference_stays_the_base(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    tr = _trainer(
        tmp_path, small_world, world_tokenizer, world_retriever, ["steps=2", "save_every=2"]
    )
    assert isinstance(tr.ref_model, WithoutAdapters)
    base_before = {
        n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" not in n
    }
    lora_before = {n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" in n}
    params_in_optimizer = sum(len(g["params"]) for g in tr.optimizer.param_groups)
    assert params_in_optimizer == len(lora_before)
    batch = _batch(world_tokenizer)
    tr.train()
    for n, p in tr.model.named_parameters():
        if "lora_" in n:
            assert p.grad is None or torch.isfinite(p.grad).all()
        else:
            assert torch.equal(p.detach(), base_before[n]), n  # the base never moves
            assert p.grad is None, n
    assert any(
        not torch.equal(p.detach(), lora_before[n])
        for n, p in tr.model.named_parameters()
        if "lora_" in n
    )
    # the reference is the initial policy: the base model's log-probs, adapters on or not
    reference = make_tiny_model(world_tokenizer, seed=1)
    assert torch.allclose(_logp(tr.ref_model, batch), _logp(reference, batch), atol=1e-6)
    # ... with the LM head on the written tokens only, as the policy's own passes
    assert split_lm_head(tr.ref_model) is not None
    with torch.no_grad():
        full, _ = response_log_probs(tr.ref_model, batch, actions_only=False)
    assert torch.allclose(_logp(tr.ref_model, batch), full * batch.loss_mask, atol=1e-6)
    assert not torch.allclose(_logp(tr.model, batch), _logp(reference, batch), atol=1e-6)
    assert tr.model.training  # the reference pass does not switch the policy's mode

    # the checkpoint: the adapter (no merged weights), reloading to the trained log-probs
    ckpt = tmp_path / "checkpoints" / "step_000002"
    assert not (ckpt / "model").exists()
    trained = _logp(tr.model, batch)
    reloaded = load_adapter(make_tiny_model(world_tokenizer, seed=1), ckpt / ADAPTER_DIR)
    assert torch.allclose(_logp(reloaded, batch), trained, atol=1e-6)
    assert not is_lora(merged(tr.model)) and is_lora(tr.model)
    assert torch.allclose(_logp(merged(tr.model), batch), trained, atol=1e-5)


def test_resume_loads_the_adapters(tmp_path, small_world, world_tokenizer, world_retriever):
    first = _trainer(
        tmp_path, small_world, world_tokenizer, world_retriever, ["steps=2", "save_every=2"]
    )
    first.train()
    batch = _batch(world_tokenizer)
    resumed = _trainer(
        tmp_path, small_world, world_tokenizer, world_retriever, ["steps=2", "save_every=2"]
    )
    assert resumed.step == 2
    assert torch.allclose(_logp(resumed.model, batch), _logp(first.model, batch), atol=1e-6)


def test_lora_errors_name_the_key(monkeypatch, world_tokenizer) -> None:
    with pytest.raises(ConfigError, match=r"model\.lora\.r"):
        load_config(None, [*TRAIN_BASE, "model.lora.r=0"])
    with pytest.raises(ConfigError, match=r"model\.lora: LoRA with fsdp"):
        load_config(None, [*TRAIN_BASE, "model.lora.r=4", "fsdp.enabled=true"])
    with pytest.raises(ConfigError, match=r"target_modules: \['qkv'\] are not modules"):
        attach_lora(make_tiny_model(world_tokenizer), LoRAConfig(target_modules=["qkv"]))
    monkeypatch.setitem(sys.modules, "peft", None)  # as if peft were not installed
    with pytest.raises(ConfigError, match=r"pip install 'llds\[lora\]'"):
        attach_lora(make_tiny_model(world_tokenizer), LoRAConfig())
