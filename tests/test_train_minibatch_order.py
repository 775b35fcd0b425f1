"""`optim.minibatch_order`: mini-batches of whole groups in rollout order (the authors' veRL)
against rows shuffled across the batch (the earlier behaviour, still the default)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch
from safetensors.torch import load_file

from conftest import TRAIN_BASE as BASE
from conftest import make_tiny_model, tiny_trainer, write_run_inputs
from llds.errors import ConfigError
from llds.train import policy_update
from llds.train.config import load_config
from llds.train.global_batch import mini_batches


def _rollout_cut(n_global: int, parts: int, group: int, rows: list[int] | None = None):
    rows = list(range(n_global)) if rows is None else rows
    gen = torch.Generator().manual_seed(0)
    return mini_batches(gen, rows, n_global, parts, "rollout", group)


# ------------------------------------------------------------------ the cut, by hand


def test_rollout_order_cuts_whole_groups_in_order() -> None:
    # 4 questions x 3 rollouts into 2 mini-batches: questions 0-1, then 2-3
    assert _rollout_cut(12, 2, 3) == [[0, 1, 2, 3, 4, 5], [6, 7, 8, 9, 10, 11]]
    # 5 questions x 2 rollouts into 3: sizes 2, 2, 1 groups (the first ones one group larger)
    assert _rollout_cut(10, 3, 2) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    # as many mini-batches as questions: one group each
    assert _rollout_cut(6, 3, 2) == [[0, 1], [2, 3], [4, 5]]


def test_rollout_order_draws_nothing_and_repeats_each_epoch() -> None:
    gen = torch.Generator().manual_seed(3)
    state = gen.get_state()
    first = mini_batches(gen, list(range(12)), 12, 2, "rollout", 3)
    second = mini_batches(gen, list(range(12)), 12, 2, "rollout", 3)
    assert first == second
    assert torch.equal(gen.get_state(), state)


def test_shuffled_order_is_the_earlier_permutation() -> None:
    """The default is the old cut: a permutation from the generator, split in near-equal parts
    (groups ignored)."""
    perm = torch.randperm(12, generator=torch.Generator().manual_seed(5)).tolist()
    want = [perm[0:3], perm[3:6], perm[6:9], perm[9:12]]
    gen = torch.Generator().manual_seed(5)
    assert mini_batches(gen, list(range(12)), 12, 4) == want
    gen = torch.Generator().manual_seed(5)
    assert mini_batches(gen, list(range(12)), 12, 4, "shuffled", 3) == want


def test_rollout_order_on_two_ranks_covers_the_single_process_cut() -> None:
    """Rank r holds questions r, r+2, ... (round robin, as the trainer shards them): each rank
    takes the same number of mini-batches, holds whole groups only, and together the ranks'
    mini-batches are the single-process ones."""
    g, questions, parts = 3, 5, 2
    one = _rollout_cut(g * questions, parts, g)
    assert one == [list(range(0, 9)), list(range(9, 15))]
    got: list[set[int]] = [set() for _ in one]
    for rank in (0, 1):
        rows = [j * g + i for j in range(rank, questions, 2) for i in range(g)]
        local = _rollout_cut(g * questions, parts, g, rows)
        assert len(local) == parts
        for i, part in enumerate(local):
            gids = [rows[r] for r in part]
            assert gids == sorted(gids)  # rollout order
            for q in {gid // g for gid in gids}:  # whole groups
                assert {q * g + i for i in range(g)} <= set(gids)
            got[i] |= set(gids)
    assert got == [set(p) for p in one]


def test_a_rank_may_hold_none_of_a_mini_batch() -> None:
    # 2 questions x 2 rollouts, 2 mini-batches, 2 ranks: rank 1 holds question 1 only
    assert _rollout_cut(4, 2, 2, [2, 3]) == [[], [0, 1]]


# ------------------------------------------------------------------ config


def test_more_mini_batches_than_groups_is_refused_by_name() -> None:
    over = [*BASE, "run_dir=unused", "optim.minibatch_order=rollout", "optim.mini_batches=3"]
    with pytest.raises(ConfigError, match=r"optim\.mini_batches: 3 > 2 prompts per step"):
        load_config(None, over)
    # the same split of rows is fine for the shuffled order (3 <= 6 rollouts)
    assert load_config(None, [*over[:-2], "optim.mini_batches=3"]).optim.mini_batches == 3
    assert load_config(None, [*BASE, "run_dir=unused"]).optim.minibatch_order == "shuffled"
    with pytest.raises(ConfigError, match=r"optim\.minibatch_order"):
        load_config(None, [*BASE, "run_dir=unused", "optim.minibatch_order=random"])


def test_presets_choose_their_order() -> None:
    def order(name: str) -> str:
        return load_config(name, ["run_dir=unused"]).optim.minibatch_order

    assert order("stabilized") == "rollout"
    assert order("search-r1-qwen2.5-3b") == "rollout"
    assert order("search-r1-qwen2.5-7b") == "rollout"
    assert order("organism") == "shuffled"


# ------------------------------------------------------------------ the trainer


def _train(tmp_path, world, tok, retriever, extra, monkeypatch):
    """One step of the tiny run; returns its weights and each optimizer step's global rows."""
    cuts: list[list[int]] = []

    def recording(gen, global_rows, n_global, parts, *rest):
        out = mini_batches(gen, global_rows, n_global, parts, *rest)
        cuts.extend([global_rows[r] for r in part] for part in out)
        return out

    monkeypatch.setattr(policy_update, "mini_batches", recording)
    tr = tiny_trainer(tmp_path, world, tok, retriever, ["steps=1", "seed=1", *extra])
    rows = tr.train()
    weights = [p.detach().clone() for p in tr.model.parameters()]
    return weights, cuts, rows[0]


