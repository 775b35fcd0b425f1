"""Where LLDS reaches in the update: the share of pushed-up responses that fell, by the index of
their mini-batch (`diagnostics.share_by_minibatch`), and `algo.llds.scope: batch`, which adds
the hinge on a sample of the rest of the rollout batch to every mini-batch after the first."""

from __future__ import annotations

import pytest
import torch

from conftest import TRAIN_BASE as BASE
from conftest import make_tiny_model, tiny_trainer
from llds import metrics as keys
from llds.errors import ConfigError
from llds.monitor.likelihood import share_by_part
from llds.policy.forward import response_log_probs
from llds.train import policy_update
from llds.train import trainer as trainer_mod
from llds.train.config import load_config
from llds.train.policy_update import rest_of_batch_rows
from llds.train.trainer import GRPOTrainer

# ------------------------------------------------------------------ pure parts, by hand


def test_share_by_part_by_hand() -> None:
    mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0], [0, 0, 0]], dtype=torch.bool)
    before = torch.zeros(5, 3)
    after = torch.tensor(
        [
            [-0.5, 0.2, 9.0],  # total -0.3: fell (the 9.0 is off the mask)
            [0.1, 0.1, -0.1],  # +0.1: rose
            [0.0, 0.0, 0.0],  # unchanged: did not fall
            [-1.0, 0.0, 0.0],  # fell, but advantage < 0: not counted
            [-1.0, -1.0, -1.0],  # no model token: not counted
        ]
    )
    adv = torch.tensor([1.0, 0.5, 0.3, -1.0, 1.0])
    got = share_by_part(before, after, mask, adv, [0, 1, 1, 0, 2])
    assert got == {0: (1, 1), 1: (0, 2)}


def test_rest_of_batch_rows_draws_preserving_rows_outside_the_mini_batch() -> None:
    preserving = [True, False, True, True, False, True, True]
    for seed in range(20):
        rows = rest_of_batch_rows(preserving, [2, 3], 2, torch.Generator().manual_seed(seed))
        assert len(rows) == 2 and rows == sorted(rows)
        assert set(rows) <= {0, 5, 6}
    # fewer available than asked: all of them
    assert rest_of_batch_rows(preserving, [0, 2], 10, torch.Generator()) == [3, 5, 6]
    assert rest_of_batch_rows([False, True], [1], 4, torch.Generator()) == []


# ------------------------------------------------------------------ the trainer


