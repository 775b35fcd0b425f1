"""Text the environment inserts into a rollout: search results and corrective messages.

All of it is observation text: the trainer masks it out of every loss term.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from llds.env.tags import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    INFO_CLOSE,
    INFO_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
)
from llds.retrieval.base import Hit


def format_hits(hits: Sequence[Hit]) -> str:
    """One line per hit, `Doc i(Title: t) text` with i from 1: the format Search-R1 clients use."""
    return "\n".join(f"Doc {i}(Title: {hit.title}) {hit.text}" for i, hit in enumerate(hits, 1))


def _encode(tokenizer: Any, text: str) -> list[int]:
    return list(tokenizer.encode(text, add_special_tokens=False))


def _token_ends(tokenizer: Any, text: str) -> list[int] | None:
    """Character index where each token ends, or None for tokenizers without offset mapping."""
    try:
        enc = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    except (NotImplementedError, TypeError, ValueError):
        return None
    offsets = enc.get("offset_mapping") if hasattr(enc, "get") else None
    return None if offsets is None else [int(end) for _, end in offsets]


MAX_CHARS_PER_TOKEN = 32
"""characters a token of a text tokenizer spans at most, in practice (English averages about
4): text further than this many characters per kept token is cut before it is tokenized"""


def truncate_to_tokens(text: str, tokenizer: Any, max_tokens: int) -> str:
    """The longest prefix of `text` we find that encodes to at most `max_tokens` tokens.

    Cuts at a token boundary of the original text (offset mapping) so the kept text is verbatim;
    tokenizers without offsets fall back to decoding the first ids. The result is re-encoded and
    shortened until it fits, because a cut inside a multi-byte character can re-encode longer.
    """
    if max_tokens < 0:
        raise ValueError(f"max_tokens must be >= 0, got {max_tokens}")
    # a token is rarely more than a few characters: what lies past this bound can never be
    # kept, and tokenizing it (a 12 MB passage) would cost a minute per search
    text = text[: (max_tokens + 1) * MAX_CHARS_PER_TOKEN]
    ids = _encode(tokenizer, text)
    if len(ids) <= max_tokens:
        return text
    ends = _token_ends(tokenizer, text)
    for keep in range(max_tokens, 0, -1):
        if ends is not None and len(ends) == len(ids):
            candidate = text[: ends[keep - 1]]
        else:
            candidate = tokenizer.decode(ids[:keep], skip_special_tokens=False)
        if len(_encode(tokenizer, candidate)) <= max_tokens:
            return candidate
    return ""


def information_block(
    hits: Sequence[Hit], *, tokenizer: Any = None, max_tokens: int | None = None
) -> str:
    """The observation for a search: the formatted hits inside information tags, blank lines around.

    With `tokenizer` and `max_tokens`, only the body is cut to at most `max_tokens` tokens; the
    tags are always kept so the model always sees where the retrieved text ends.
    """
    body = format_hits(hits)
    if max_tokens is not None:
        if tokenizer is None:
            raise ValueError("information_block: max_tokens needs a tokenizer to count tokens")
        body = truncate_to_tokens(body, tokenizer, max_tokens)
    return f"\n\n{INFO_OPEN}{body}{INFO_CLOSE}\n\n"


_INVALID_ACTION = (
    "\n\nThat turn had no complete action. "
    f"To search, write {SEARCH_OPEN} your query {SEARCH_CLOSE}; "
    f"to finish, write {ANSWER_OPEN} your final answer {ANSWER_CLOSE}. Try again.\n\n"
)


def invalid_action_message() -> str:
    """Observation after a turn with neither a complete search nor a complete answer."""
    return _INVALID_ACTION