def test_rollout_order_trains_and_differs_from_shuffled(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
):
    extra = ["algo.entropy_coef=0.05", "optim.lr=0.05"]  # a gradient even if every reward is 0
    runs = {
        name: _train(tmp_path / name, small_world, world_tokenizer, world_retriever, x, monkeypatch)
        for name, x in {
            "default": extra,
            "shuffled": [*extra, "optim.minibatch_order=shuffled"],
            "rollout": [*extra, "optim.minibatch_order=rollout"],
        }.items()
    }
    init = [p.detach() for p in make_tiny_model(world_tokenizer, seed=0).parameters()]
    # 2 questions x 3 rollouts, 2 mini-batches: one whole group each, in rollout order
    assert runs["rollout"][1] == [[0, 1, 2], [3, 4, 5]]
    assert runs["rollout"][2]["optim/updates"] == 2
    assert any(not torch.equal(a, b) for a, b in zip(init, runs["rollout"][0], strict=True))
    # the shuffled cut of this seed splits a group, so the two orders take different steps
    shuffled_cut = runs["shuffled"][1]
    assert sorted(map(sorted, shuffled_cut)) != [[0, 1, 2], [3, 4, 5]]
    assert any(
        not torch.equal(a, b) for a, b in zip(runs["shuffled"][0], runs["rollout"][0], strict=True)
    )
    # the default is the shuffled order, bit for bit
    assert runs["default"][1] == shuffled_cut
    for a, b in zip(runs["default"][0], runs["shuffled"][0], strict=True):
        assert torch.equal(a, b)
    assert runs["default"][2]["policy/grad_norm"] == runs["shuffled"][2]["policy/grad_norm"]


@pytest.mark.slow
def test_two_processes_equal_one_in_rollout_order(tmp_path, small_world, world_tokenizer):
    """Rank 0 holds questions 0 and 2, rank 1 questions 1 and 3: with 3 mini-batches of whole
    groups (questions 0-1, 2, 3), each rank holds none of one mini-batch, and the update still
    equals one process's."""
    cfg = write_run_inputs(
        tmp_path,
        small_world,
        world_tokenizer,
        steps=1,
        save_every=1,
        seed=5,
        prompts_per_step=4,
        algo={"kl_coef": 0.01, "entropy_coef": 0.05},
        optim={"lr": 0.05, "eps": 1.0, "mini_batches": 3, "minibatch_order": "rollout"},
    )
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    train = ["-m", "llds.cli", "train", "--config", str(cfg)]
    one = [sys.executable, *train, f"run_dir={tmp_path / 'one'}"]
    subprocess.run(one, check=True, env=env, capture_output=True, timeout=600)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    two = [*torchrun, "--nproc_per_node", "2", *train, f"run_dir={tmp_path / 'two'}"]
    subprocess.run(two, check=True, env=env, capture_output=True, timeout=600)
    weights = "checkpoints/step_000001/model/model.safetensors"
    init = load_file(tmp_path / "model" / "model.safetensors")
    w1 = load_file(tmp_path / "one" / weights)
    w2 = load_file(tmp_path / "two" / weights)
    moved = max((w1[k] - init[k]).abs().max().item() for k in w1)
    assert moved > 1e-4
    for k in w1:
        assert torch.allclose(w1[k], w2[k], atol=1e-6 * max(1.0, moved * 1e3)), k
