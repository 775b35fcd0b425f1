"""Turn statistics: per-rollout turns, void-turn share, valid searches per turn."""

from __future__ import annotations

import pytest

from llds.monitor.turns import turn_metrics, void_turn_count


def test_values_by_hand():
    m = turn_metrics(turns=[1, 3, 2], void_turns=[0, 2, 0], valid_searches=[1, 1, 2])
    assert m["turns/per_rollout"] == pytest.approx(2.0)
    assert m["turns/void_share"] == pytest.approx(1 / 3)
    assert m["turns/valid_search_share"] == pytest.approx(4 / 6)


def test_no_rollouts_and_no_turns():
    assert turn_metrics([], [], []) == {}
    m = turn_metrics([0, 0], [0, 0], [0, 0])
    assert m == {"turns/per_rollout": 0.0, "turns/void_share": 0.0}


def test_counts_must_line_up():
    with pytest.raises(ValueError, match="one count per rollout"):
        turn_metrics([1, 2], [0], [1, 1])


def test_void_turns_are_those_with_neither_search_nor_answer():
    texts = [
        "<search>capital of France</search>",
        "I think so.",  # no span: void
        "<search>   </search>",  # empty query: invalid, void
        "<answer>Paris</answer>",
    ]
    assert void_turn_count(texts) == 2
    # the last turn counts too, unlike Episode.num_invalid (which only counts continued turns)
    assert void_turn_count(["<search>q</search>", "out of turns"]) == 1
    assert void_turn_count([]) == 0
