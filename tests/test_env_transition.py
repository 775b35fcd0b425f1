"""The Search-R1 transition as a pure function: every outcome by hand, without a model."""

from __future__ import annotations

from llds.env.transition import step


def test_an_answer_ends_the_rollout_even_on_the_last_token_of_room():
    t = step("<answer> Paris </answer>", used_tokens=100, max_total_tokens=100, final_turn=False)
    assert (t.done, t.stop_reason, t.context_capped, t.room) == (True, "answer", False, 0)
    assert t.action.content == "Paris"


def test_a_search_goes_on_with_the_room_left():
    t = step("x <search> capital </search>", used_tokens=60, max_total_tokens=100, final_turn=False)
    assert (t.done, t.stop_reason, t.room) == (False, None, 40)
    assert (t.action.kind, t.action.content) == ("search", "capital")


def test_an_invalid_turn_goes_on():
    t = step("just thinking", used_tokens=10, max_total_tokens=100, final_turn=False)
    assert (t.done, t.action.kind, t.room) == (False, "invalid", 90)


def test_the_last_turn_ends_with_turn_limit():
    t = step("<search> q </search>", used_tokens=10, max_total_tokens=100, final_turn=True)
    assert (t.done, t.stop_reason, t.context_capped) == (True, "turn_limit", False)


def test_a_full_context_wins_over_the_turn_limit():
    for final in (False, True):
        t = step("<search> q </search>", used_tokens=100, max_total_tokens=100, final_turn=final)
        assert (t.done, t.stop_reason, t.context_capped) == (True, "context_limit", True)
