"""The probe's update with the training optimizer: one step of a fresh AdamW with the run's
settings, checked against AdamW's first step written out by hand, and wired to the run's
`optim.*` by the trainer's in-loop probe."""

from __future__ import annotations

import contextlib
import copy
import dataclasses
from types import SimpleNamespace

import pytest
import torch

from conftest import make_tiny_model, rollout_requests, tag_happy
from llds.algo import group_advantages, policy_loss
from llds.policy.forward import response_log_probs
from llds.probe.one_step import probe_group, probe_objective
from llds.probe.update import AdamSettings, apply_updates, make_optimizer
from llds.rollout import RolloutConfig, RolloutEngine

CFG = RolloutConfig(
    max_turns=1, max_turn_tokens=16, max_obs_tokens=32, max_total_tokens=200, topk=2
)
ADAM = AdamSettings(betas=(0.8, 0.95), eps=1e-6, weight_decay=0.1)
LR = 1e-3


@pytest.fixture
def group(small_world, world_tokenizer, world_retriever):
    """A tiny model and one sampled group of 6 whose rewards are set mixed by hand."""
    model = tag_happy(make_tiny_model(world_tokenizer, seed=3), world_tokenizer, bias=5.0)
    reqs = rollout_requests(small_world, world_tokenizer, n=6, group=6)
    engine = RolloutEngine(model, world_tokenizer, world_retriever, CFG)
    batch = engine.generate(reqs, generator=torch.Generator().manual_seed(11))
    batch = dataclasses.replace(batch, rewards=torch.tensor([1.0, 0.0, 0.0, 1.0, 0.0, 0.0]))
    assert batch.loss_mask.any(-1).all()
    return model, batch


def _adamw_first_step_by_hand(model, batch, lr: float, adam: AdamSettings) -> dict:
    """The weights after AdamW's first step on the probe's GRPO loss (ratio 1): with no history
    the bias-corrected moments are g and g^2, so p <- p (1 - lr wd) - lr g / (|g| + eps)."""
    params = dict(model.named_parameters())
    model.eval()
    with torch.no_grad():
        old, _ = response_log_probs(model, batch)
    lp, _ = response_log_probs(model, batch)
    adv = group_advantages(batch.rewards, batch.group_ids)
    loss, _ = policy_loss(lp, old, adv, batch.loss_mask, clip_low=0.2)
    grads = torch.autograd.grad(loss, list(params.values()), allow_unused=True)
    out = {}
    for (name, p), g in zip(params.items(), grads, strict=True):
        w = p.detach().clone()
        if g is not None:  # AdamW leaves a parameter without a gradient alone, decay included
            w = w * (1 - lr * adam.weight_decay) - lr * g / (g.abs() + adam.eps)
        out[name] = w
    return out


def test_the_adamw_update_is_adamws_first_step(group) -> None:
    model, batch = group
    by_hand = _adamw_first_step_by_hand(model, batch, LR, ADAM)
    # torch's own AdamW, one step on a copy, agrees with the formula
    ref = copy.deepcopy(model)
    ref.eval()
    with torch.no_grad():
        old, _ = response_log_probs(ref, batch)
    opt = torch.optim.AdamW(
        ref.parameters(), lr=LR, betas=ADAM.betas, eps=ADAM.eps, weight_decay=ADAM.weight_decay
    )
    lp, _ = response_log_probs(ref, batch)
    adv = group_advantages(batch.rewards, batch.group_ids)
    policy_loss(lp, old, adv, batch.loss_mask, clip_low=0.2)[0].backward()
    opt.step()
    # the probe's update, in place on another copy
    mine = copy.deepcopy(model)
    params = [p for p in mine.parameters() if p.requires_grad]
    mine.eval()
    with torch.no_grad():
        old_mine, _ = response_log_probs(mine, batch)
    objective = probe_objective(0.2, "token-mean", 0.0)
    apply_updates(mine, batch, old_mine, make_optimizer(params, "adamw", LR, ADAM), objective)
    moved = 0.0
    for name, p in mine.named_parameters():
        assert torch.allclose(p, by_hand[name], atol=1e-6), name
        assert torch.allclose(dict(ref.named_parameters())[name], by_hand[name], atol=1e-6)
        start = dict(model.named_parameters())[name]
        moved = max(moved, float((p - start).detach().abs().max()))
    assert moved > 0.5 * LR  # Adam's first step moves a weight by about lr


def test_probe_group_with_adamw_measures_that_step_and_restores_the_weights(group) -> None:
    model, batch = group
    before = {k: v.clone() for k, v in model.state_dict().items()}
    probe = probe_group(model, batch, lr=LR, optimizer="adamw", adam=ADAM)
    for k, v in model.state_dict().items():
        assert torch.equal(v, before[k]), k
    stepped = copy.deepcopy(model)
    stepped.load_state_dict(_adamw_first_step_by_hand(model, batch, LR, ADAM), strict=False)
    stepped.eval()
    with torch.no_grad():
        expected, _ = response_log_probs(stepped, batch)
    mask = batch.loss_mask
    assert torch.allclose(probe.new[mask], expected[mask], atol=1e-4)
    assert (probe.new - probe.old)[mask].abs().max() > 1e-3
    # a fresh optimizer per question: the same group probed again gives the same step
    again = probe_group(model, batch, lr=LR, optimizer="adamw", adam=ADAM)
    assert torch.equal(again.new, probe.new)
    # the first-order terms are the SGD direction's, whatever the optimizer
    sgd = probe_group(model, batch, lr=LR, optimizer="sgd")
    assert torch.equal(sgd.first_order, probe.first_order)
    assert not torch.allclose(sgd.new[mask], probe.new[mask], atol=1e-4)
    with pytest.raises(ValueError, match="adamw"):
        probe_group(model, batch, lr=LR, optimizer="adam")


@pytest.mark.parametrize("name", ["sgd", "adamw"])
def test_the_in_loop_probe_takes_the_runs_optimizer_settings(monkeypatch, name) -> None:
    import llds.train.diagnostics as diagnostics
    from llds.train.config import TrainConfig

    cfg = TrainConfig()
    cfg.optim = dataclasses.replace(cfg.optim, lr=3e-6, betas=(0.7, 0.9), eps=1e-5)
    cfg.optim = dataclasses.replace(cfg.optim, weight_decay=0.05)
    cfg.diagnostics = dataclasses.replace(cfg.diagnostics, probe_lr=0.02, probe_optimizer=name)
    seen = {}

    def fake_run_probe(*args, **kwargs):
        seen.update(kwargs)
        return []

    monkeypatch.setattr(diagnostics, "run_probe", fake_run_probe)
    fake = SimpleNamespace(
        cfg=cfg,
        rollout_model=torch.nn.Linear(2, 2),
        probe_set=[],
        engine=SimpleNamespace(config=CFG, tokenizer=None, retriever=None),
        prompts=SimpleNamespace(template=""),
        forked_streams=contextlib.nullcontext,
    )
    in_force = dataclasses.replace(cfg.algo.llds, coef=0.7)  # e.g. after a rollback
    diagnostics.Diagnostics.probe(fake, in_force)
    assert seen["objective"] is cfg.algo and seen["llds"] is in_force  # extra terms included
    assert seen["optimizer"] == name
    assert seen["lr"] == (3e-6 if name == "adamw" else 0.02)
    assert seen["adam"] == AdamSettings((0.7, 0.9), 1e-5, 0.05)
