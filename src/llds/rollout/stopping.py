"""Where a turn ends: the first closing search/answer tag, an end-of-sequence token, or a cap.

Each ends the turn only; the rollout engine then parses the turn as an action (an end-of-sequence
token does not end the rollout by itself).

The engine keeps the sampled token ids; it only decodes a short tail of each row to look for
stop strings, so a tag split across several tokens (as in large BPE vocabularies) is found too.
"""

from __future__ import annotations

from collections.abc import Sequence

from llds.env.tags import STOP_STRINGS

TAIL_TOKENS = 16


def eos_token_ids(model, tokenizer) -> set[int]:
    """Every id that ends a turn: the tokenizer's EOS and the generation config's."""
    ids: set[int] = set()
    for source in (
        getattr(getattr(model, "generation_config", None), "eos_token_id", None),
        tokenizer.eos_token_id,
    ):
        if source is None:
            continue
        ids.update([source] if isinstance(source, int) else list(source))
    return ids


class StopChecker:
    """Decides after each sampled token whether the row's turn is over."""

    def __init__(self, tokenizer, stop_strings: Sequence[str] = STOP_STRINGS) -> None:
        self.tokenizer = tokenizer
        self.stop_strings = tuple(stop_strings)
        vocab = tokenizer.get_vocab()
        # fast path: tokens whose own text is (or ends with) a stop string
        self.single_token_stops = {i for s in self.stop_strings if (i := vocab.get(s)) is not None}

    def hit_stop_string(self, turn_ids: Sequence[int]) -> bool:
        if not turn_ids:
            return False
        if turn_ids[-1] in self.single_token_stops:
            return True
        tail = self.tokenizer.decode(list(turn_ids[-TAIL_TOKENS:]), skip_special_tokens=False)
        return any(s in tail for s in self.stop_strings)