@pytest.fixture(autouse=True)
def _fixed_advantages(monkeypatch) -> None:
    """A tiny random model earns no reward: give each group advantages (-1, 0.5, 1), so that
    two of its three rollouts are pushed up and preserved."""
    monkeypatch.setattr(
        trainer_mod,
        "group_advantages",
        lambda r, g, **k: torch.tensor([-1.0, 0.5, 1.0]).repeat(len(r) // 3),
    )


def _trainer(tmp_path, world, tok, retriever, extra: list[str]) -> GRPOTrainer:
    over = [
        "steps=1",
        "seed=3",
        "prompts_per_step=4",
        "optim.mini_batches=2",
        "optim.minibatch_order=rollout",
        "optim.lr=0.05",
        "algo.entropy_coef=0.05",
        *extra,
    ]
    return tiny_trainer(tmp_path, world, tok, retriever, over)


def test_share_by_minibatch_splits_the_pooled_share(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    tr = _trainer(
        tmp_path,
        small_world,
        world_tokenizer,
        world_retriever,
        ["diagnostics.share_by_minibatch=true"],
    )
    row = tr.train()[0]
    # 4 questions x 3 rollouts cut in rollout order into 2 mini-batches of 2 whole groups
    assert tr.updater.minibatch_of_row == [0] * 6 + [1] * 6
    counts = [row[keys.minibatch_share_keys(p)[1]] for p in range(2)]
    assert sum(counts) == row[keys.N_POS] > 0
    fell = sum(row.get(keys.minibatch_share_keys(p)[0], 0.0) * counts[p] for p in range(2))
    assert fell == pytest.approx(row[keys.SHARE_POS_FELL] * row[keys.N_POS])
    # off by default: no such key
    plain = _trainer(tmp_path / "plain", small_world, world_tokenizer, world_retriever, [])
    assert not any(k.startswith(keys.MINIBATCH_SHARE_PREFIX) for k in plain.train()[0])


def _action_penalty(d: list[float], m: list[bool]) -> float:
    """LLDS's action-gated penalty of one response, written out: each maximal run of model
    tokens is an action, open when its summed d > 0; the penalty is the sum of max(0, d) over
    open actions' tokens, over the response's model-token count."""
    total, run = 0.0, []
    for t in [*range(len(d)), None]:
        if t is not None and m[t]:
            run.append(t)
            continue
        if run and sum(d[i] for i in run) > 0:
            total += sum(max(0.0, d[i]) for i in run)
        run = []
    return total / max(1, sum(m))


def test_scope_batch_adds_the_rest_of_the_batch_term(
    tmp_path, small_world, world_tokenizer, world_retriever, monkeypatch
) -> None:
    """The extra term's gradient, accumulated over micro-batches, equals the gradient of
    coef x (mean over the drawn rows of each row's penalty), computed in one piece."""
    drawn: list[list[int]] = []
    grads: list[list[torch.Tensor]] = []
    captured: dict = {}
    real_rows = policy_update.rest_of_batch_rows
    real_rest = policy_update.PolicyUpdate._rest_of_batch_llds

    def recording_rows(*args, **kw):
        out = real_rows(*args, **kw)
        drawn.append(out)
        return out

    def recording_rest(self, inputs, own_rows, gen):
        params = [p for p in self.model.parameters() if p.requires_grad]
        before = [p.grad.clone() if p.grad is not None else torch.zeros_like(p) for p in params]
        out = real_rest(self, inputs, own_rows, gen)
        grads.append([p.grad - b for p, b in zip(params, before, strict=True)])
        captured["inputs"] = inputs
        captured["state"] = {k: v.clone() for k, v in self.model.state_dict().items()}
        return out

    monkeypatch.setattr(policy_update, "rest_of_batch_rows", recording_rows)
    monkeypatch.setattr(policy_update.PolicyUpdate, "_rest_of_batch_llds", recording_rest)
    extra = [
        "algo.llds.enabled=true",
        "algo.llds.coef=0.7",
        "algo.llds.scope=batch",
        "algo.llds.batch_rows=4",
        "optim.micro_batch_tokens=64",  # several micro-batches per draw
    ]
    tr = _trainer(tmp_path, small_world, world_tokenizer, world_retriever, extra)
    row = tr.train()[0]
    # LLDS acts on the second mini-batch only: one draw, from the first mini-batch's rows
    assert len(drawn) == 1 and set(drawn[0]) <= set(range(6))
    rows = drawn[0]
    inputs = captured["inputs"]
    pre = [i for i in range(6) if inputs.adv[i] >= 0 and inputs.loss_mask[i].any()]
    assert len(pre) == 4 and len(rows) == 4 and set(rows) <= set(pre)
    assert row[keys.LLDS_REST_ROWS] == pytest.approx(len(rows) / 2)  # mean over 2 mini-batches
    # the same weights (those of the second mini-batch, before its step) in one piece
    model = make_tiny_model(world_tokenizer, seed=0)
    model.load_state_dict(captured["state"])
    sub = inputs.batch.select(rows)
    lp, _ = response_log_probs(model, sub, temperature=1.0, share_prompts=False)
    w = sub.response_len
    d = inputs.old_logp[rows, :w] - lp
    m = inputs.loss_mask[rows, :w].bool()
    per_row = []
    for i in range(len(rows)):
        d_i = d[i].detach().tolist()
        gate_open = [False] * w
        run: list[int] = []
        for t in [*range(w), None]:
            if t is not None and m[i, t]:
                run.append(t)
                continue
            if run and sum(d_i[j] for j in run) > 0:
                for j in run:
                    gate_open[j] = True
            run = []
        keep = torch.tensor(gate_open) & m[i]
        per_row.append((torch.relu(d[i]) * keep).sum() / m[i].sum())
        assert float(per_row[-1].detach()) == pytest.approx(
            _action_penalty(d_i, m[i].tolist()), abs=1e-6
        )
    want = 0.7 * torch.stack(per_row).mean()
    assert row[keys.LLDS_REST_LOSS] == pytest.approx(float(want) / 2, rel=1e-4)
    want.backward()
    params = [p for p in model.parameters() if p.requires_grad]
    moved = max(float(g.abs().max()) for g in grads[0])
    assert moved > 0
    for got, p in zip(grads[0], params, strict=True):
        assert torch.allclose(got, p.grad, atol=1e-6 * max(1.0, moved))


def test_scope_batch_changes_the_update_and_minibatch_scope_draws_nothing(
    tmp_path, small_world, world_tokenizer, world_retriever
) -> None:
    base = ["algo.llds.enabled=true", "algo.llds.coef=0.7"]
    weights = {}
    for scope in ("minibatch", "batch"):
        tr = _trainer(
            tmp_path / scope,
            small_world,
            world_tokenizer,
            world_retriever,
            [*base, f"algo.llds.scope={scope}"],
        )
        row = tr.train()[0]
        assert (keys.LLDS_REST_ROWS in row) == (scope == "batch")
        weights[scope] = [p.detach().clone() for p in tr.model.parameters()]
    assert any(
        not torch.equal(a, b) for a, b in zip(weights["minibatch"], weights["batch"], strict=True)
    )


def test_scope_is_checked_by_name() -> None:
    with pytest.raises(ConfigError, match=r"algo\.llds\.scope"):
        load_config(None, [*BASE, "run_dir=unused", "algo.llds.scope=everything"])
    with pytest.raises(ConfigError, match=r"algo\.llds\.batch_rows"):
        load_config(None, [*BASE, "run_dir=unused", "algo.llds.batch_rows=0"])
