"""Locate the final answer action's `<answer> ... </answer>` span in token space (for LLDS-MA's
answer weights). Only the last model turn is read, and only when it is an answer action, the same
rule `llds.env.rewards.final_answer` scores."""

from __future__ import annotations

from collections.abc import Sequence

from llds.env.actions import parse_action
from llds.env.tags import ANSWER_CLOSE, ANSWER_OPEN
from llds.rollout.batch import Episode


def _first_token_reaching(tokenizer, ids: Sequence[int], char_pos: int) -> int:
    """Smallest k such that decode(ids[:k]) is longer than `char_pos` (binary search)."""
    lo, hi = 0, len(ids)
    while lo < hi:
        mid = (lo + hi) // 2
        if len(tokenizer.decode(list(ids[: mid + 1]), skip_special_tokens=False)) > char_pos:
            hi = mid
        else:
            lo = mid + 1
    return lo


def answer_token_span(tokenizer, ids: Sequence[int]) -> tuple[int, int] | None:
    """Token range `[start, end)` of the answer span that decides the turn `ids`, tags included.

    `ids` is one model turn. The turn is parsed as the environment parses it (`parse_action`); when
    its action is an answer, the range covers that span, from its `<answer>` (the nearest one
    before the deciding `</answer>`) through the `</answer>`. Otherwise (a search, or no complete
    answer span: e.g. a `</answer>` whose `<answer>` was in an earlier turn) None.
    """
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    action = parse_action(text)
    if action.kind != "answer":
        return None
    close = action.end - len(ANSWER_CLOSE)
    open_ = text.rfind(ANSWER_OPEN, 0, close)
    start = _first_token_reaching(tokenizer, ids, open_)
    end = _first_token_reaching(tokenizer, ids, close + len(ANSWER_CLOSE) - 1) + 1
    return start, min(end, len(ids))


def mark_answer_span(ep: Episode, tokenizer) -> None:
    """Set `ep.answer_mask` on the final answer action's span.

    A no-op unless the episode ended with an answer action (`stop_reason == "answer"`): the mask
    then covers the answer span of the last model turn (the last run of action tokens), never
    text of earlier turns.
    """
    if ep.stop_reason != "answer":
        return
    n = len(ep.action_mask)
    last = n - 1
    while last >= 0 and not ep.action_mask[last]:
        last -= 1
    if last < 0:
        return
    first = last
    while first > 0 and ep.action_mask[first - 1]:
        first -= 1
    span = answer_token_span(tokenizer, ep.response_ids[first : last + 1])
    if span is None:
        return
    for k in range(first + span[0], first + span[1]):
        ep.answer_mask[k] = 1
