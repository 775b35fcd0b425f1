"""`rollout.dtype`: rollouts sample from a low-precision copy of the policy that follows every
update, while pi_old, the update and the checkpoints stay on the float32 policy."""

from __future__ import annotations

import re

import pytest
import torch
from torch import nn

from conftest import make_tiny_model, write_run_inputs
from llds.errors import ConfigError
from llds.policy.sampling_copy import make_sampling_copy, refresh_sampling_copy
from llds.rollout.config import RolloutConfig
from llds.train import trainer as trainer_mod
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer


def test_copy_is_frozen_cast_and_follows_the_source(world_tokenizer):
    model = make_tiny_model(world_tokenizer)
    clone = make_sampling_copy(model, "bfloat16", None)
    src = dict(model.named_parameters())
    for name, p in clone.named_parameters():
        assert p.dtype == torch.bfloat16 and not p.requires_grad
        assert torch.equal(p, src[name].detach().to(torch.bfloat16))
    assert not clone.training
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    refresh_sampling_copy(model, clone)
    for name, p in clone.named_parameters():
        assert torch.equal(p, src[name].detach().to(torch.bfloat16))
    assert all(p.requires_grad for p in model.parameters())  # the source is left trainable


def test_copy_gets_its_own_attention_kernel(world_tokenizer):
    model = make_tiny_model(world_tokenizer)
    before = model.config._attn_implementation
    clone = make_sampling_copy(model, "bfloat16", "eager")
    assert clone.config._attn_implementation == "eager"
    assert model.config._attn_implementation == before


def test_attention_kernel_needs_a_transformers_model():
    with pytest.raises(ConfigError, match=r"rollout\.attn_implementation"):
        make_sampling_copy(nn.Linear(2, 2), "bfloat16", "eager")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"attn_implementation": "eager"}, "only exists with rollout.dtype"),
        ({"dtype": "bfloat16", "attn_implementation": "fast"}, "should be 'eager'.*got 'fast'"),
    ],
)
def test_rollout_config_names_the_bad_key(fields, message):
    with pytest.raises(ConfigError, match=rf"rollout\.attn_implementation.*{message}"):
        RolloutConfig(**fields).validate()


def test_rollout_logprobs_are_refused_with_a_copy(tmp_path, small_world, world_tokenizer):
    cfg = write_run_inputs(tmp_path, small_world, world_tokenizer, steps=1)
    with pytest.raises(ConfigError, match=r"algo\.old_logprobs"):
        load_config(cfg, ["rollout.dtype=bfloat16", "algo.old_logprobs=rollout"])


@pytest.mark.parametrize("kernel", ["eager", "llds_grouped"])
def test_trainer_samples_from_a_refreshed_copy(
    kernel, tmp_path, small_world, world_tokenizer, monkeypatch
):
    """Two steps with nonzero advantages move the float32 policy; the engine's model is the bf16
    copy, equal to the moved policy rounded to bf16, and pi_old was recomputed (a float32 run
    without LLDS would otherwise take it from the rollout)."""
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, g, **k: torch.linspace(-1.0, 1.0, len(r))
    )
    cfg_path = write_run_inputs(
        tmp_path, small_world, world_tokenizer, steps=2, save_every=2, optim={"lr": 1e-2}
    )
    overrides = [f"run_dir={tmp_path / 'run'}", "rollout.dtype=bfloat16"]
    overrides += [f"rollout.attn_implementation={kernel}", "algo.llds.coef=0"]
    tr = GRPOTrainer(load_config(cfg_path, overrides))
    start = {n: p.detach().clone() for n, p in tr.model.named_parameters()}
    rows = tr.train()
    assert tr.engine.model is tr.sampler.model and tr.sampler.is_copy
    assert all(p.dtype == torch.float32 for p in tr.model.parameters())
    policy = dict(tr.model.named_parameters())
    moved = 0
    for name, p in tr.sampler.model.named_parameters():
        assert p.dtype == torch.bfloat16
        assert torch.equal(p, policy[name].detach().to(torch.bfloat16))
        moved += not torch.equal(p, start[name].to(torch.bfloat16))
    assert moved > 0
    assert [r["policy/old_logprobs_from_rollout"] for r in rows] == [0.0, 0.0]
    assert tr.sampler.model.config._attn_implementation == kernel


def test_lora_policy_copy_carries_the_trained_adapters(
    tmp_path, small_world, world_tokenizer, world_retriever
):
    """With peft adapters the copy is the wrapped model: its adapters follow the trained ones,
    its base stays the base, and the attention switch reaches the model inside the wrappers."""
    from conftest import TRAIN_BASE

    overrides = [*TRAIN_BASE, f"run_dir={tmp_path}", "model.lora.r=4", "model.lora.alpha=8"]
    overrides += ["steps=2", "save_every=2", "optim.lr=1e-2", "rollout.dtype=bfloat16"]
    overrides += ["rollout.attn_implementation=eager"]
    tr = GRPOTrainer(
        load_config(None, overrides),
        model=make_tiny_model(world_tokenizer, seed=1),
        tokenizer=world_tokenizer,
        retriever=world_retriever,
        train_examples=small_world.train,
    )
    adapters_before = {
        n: p.detach().clone() for n, p in tr.model.named_parameters() if "lora_" in n
    }
    tr.train()
    policy = dict(tr.model.named_parameters())
    copied = dict(tr.sampler.model.named_parameters())
    assert set(copied) == set(policy) and adapters_before
    moved = [n for n in adapters_before if not torch.equal(policy[n], adapters_before[n])]
    assert moved
    for name in moved:
        assert torch.equal(copied[name], policy[name].detach().to(torch.bfloat16))
    assert all(p.dtype == torch.bfloat16 for p in copied.values())
    inner = next(m for m in tr.sampler.model.modules() if hasattr(m, "config"))
    assert inner.config._attn_implementation == "eager"


def test_a_lagging_copy_needs_a_copy_and_a_lag_that_divides_save_every():
    from llds.errors import ConfigError
    from llds.train.config import load_config

    REQUIRED = ["model.path=m", "data.train=t", "retriever.source=c"]

    copy = [*REQUIRED, "rollout.dtype=float32", "save_every=10"]
    with pytest.raises(ConfigError, match=re.escape("rollout.sync_every: lags the sampling")):
        load_config(None, [*REQUIRED, "rollout.sync_every=5"])
    with pytest.raises(ConfigError, match=re.escape("sync_every: 4 must divide save_every=10")):
        load_config(None, [*copy, "rollout.sync_every=4"])
    cfg = load_config(None, [*copy, "rollout.sync_every=5"])
    assert cfg.rollout.sync_every == 5
