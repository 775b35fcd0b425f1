"""The eight tag strings of the Search-R1 protocol, in one place so every module agrees on them."""

from __future__ import annotations

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
SEARCH_OPEN = "<search>"
SEARCH_CLOSE = "</search>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
INFO_OPEN = "<information>"
INFO_CLOSE = "</information>"

# A model turn ends at the first of these: the closing tag of an action decides what happens next.
STOP_STRINGS: tuple[str, ...] = (SEARCH_CLOSE, ANSWER_CLOSE)

# All tag strings, e.g. to register them as single tokens in a small tokenizer.
PROTOCOL_TOKENS: tuple[str, ...] = (
    THINK_OPEN,
    THINK_CLOSE,
    SEARCH_OPEN,
    SEARCH_CLOSE,
    ANSWER_OPEN,
    ANSWER_CLOSE,
    INFO_OPEN,
    INFO_CLOSE,
)
