"""The native trainer's stabilizers: importance weights for a sampler that is not the trained
policy (`algo.rollout_correction`), and SimpleTIR's void-turn filter (`algo.filter_void_turns`)."""

from __future__ import annotations

import pytest
import torch

from conftest import TRAIN_BASE, make_tiny_model
from llds.config.loader import to_dict
from llds.errors import ConfigError
from llds.rollout.batch import Episode, RolloutBatch
from llds.train import policy_update as pu
from llds.train.config import TrainConfig, load_config
from llds.train.resume import resume_changes
from llds.train.trainer import GRPOTrainer


def _run(tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, extra):
    """One tiny step; returns its metrics row and every micro-batch's objective arguments."""
    calls: list[dict] = []
    real = pu.grpo_objective

    def spy(inputs, algo):
        calls.append(
            {"loss_mask": inputs.loss_mask.detach().cpu(), "is_weights": inputs.is_weights}
        )
        return real(inputs, algo)

    monkeypatch.setattr(pu, "grpo_objective", spy)
    overrides = [*TRAIN_BASE, f"run_dir={tmp_path / 'run'}", "steps=1", "algo.llds.coef=0"]
    tr = GRPOTrainer(
        load_config(None, [*overrides, *extra]),
        model=make_tiny_model(world_tokenizer, seed=1),
        tokenizer=world_tokenizer,
        retriever=world_retriever,
        train_examples=small_world.train,
    )
    (row,) = tr.train()
    return row, calls


