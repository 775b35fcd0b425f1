"""A loss term added through the public registry trains: one function, one config entry."""

from __future__ import annotations

import torch

from conftest import TRAIN_BASE, make_tiny_model
from llds.algo import AlgoConfig, TermInputs, aggregate, register_loss_term
from llds.algo.objective import registered_loss_terms
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

CALLS: list[float] = []


def pull_to_old(x: TermInputs, algo: AlgoConfig):
    """A toy term: coef * mean over model tokens of (log pi - log pi_old)^2."""
    value = aggregate((x.log_probs - x.old_log_probs) ** 2, x.loss_mask, "token-mean")
    CALLS.append(algo.extra_terms["pull_to_old"])
    return algo.extra_terms["pull_to_old"] * value, {"toy/pull_to_old": value.detach()}


if "pull_to_old" not in registered_loss_terms():
    register_loss_term("pull_to_old")(pull_to_old)


def _one_step(tmp_path, world, tok, retriever, extra):
    cfg = load_config(None, [*TRAIN_BASE, f"run_dir={tmp_path}", "steps=1", *extra])
    trainer = GRPOTrainer(
        cfg,
        model=make_tiny_model(tok, seed=0),
        tokenizer=tok,
        retriever=retriever,
        train_examples=world.train,
        resume=False,
    )
    trainer.train()
    return [p.detach().clone() for p in trainer.model.parameters()]


def test_a_registered_term_trains_one_step(tmp_path, small_world, world_tokenizer, world_retriever):
    CALLS.clear()
    plain = _one_step(tmp_path / "plain", small_world, world_tokenizer, world_retriever, [])
    assert CALLS == []  # registered but not configured: not called
    toy = _one_step(
        tmp_path / "toy",
        small_world,
        world_tokenizer,
        world_retriever,
        ["algo.extra_terms={pull_to_old: 50.0}"],
    )
    assert CALLS and set(CALLS) == {50.0}  # called on every micro-batch, with its coefficient
    # the first mini-batch has pi_theta == pi_old (the term and its gradient are 0); the second
    # sees a moved policy, so the term changes that update and the weights differ
    assert any(not torch.equal(a, b) for a, b in zip(plain, toy, strict=True))
