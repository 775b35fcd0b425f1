"""Turning one model turn into an action: search, answer, or invalid."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from llds.env.tags import ANSWER_CLOSE, ANSWER_OPEN, SEARCH_CLOSE, SEARCH_OPEN, STOP_STRINGS

ActionKind = Literal["search", "answer", "invalid"]

_OPENER = {SEARCH_CLOSE: SEARCH_OPEN, ANSWER_CLOSE: ANSWER_OPEN}
_KIND: dict[str, ActionKind] = {SEARCH_CLOSE: "search", ANSWER_CLOSE: "answer"}


@dataclass(frozen=True)
class Action:
    """What the environment does with a turn.

    `content` is the query (search) or the answer text (answer), stripped; "" when invalid.
    `end` is the character index just after the deciding closing tag, or `len(text)` when invalid,
    so `text[:end]` is the part of the turn the environment acted on.
    """

    kind: ActionKind
    content: str
    end: int


def _closing_tags_in_order(text: str) -> list[tuple[int, str]]:
    """(position, tag) of every `</search>` and `</answer>`, left to right."""
    found: list[tuple[int, str]] = []
    for close in STOP_STRINGS:
        start = text.find(close)
        while start >= 0:
            found.append((start, close))
            start = text.find(close, start + len(close))
    found.sort()
    return found


def parse_action(text: str) -> Action:
    """Decide the action of one model turn. Never raises.

    Rules (tags are matched exactly and case-sensitively, as the stop strings are):

    * The complete `<search>...</search>` or `<answer>...</answer>` span whose CLOSING tag comes
      first decides. A span's opening tag is the nearest same-kind opening tag before its closing
      tag, so `<search> a <search> b </search>` searches for "b" and
      `<answer> <search> q </search> </answer>` is a search for "q" (generation stops there).
    * A closing tag with no same-kind opening tag before it is not a span and is skipped;
      an opening tag that is never closed is ignored.
    * Whitespace around the content is stripped (`<search>  q \\n</search>` searches for "q");
      variants such as `< search>` or `<SEARCH>` are not tags.
    * A search whose query is empty after stripping is invalid (nothing to search for), and it
      still decides: the turn is invalid even if a later span follows.
    * An empty answer (`<answer> </answer>`) is an answer: it ends the rollout and scores 0.
    * No complete span at all: invalid.
    """
    for close_at, close in _closing_tags_in_order(text):
        open_at = text.rfind(_OPENER[close], 0, close_at)
        if open_at < 0:
            continue
        content = text[open_at + len(_OPENER[close]) : close_at].strip()
        kind = _KIND[close]
        if kind == "search" and not content:
            return Action("invalid", "", len(text))
        return Action(kind, content, close_at + len(close))
    return Action("invalid", "", len(text))
