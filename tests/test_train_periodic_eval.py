"""Held-out evaluation inside the training loop: metric keys, schedule, no effect on training."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TRAIN_BASE, make_tiny_model
from llds.errors import ConfigError
from llds.evaluation.evaluate import evaluate
from llds.evaluation.periodic import PeriodicEvaluator, eval_metrics, is_due
from llds.rollout import RolloutConfig
from llds.runs.eval_result import EvalResult, Scores
from llds.train.config import load_config
from llds.train.trainer import GRPOTrainer

BASE = [*TRAIN_BASE, "rollout.max_turn_tokens=10", "diagnostics.enabled=false", "steps=3"]


def test_eval_metrics_flatten_overall_and_hops() -> None:
    result = EvalResult(
        overall=Scores(4, em=0.5, f1=0.6, sub_em=0.75, valid_searches=1.5, answered=1.0),
        by_source={},
        by_hops={"1": Scores(2, em=1.0), "2": Scores(2, em=0.0), "3": Scores(0)},
        records=[],
    )
    assert eval_metrics(result) == {
        "eval/em": 0.5,
        "eval/f1": 0.6,
        "eval/sub_em": 0.75,
        "eval/valid_searches": 1.5,
        "eval/answered": 1.0,
        "eval/em_1hop": 1.0,
        "eval/em_2hop": 0.0,
    }


def test_is_due_every_k_steps_and_at_the_end() -> None:
    assert [s for s in range(1, 11) if is_due(s, 4, 10)] == [4, 8, 10]
    assert not any(is_due(s, 0, 10) for s in range(1, 11))


def test_evaluator_matches_evaluate_restores_mode_and_draws_no_randomness(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    model = make_tiny_model(world_tokenizer).train()
    rollout = RolloutConfig(
        max_turns=1, max_turn_tokens=10, max_total_tokens=160, max_obs_tokens=30
    )
    examples = small_world.test[:6]
    run = PeriodicEvaluator(
        examples,
        world_retriever,
        world_tokenizer,
        rollout,
        template="Question: {question}\n",
        out_dir=tmp_path,
    )
    rng = torch.get_rng_state()
    got = run(model, step=7)
    assert torch.equal(rng, torch.get_rng_state())
    assert model.training
    ref = evaluate(
        model.eval(),
        world_tokenizer,
        world_retriever,
        examples,
        rollout,
        template="Question: {question}\n",
        progress=False,
    )
    assert got == eval_metrics(ref)
    saved = json.loads((tmp_path / "eval" / "step_000007.json").read_text())
    assert [r["prediction"] for r in saved["records"]] == [r.prediction for r in ref.records]
    assert EvalResult.read(tmp_path / "eval" / "step_000007.json") == ref


def test_trainer_logs_eval_without_changing_training(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    runs = {}
    for name, extra in (("plain", []), ("eval", ["eval_every=2"])):
        cfg = load_config(None, [*BASE, f"run_dir={tmp_path / name}", *extra])
        tr = GRPOTrainer(
            cfg,
            model=make_tiny_model(world_tokenizer),
            tokenizer=world_tokenizer,
            retriever=world_retriever,
            train_examples=small_world.train,
            eval_examples=small_world.test[:4],
            resume=False,
        )
        runs[name] = tr.train()
    plain, with_eval = runs["plain"], runs["eval"]
    assert [("eval/em" in r) for r in with_eval] == [False, True, True]  # step 2 and the last
    assert not any("eval/em" in r for r in plain)
    for a, b in zip(plain, with_eval, strict=True):
        assert a["reward/mean"] == b["reward/mean"]
        assert a["policy/pg_loss"] == pytest.approx(b["policy/pg_loss"], abs=1e-7)
    assert sorted(p.name for p in (tmp_path / "eval" / "eval").iterdir()) == [
        "step_000002.json",
        "step_000003.json",
    ]
    logged = [json.loads(line) for line in (tmp_path / "eval" / "metrics.jsonl").open()]
    assert "eval/em" in logged[1] and 0.0 <= logged[1]["eval/em"] <= 1.0


def test_eval_every_without_eval_data_names_the_key(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    cfg = load_config(None, [*BASE, f"run_dir={tmp_path}", "eval_every=2"])
    with pytest.raises(ConfigError, match=r"eval_every.*data\.eval"):
        GRPOTrainer(
            cfg,
            model=make_tiny_model(world_tokenizer),
            tokenizer=world_tokenizer,
            retriever=world_retriever,
            train_examples=small_world.train,
            resume=False,
        )
