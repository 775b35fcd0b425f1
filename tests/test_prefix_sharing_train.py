"""Prefix sharing in training (`rollout.prefix_sharing`): the update's micro-batches hold
responses only after each mini-batch's prompts run once (`MiniBatchPrompts`), and the no-grad
passes and the decode share the prompts too. The same rollouts, the same gradients and the
same trained weights as the run without it, to float rounding; for full fine-tuning and LoRA."""

from __future__ import annotations

import pytest
import torch

from conftest import tiny_trainer
from llds.policy import prompt_once
from llds.train import trainer as trainer_mod
from llds.train.trainer import GRPOTrainer

LOSS = ["algo.llds.coef=0.5", "algo.kl_coef=0.1", "algo.entropy_coef=0.01"]
LORA = ["model.lora.r=4", "model.lora.alpha=8", "model.lora.target_modules=[q_proj,up_proj]"]


def _run(
    tmp_path, world, tok, retriever, sharing: bool, extra, monkeypatch
) -> tuple[GRPOTrainer, list, list]:
    """Two steps; every optimizer step's gradients and each step's rollouts' response ids."""
    tr = tiny_trainer(
        tmp_path / str(sharing),
        world,
        tok,
        retriever,
        ["steps=2", f"rollout.prefix_sharing={str(sharing).lower()}", *LOSS, *extra],
        seed=1,
    )
    grads: list[list[torch.Tensor]] = []
    tr.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: grads.append(
            [p.grad.detach().clone() for g in opt.param_groups for p in g["params"]]
        )
    )
    rollouts: list[list[list[int]]] = []
    real = trainer_mod.generate_on_every_rank

    def generated(*args):
        batch = real(*args)
        rollouts.append([e.response_ids for e in batch.episodes])
        return batch

    with monkeypatch.context() as patch:
        patch.setattr(trainer_mod, "generate_on_every_rank", generated)
        tr.train()
    return tr, grads, rollouts


@pytest.mark.parametrize(
    "extra",
    [[], ["optim.minibatch_order=rollout", "optim.micro_batch_tokens=30"], LORA],
    ids=["shuffled", "rollout-order", "lora"],
)
def test_a_short_run_trains_the_same_weights(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, extra
):
    """Token-identical rollouts at both steps, the first update's gradients equal to 1e-4
    (relative), and the trained weights after two steps within float noise of the run
    without sharing (Adam's first steps are sign-like: a rounding difference in a gradient
    near zero moves a weight by up to twice the learning rate, so the weights are compared
    on average, against how far training moved them). The shared run does share: each update
    runs its mini-batches' prompts once."""
    shared_passes: list[int] = []
    real = prompt_once.MiniBatchPrompts.backward

    def counted(self):
        shared_passes.append(1)
        return real(self)

    monkeypatch.setattr(prompt_once.MiniBatchPrompts, "backward", counted)
    on, grads_on, rollouts_on = _run(
        tmp_path, small_world, world_tokenizer, world_retriever, True, extra, monkeypatch
    )
    assert len(shared_passes) == 4  # 2 steps x 2 mini-batches
    off, grads_off, rollouts_off = _run(
        tmp_path, small_world, world_tokenizer, world_retriever, False, extra, monkeypatch
    )
    assert len(shared_passes) == 4
    assert rollouts_on == rollouts_off and len(rollouts_on) == 2
    for a, b in zip(grads_on[0], grads_off[0], strict=True):
        assert (a - b).abs().max() <= 1e-4 * b.abs().max() + 1e-8
    assert any(b.abs().sum() > 0 for b in grads_off[0])
    start = tiny_trainer(
        tmp_path / "start", small_world, world_tokenizer, world_retriever, extra, seed=1
    )
    trained = [(n, p) for n, p in off.model.named_parameters() if p.requires_grad]
    first = dict(start.model.named_parameters())
    other = dict(on.model.named_parameters())
    moved = torch.cat([(p - first[n]).detach().abs().flatten() for n, p in trained]).mean()
    apart = torch.cat([(p - other[n]).detach().abs().flatten() for n, p in trained]).mean()
    assert moved > 0
    assert apart <= 1e-3 * moved, (float(apart), float(moved))
