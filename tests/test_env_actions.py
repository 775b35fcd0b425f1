"""Action parsing and turn cutting for the search protocol."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from llds.env import PROTOCOL_TOKENS, STOP_STRINGS, Action, parse_action


def test_tags_constants():
    assert STOP_STRINGS == ("</search>", "</answer>")
    assert set(PROTOCOL_TOKENS) == {
        "<think>", "</think>", "<search>", "</search>",
        "<answer>", "</answer>", "<information>", "</information>",
    }  # fmt: skip


def test_simple_search():
    text = "<think>need facts</think>\n<search> capital of France </search>"
    assert parse_action(text) == Action("search", "capital of France", len(text))


def test_simple_answer_end_points_after_closing_tag():
    text = "<think>ok</think><answer>Paris</answer> trailing"
    action = parse_action(text)
    assert action == Action("answer", "Paris", len("<think>ok</think><answer>Paris</answer>"))
    assert text[: action.end].endswith("</answer>")


def test_first_closing_tag_decides_between_search_and_answer():
    text = "<answer> x </answer><search> q </search>"
    assert parse_action(text).kind == "answer"
    text = "<search> q </search><answer> x </answer>"
    assert parse_action(text) == Action("search", "q", len("<search> q </search>"))


def test_decided_by_closing_position_not_opening_position():
    # the answer opens first but the search closes first
    text = "<answer> a <search> q </search> b </answer>"
    assert parse_action(text) == Action("search", "q", len("<answer> a <search> q </search>"))


def test_repeated_opening_tag_uses_nearest_one():
    text = "<search> first <search> second </search>"
    assert parse_action(text).content == "second"


def test_repeated_complete_spans_first_wins():
    text = "<search>one</search><search>two</search>"
    assert parse_action(text) == Action("search", "one", len("<search>one</search>"))


def test_unclosed_tags_are_invalid():
    for text in ["<search> half a query", "<answer> Paris", "<think> thinking", ""]:
        assert parse_action(text) == Action("invalid", "", len(text))


def test_orphan_closing_tag_is_skipped():
    text = "oops </search> then <answer> Rome </answer>"
    assert parse_action(text) == Action("answer", "Rome", len(text))
    assert parse_action("oops </answer>") == Action("invalid", "", len("oops </answer>"))


def test_whitespace_is_stripped_and_malformed_tags_are_not_tags():
    assert parse_action("<search>\n\t who wrote Faust?  \n</search>").content == "who wrote Faust?"
    assert parse_action("< search> q </ search>").kind == "invalid"
    assert parse_action("<SEARCH> q </SEARCH>").kind == "invalid"


def test_empty_search_is_invalid_even_if_an_answer_follows():
    text = "<search>   </search><answer> x </answer>"
    assert parse_action(text) == Action("invalid", "", len(text))
    assert parse_action("<search></search>").kind == "invalid"


def test_empty_answer_is_an_answer():
    assert parse_action("<answer>  </answer>") == Action("answer", "", len("<answer>  </answer>"))


def test_unicode_content_and_indices():
    text = "<think>日本</think><search> 東京の人口 </search>"
    action = parse_action(text)
    assert action == Action("search", "東京の人口", len(text))
    text = "ünïcødé 🙂 <answer> Zürich </answer>"
    assert parse_action(text) == Action("answer", "Zürich", len(text))


def first_stop_index(text: str) -> int | None:
    """Where the engine cuts a turn: just after the first stop string (an independent check)."""
    ends = [text.find(s) + len(s) for s in STOP_STRINGS if s in text]
    return min(ends) if ends else None


def test_first_stop_index():
    assert first_stop_index("no stop here <search> q") is None
    text = "<search> q </search> more </answer>"
    assert first_stop_index(text) == len("<search> q </search>")
    text = "<answer> a </answer><search> q </search>"
    assert first_stop_index(text) == len("<answer> a </answer>")


_pieces = st.sampled_from(
    ["<search>", "</search>", "<answer>", "</answer>", "<think>", "</think>", " ", "q", "é", "\n"]
)


@given(st.lists(st.one_of(_pieces, st.text(max_size=5)), max_size=12).map("".join))
def test_parse_action_never_raises_and_is_consistent(text):
    action = parse_action(text)
    assert action.kind in ("search", "answer", "invalid")
    assert 0 <= action.end <= len(text)
    if action.kind == "invalid":
        assert action.end == len(text) and action.content == ""
    else:
        # the deciding closing tag is a stop string, never before the first one
        assert action.end >= first_stop_index(text)
        assert action.content == action.content.strip()
        assert parse_action(text[: action.end]) == action
    # the engine cuts the turn at the first stop string: the cut turn is the same action or invalid
    cut = first_stop_index(text)
    if cut is not None:
        assert parse_action(text[:cut]) in (action, Action("invalid", "", cut))
    if action.kind == "search":
        assert action.content


@given(st.text(max_size=40))
def test_parse_action_on_arbitrary_text(text):
    assert isinstance(parse_action(text), Action)
