"""The rollout batch's metrics against values counted by hand on a 4-rollout batch."""

from __future__ import annotations

import functools
from types import SimpleNamespace

import pytest
import torch

from llds.monitor.rollout_metrics import rollout_metrics
from llds.rollout import RolloutBatch

approx = functools.partial(pytest.approx, rel=1e-6)  # the metrics are float32 means


def _episode(group: str, em: float, searches: int, text: str, first_doc: str | None, **kw):
    base = dict(
        group_id=group,
        em=em,
        f1=em,
        sub_em=em,
        num_valid_searches=searches,
        num_turns=searches + 1,
        num_invalid=0,
        stop_reason="answer",
        context_capped=False,
        valid_format=True,
        action_texts=[text],
        retrieved_ids=[] if first_doc is None else [[first_doc]],
    )
    base.update(kw)
    return SimpleNamespace(**base)


def test_rollout_metrics_match_a_hand_count() -> None:
    # group a: one right, one wrong (mixed); group b: both right
    episodes = [
        _episode("a", 1.0, 1, "<search> x </search>", "d1"),
        _episode("a", 0.0, 2, "<answer> Kulban)))))) </answer>", "d1", num_invalid=1),
        _episode("b", 1.0, 1, "<answer> y </answer>", "d2", context_capped=True),
        _episode("b", 1.0, 0, "<answer> y </answer>", None, stop_reason="max_turns"),
    ]
    loss_mask = torch.tensor([[1, 1, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]])
    logp = torch.tensor([[-1.0, -3.0, 0.0], [-2.0, -2.0, -5.0], [-4.0, 0.0, 0.0], [-1.0, -1.0, 0]])
    entropy = torch.tensor([[0.5, 1.5, 9.0], [1.0, 1.0, 1.0], [2.0, 9.0, 9.0], [0.0, 0.0, 9.0]])
    batch = RolloutBatch(
        input_ids=torch.zeros(4, 5, dtype=torch.long),
        attention_mask=torch.ones(4, 5, dtype=torch.long),
        prompt_len=2,
        loss_mask=loss_mask,
        answer_mask=torch.zeros(4, 3),
        action_index=torch.tensor([[0, 0, -1], [0, 1, 1], [0, -1, -1], [0, 0, -1]]),
        rewards=torch.tensor([1.0, 0.0, 1.0, 1.0]),
        group_ids=[e.group_id for e in episodes],
        episodes=episodes,
    )
    adv = torch.tensor([0.7, -0.7, 0.0, 0.0])
    m = rollout_metrics(batch, adv, logp, entropy, sum_over_processes=lambda c: 3.0 * c)

    assert m["reward/mean"] == 0.75 and m["reward/em"] == 0.75
    assert m["rollout/valid_searches"] == 1.0  # (1 + 2 + 1 + 0) / 4
    assert m["rollout/turns"] == 2.0 and m["rollout/invalid_actions"] == 0.25
    assert m["rollout/response_tokens"] == 2.0  # 8 written tokens / 4 rollouts
    assert m["rollout/answered_frac"] == 0.75
    assert m["rollout/context_capped"] == 3.0  # one here, as if 3 processes each had one
    assert m["rollout/punct_run_frac"] == 0.25
    assert m["groups/mixed_frac"] == 0.5 and m["groups/all_correct_frac"] == 0.5
    # entropy over the 8 written tokens: (0.5 + 1.5 + 1 + 1 + 1 + 2 + 0 + 0) / 8
    assert m["policy/entropy"] == approx(7.0 / 8)
    assert m["advantage/abs_mean"] == approx(0.35)
    # per-row mean log-prob: right rows -2, -4, -1; wrong row -3
    assert m["lld/logp_correct"] == approx(-7.0 / 3)
    assert m["lld/logp_incorrect"] == approx(-3.0)
    # first action's tokens: -1, -3, -2, -4, -1, -1; later: -2, -5
    assert m["lld/logp_first_action"] == approx(-2.0)
    assert m["lld/logp_later_actions"] == approx(-3.5)
    assert m["lld/nll_by_searches/1"] == approx(3.0)  # rows 0 and 2: (2 + 4) / 2
    assert m["lld/nll_by_searches/2"] == approx(3.0) and m["lld/nll_by_searches/0"] == 1.0
    # the one wrong rollout's first search retrieved what a right one of its group did
    assert m["lld/shared_first_search_wrong_frac"] == 1.0
