"""Held-out evaluation inside the training loop: metric keys, schedule, no effect on training."""

from __future__ import annotations

import json

import torch

from conftest import make_tiny_model
from llds.rollout import RolloutConfig
from llds.train.evaluate import evaluate
from llds.train.periodic_eval import PeriodicEvaluator, eval_metrics, is_due


def test_eval_metrics_flatten_overall_and_hops() -> None:
    result = {
        "overall": {"n": 4, "em": 0.5, "f1": 0.6, "sub_em": 0.75, "valid_searches": 1.5,
                    "answered": 1.0},
        "by_hops": {"1": {"n": 2, "em": 1.0}, "2": {"n": 2, "em": 0.0}, "3": {"n": 0}},
    }
    assert eval_metrics(result) == {
        "eval/em": 0.5, "eval/f1": 0.6, "eval/sub_em": 0.75, "eval/valid_searches": 1.5,
        "eval/answered": 1.0, "eval/em_1hop": 1.0, "eval/em_2hop": 0.0,
    }


def test_is_due_every_k_steps_and_at_the_end() -> None:
    assert [s for s in range(1, 11) if is_due(s, 4, 10)] == [4, 8, 10]
    assert not any(is_due(s, 0, 10) for s in range(1, 11))


def test_evaluator_matches_evaluate_restores_mode_and_draws_no_randomness(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    model = make_tiny_model(world_tokenizer).train()
    rollout = RolloutConfig(max_turns=1, max_turn_tokens=10, max_total_tokens=160,
                            max_obs_tokens=30)
    examples = small_world.test[:6]
    run = PeriodicEvaluator(examples, world_retriever, world_tokenizer, rollout,
                            template="Question: {question}\n", out_dir=tmp_path)
    rng = torch.get_rng_state()
    got = run(model, step=7)
    assert torch.equal(rng, torch.get_rng_state())
    assert model.training
    ref = evaluate(model.eval(), world_tokenizer, world_retriever, examples, rollout,
                   template="Question: {question}\n", progress=False)
    assert got == eval_metrics(ref)
    saved = json.loads((tmp_path / "eval" / "step_000007.json").read_text())
    assert [r["prediction"] for r in saved["records"]] == [
        r["prediction"] for r in ref["records"]]