def test_bf16_sampler_gets_truncated_weights(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    captured = []
    real = pu.importance_weights

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        captured.append((out, args[2].bool().cpu()))
        return out

    monkeypatch.setattr(pu, "importance_weights", spy)
    extra = ["rollout.dtype=bfloat16", "algo.rollout_correction.mode=tis"]
    extra += ["algo.rollout_correction.cap=1.01"]
    row, calls = _run(tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, extra)
    ((weights, clipped), mask) = captured[0]
    on = weights.cpu()[mask]
    assert (on != 1.0).any() and on.max() <= 1.01 + 1e-6 and on.min() > 0
    assert row["mismatch/is_weight_mean"] == pytest.approx(float(on.double().mean()))
    assert row["mismatch/is_weight_mean"] != 1.0
    assert row["mismatch/is_clipped_frac"] == pytest.approx(
        float(clipped.cpu()[mask].double().mean())
    )
    assert all(c["is_weights"] is not None for c in calls)


@pytest.mark.parametrize("mode", ["tis", "mis", "reject"])
def test_a_correction_without_a_sampling_copy_is_refused_by_name(mode):
    """Without rollout.dtype the policy samples itself: every weight would be exactly 1, a
    correction that silently does nothing, so the config refuses it."""
    with pytest.raises(ConfigError, match=r"algo\.rollout_correction\.mode: .*rollout\.dtype"):
        load_config(None, [f"algo.rollout_correction.mode={mode}", *TRAIN_BASE])
    cfg = load_config(
        None, [f"algo.rollout_correction.mode={mode}", "rollout.dtype=bfloat16", *TRAIN_BASE]
    )
    assert cfg.algo.rollout_correction.mode == mode


def test_correction_off_logs_nothing(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    extra = ["rollout.dtype=bfloat16"]
    row, calls = _run(tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, extra)
    assert "mismatch/is_weight_mean" not in row and pu.FILTERED_SHARE not in row
    assert all(c["is_weights"] is None for c in calls)


def _episode(texts: list[str]) -> Episode:
    ep = Episode(prompt_ids=[1, 2], example_id="q", group_id="g", golds=("a",))
    for i, text in enumerate(texts):
        ep.append([10 + i, 11 + i], action=True, logprobs=[-1.0, -1.0], entropies=[1.0, 1.0])
        ep.action_texts.append(text)
        if i + 1 < len(texts):
            ep.append([5], action=False)
    return ep


def test_void_turn_filter_on_a_hand_built_batch():
    """Rollout 1 has a turn with an unclosed search, rollout 3 ends on a void last turn (which
    `Episode.num_invalid` would not count): both leave the loss; the others keep their mask."""
    episodes = [
        _episode(["<search>paris</search>", "<answer>x</answer>"]),
        _episode(["<search>oops", "<answer>x</answer>"]),
        _episode(["<answer>y</answer>"]),
        _episode(["<search>rome</search>", "hmm"]),
    ]
    batch = RolloutBatch.from_episodes(episodes, pad_id=0)
    assert pu.void_turn_keep(batch).tolist() == [True, False, True, False]
    mask, share = pu.step_loss_mask(batch, filter_void=True)
    assert share == 0.5
    assert torch.equal(mask[[0, 2]], batch.loss_mask[[0, 2]])
    assert not mask[[1, 3]].any() and batch.loss_mask[[1, 3]].any()
    same, none = pu.step_loss_mask(batch, filter_void=False)
    assert same is batch.loss_mask and none is None


def test_filtered_rollouts_reach_no_micro_batch(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    """An untrained model's turns are all void, so the filter's verdict is replaced by a mixed
    one: every other rollout kept. Only the kept rows' tokens reach the objective."""
    kept = []

    def every_other(batch):
        keep = torch.arange(len(batch)) % 2 == 0
        kept.append((keep, batch.loss_mask.clone()))
        return keep

    monkeypatch.setattr(pu, "void_turn_keep", every_other)
    extra = ["algo.filter_void_turns=true"]
    row, calls = _run(tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch, extra)
    ((keep, full),) = kept
    assert row[pu.FILTERED_SHARE] == 0.5
    passed = sum(int(c["loss_mask"].sum()) for c in calls)  # one epoch: each row once
    assert passed == int(full[keep].sum()) > 0
    assert passed < int(full.sum())


def test_resume_from_a_config_without_the_new_keys_is_no_change():
    cfg = TrainConfig()
    old = to_dict(cfg)
    del old["algo"]["rollout_correction"], old["algo"]["filter_void_turns"]
    free, asked = resume_changes(old, cfg, TrainConfig())
    assert free == [] and asked == []
    copy = ["rollout.dtype=bfloat16", *TRAIN_BASE]
    turned_on = load_config(None, ["algo.rollout_correction.mode=tis", *copy])
    _, asked = resume_changes(to_dict(load_config(None, copy)), turned_on, TrainConfig())
    assert [key for key, _, _ in asked] == ["algo.rollout_correction.mode"]


def test_resume_may_change_how_rollouts_decode_without_asking():
    before = ["rollout.compile=false", "rollout.cache=dynamic", *TRAIN_BASE]
    saved = to_dict(load_config(None, before))
    requested = load_config(None, ["rollout.compile=auto", "rollout.cache=auto", *TRAIN_BASE])
    requested.steps += 1
    free, asked = resume_changes(saved, requested, TrainConfig())
    assert sorted(key for key, _, _ in free) == ["rollout.cache", "rollout.compile", "steps"]
    assert asked == []


def test_resume_may_change_the_micro_batch_budgets_without_asking():
    """They change float rounding only (gradients and log-probs add up to the same values); a
    checkpoint written before `logprob_micro_batch_tokens` existed counts it as its default."""
    saved = to_dict(load_config(None, [*TRAIN_BASE, "optim.micro_batch_tokens=16384"]))
    del saved["optim"]["logprob_micro_batch_tokens"]
    unchanged = load_config(None, [*TRAIN_BASE, "optim.micro_batch_tokens=16384"])
    assert resume_changes(saved, unchanged, TrainConfig()) == ([], [])
    requested = load_config(
        None,
        [
            *TRAIN_BASE,
            "optim.micro_batch_tokens=4096",
            "optim.logprob_micro_batch_tokens=16384",
            "optim.lr=0.5",
        ],
    )
    free, asked = resume_changes(saved, requested, TrainConfig())
    assert sorted(key for key, _, _ in free) == [
        "optim.logprob_micro_batch_tokens",
        "optim.micro_batch_tokens",
    ]
    assert [key for key, _, _ in asked] == ["optim.lr"]
