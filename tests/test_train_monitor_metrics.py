"""The native trainer logs the engine-agnostic monitor's keys: sampler-vs-trained mismatch when a
bf16 copy samples, turn statistics always, and the pooled LLD shares of the post-update pass."""

from __future__ import annotations

import math

import pytest
import torch

from conftest import TRAIN_BASE, make_tiny_model
from llds.train import diagnostics as diagnostics_mod
from llds.train import trainer as trainer_mod
from llds.train.config import load_config
from llds.train.diagnostics import Diagnostics
from llds.train.trainer import GRPOTrainer

MISMATCH = [
    "mismatch/k3_kl",
    "mismatch/abs_logp_diff_max",
    "mismatch/abs_logp_diff_mean",
    "mismatch/chi2_token",
    "mismatch/is_ess",
]
TURNS = ["turns/per_rollout", "turns/void_share", "turns/valid_search_share"]
SHARES = [
    "lld/share_pos_fell",
    "lld/share_pos_fell_acc_lo",
    "lld/share_pos_fell_acc_hi",
    "lld/share_pos_fell_first_action",
    "lld/share_pos_fell_later_actions",
    "lld/n_pos",
    "lld/n_pos_acc_lo",
    "lld/n_pos_acc_hi",
    "lld/n_pos_later_actions",
]


def run(tmp_path, world, tok, retriever, monkeypatch, *extra):
    """Two steps where every group has positive-advantage responses and, of the two groups per
    step, one counts as mostly correct (the tiny model is rarely right by itself)."""
    monkeypatch.setattr(
        trainer_mod,
        "group_advantages",
        lambda r, g, **k: torch.tensor([-1.0, 0.5, 1.0]).repeat(len(r) // 3),
    )
    monkeypatch.setattr(
        diagnostics_mod,
        "group_correct_share",
        lambda groups, rewards: {g: float(i % 2) for i, g in enumerate(dict.fromkeys(groups))},
    )
    overrides = [*TRAIN_BASE, f"run_dir={tmp_path}", "steps=2", "optim.lr=1e-2", *extra]
    tr = GRPOTrainer(
        load_config(None, overrides),
        model=make_tiny_model(tok, seed=1),
        tokenizer=tok,
        retriever=retriever,
        train_examples=world.train,
    )
    return tr.train()


def test_bf16_sampling_copy_logs_every_monitor_key(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    rows = run(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        monkeypatch,
        "rollout.dtype=bfloat16",
        "rollout.attn_implementation=eager",
    )
    for row in rows:
        missing = [k for k in MISMATCH + TURNS + SHARES if k not in row]
        assert not missing, missing
        assert all(math.isfinite(row[k]) for k in MISMATCH + TURNS + SHARES)
        # bf16 sampling vs the float32 policy: a real, small mismatch
        assert row["mismatch/k3_kl"] > 0 and row["mismatch/abs_logp_diff_max"] > 0
        assert row["mismatch/abs_logp_diff_max"] >= row["mismatch/abs_logp_diff_mean"]
        assert 0 < row["mismatch/is_ess"] <= 1
        # the same turns as the rollout's own statistics
        assert row["turns/per_rollout"] == pytest.approx(row["rollout/turns"])
        assert row["turns/valid_search_share"] == pytest.approx(
            row["rollout/valid_searches"] / row["rollout/turns"]
        )
        # every rollout with a continued invalid turn has a void turn
        assert row["turns/void_share"] >= (row["rollout/invalid_actions"] > 0) / 6
        # the shares are over the positive responses the displacement pass counts
        assert row["lld/n_pos"] == row["lld/pos_responses"] == 4  # 2 of 3 in each group
        assert row["lld/n_pos_acc_lo"] + row["lld/n_pos_acc_hi"] == row["lld/n_pos"]
        # fell (< 0) never exceeds fell-or-flat (<= 0)
        assert row["lld/share_pos_fell"] <= row["lld/frac_pos_fell"] + 1e-9
        pooled = (
            row["lld/share_pos_fell_acc_lo"] * row["lld/n_pos_acc_lo"]
            + row["lld/share_pos_fell_acc_hi"] * row["lld/n_pos_acc_hi"]
        ) / row["lld/n_pos"]
        assert row["lld/share_pos_fell"] == pytest.approx(pooled)


def test_without_a_sampling_copy_there_is_no_mismatch_to_log(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    """The sampler is the trained policy: no `mismatch/*` keys (not a made-up zero); the turn
    and share keys are still there."""
    rows = run(tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch)
    for row in rows:
        assert not [k for k in row if k.startswith("mismatch/")]
        assert all(k in row for k in [*TURNS, "lld/share_pos_fell", "lld/n_pos"])


def test_shares_pool_over_processes_weighted_by_their_counts():
    """Two ranks' shares through the trainer's all-reduce (simulated) equal pooling by hand:
    3 of 4 and 0 of 2 positive responses fell, so 3 of 6; rank b has no low-accuracy ones."""
    from types import SimpleNamespace

    a = {
        "lld/n_pos": 4.0,
        "lld/n_pos_acc_lo": 2.0,
        "lld/n_pos_acc_hi": 2.0,
        "lld/n_pos_later_actions": 1.0,
        "lld/share_pos_fell": 0.75,
        "lld/share_pos_fell_acc_lo": 0.5,
        "lld/share_pos_fell_acc_hi": 1.0,
        "lld/share_pos_fell_first_action": 0.25,
        "lld/share_pos_fell_later_actions": 1.0,
    }
    b = {
        "lld/n_pos": 2.0,
        "lld/n_pos_acc_lo": 0.0,
        "lld/n_pos_acc_hi": 2.0,
        "lld/n_pos_later_actions": 0.0,
        "lld/share_pos_fell": 0.0,
        "lld/share_pos_fell_acc_hi": 0.0,
        "lld/share_pos_fell_first_action": 0.5,
    }
    sent: list[torch.Tensor] = []

    def record(t):
        sent.append(t.double())
        return t.double()

    pool = Diagnostics._pooled_over_processes
    pool(SimpleNamespace(dist=SimpleNamespace(enabled=True, sum=record)), b)
    both = SimpleNamespace(dist=SimpleNamespace(enabled=True, sum=lambda t: t.double() + sent[0]))
    got = pool(both, a)
    assert got["lld/n_pos"] == 6 and got["lld/share_pos_fell"] == pytest.approx(3 / 6)
    assert got["lld/n_pos_acc_lo"] == 2 and got["lld/share_pos_fell_acc_lo"] == pytest.approx(0.5)
    assert got["lld/share_pos_fell_acc_hi"] == pytest.approx(2 / 4)
    assert got["lld/share_pos_fell_first_action"] == pytest.approx((1 + 1) / 6)
    assert got["lld/share_pos_fell_later_actions"] == pytest.approx(1.0)
    assert len(got) == 9
