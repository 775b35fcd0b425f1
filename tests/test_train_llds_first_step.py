"""LLDS is exactly zero on a rollout batch's first optimizer step (pi_theta == pi_old: d is only
rounding noise), in float32 and bfloat16, however pi_old was computed; it acts from the second
step on; the authors' behaviour (act on the noise) stays available as an option."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_trainer
from llds.errors import ConfigError
from llds.train import trainer as trainer_mod
from llds.train.config import load_config

REQUIRED = ["model.path=m", "data.train=t.jsonl", "retriever.source=c.jsonl"]


def _grads_per_optimizer_step(tmp_path, world, tok, retriever, extra):
    tr = tiny_trainer(tmp_path, world, tok, retriever, ["steps=1", *extra], seed=1)
    grads: list[list[torch.Tensor]] = []
    tr.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append(
            [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
        )
    )
    (row,) = tr.train()
    return grads, row


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("old", ["recompute", "rollout"])
def test_llds_is_exactly_zero_on_the_first_step(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, dtype, old
):
    # every response preserved (A >= 0) except the first: LLDS would touch nearly every token
    monkeypatch.setattr(
        trainer_mod, "group_advantages", lambda r, g, **k: torch.linspace(-0.1, 1.0, len(r))
    )
    common = [f"model.dtype={dtype}", f"algo.old_logprobs={old}", "algo.llds.coef=5.0"]
    runs = {}
    for name, extra in {
        "off": ["algo.llds.enabled=false"],
        "zero": ["algo.llds.first_update=zero"],
        "computed": ["algo.llds.first_update=computed"],
    }.items():
        runs[name] = _grads_per_optimizer_step(
            tmp_path / name, small_world, world_tokenizer, world_retriever, [*common, *extra]
        )
    (off_first, off_second), _ = runs["off"]
    (zero_first, zero_second), zero_row = runs["zero"]
    for a, b in zip(off_first, zero_first, strict=True):
        assert torch.equal(a, b)  # bit for bit: LLDS added nothing on the first step
    # from the second step on LLDS acts (the model has moved: d is real)
    assert any(not torch.equal(a, b) for a, b in zip(off_second, zero_second, strict=True))
    assert zero_row["llds/loss"] > 0
    # what the authors' behaviour would have done on the first step is recorded either way
    (computed_first, _), computed_row = runs["computed"]
    assert zero_row["llds/first_step_gate_frac"] == computed_row["llds/first_step_gate_frac"]
    noise = zero_row["llds/first_step_gate_frac"]
    if noise > 0:  # the gate opened on noise: the authors' first step differs from plain GRPO
        assert any(not torch.equal(a, b) for a, b in zip(off_first, computed_first, strict=True))
    if dtype == "bfloat16" and old == "rollout":
        # sampling logits (KV-cached decode, bf16) vs the training forward: visible noise
        assert noise > 0


def test_llds_with_one_optimizer_step_is_a_config_error():
    with pytest.raises(ConfigError, match=r"^command line: optim\.mini_batches: LLDS acts only"):
        load_config(None, [*REQUIRED, "optim.mini_batches=1"])
    with pytest.raises(ConfigError, match=r"optim\.mini_batches"):
        load_config(None, [*REQUIRED, "optim.mini_batches=1", "optim.epochs=1"])
    load_config(None, [*REQUIRED, "optim.mini_batches=1", "algo.llds.enabled=false"])
    load_config(None, [*REQUIRED, "optim.mini_batches=1", "optim.epochs=2"])
    with pytest.raises(ConfigError, match=r"optim\.mini_batches: diagnostics\.on_alarm=rollback"):
        load_config(
            None,
            [
                *REQUIRED,
                "optim.mini_batches=1",
                "algo.llds.enabled=false",
                "diagnostics.on_alarm=rollback",
            ],
        )
    assert load_config(None, REQUIRED).optim.mini_batches == 10  # the paper's default


def test_warmup_ratio():
    cfg = load_config(None, [*REQUIRED, "steps=200", "optim.warmup_ratio=0.285"])
    assert cfg.warmup_steps == 57
    with pytest.raises(ConfigError, match=r"optim\.warmup_ratio"):
        load_config(None, [*REQUIRED, "optim.warmup_ratio=1.5"])
    with pytest.raises(ConfigError, match=r"optim\.warmup_ratio"):
        load_config(None, [*REQUIRED, "optim.warmup_ratio=0.1", "optim.warmup_steps=3"])
