"""Locate the final `<answer> ... </answer>` span in token space (for LLDS-MA's answer weights)."""

from __future__ import annotations

from collections.abc import Sequence

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
    """Token range `[start, end)` covering the last complete answer span of `ids`, tags included."""
    text = tokenizer.decode(list(ids), skip_special_tokens=False)
    close = text.rfind(ANSWER_CLOSE)
    if close < 0:
        return None
    open_ = text.rfind(ANSWER_OPEN, 0, close)
    if open_ < 0:
        return None
    start = _first_token_reaching(tokenizer, ids, open_)
    end = _first_token_reaching(tokenizer, ids, close + len(ANSWER_CLOSE) - 1) + 1
    return start, min(end, len(ids))


def mark_answer_span(ep: Episode, tokenizer) -> None:
    """Set `ep.answer_mask` on the final action's answer span (no-op when there is none)."""
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
