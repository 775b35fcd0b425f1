"""What a decode loop hands back for one turn of one row, and the stop rules both loops share."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass
class TurnTokens:
    """One row's turn: the sampled ids with their sampling log-probs and entropies."""

    ids: list[int]
    logprobs: list[float]
    entropies: list[float]
    out_of_budget: bool
    """the turn ran into its token budget instead of ending itself (EOS or a stop tag)"""


def stop_candidates(
    tokenizer, stop_strings: Sequence[str], vocab_size: int, device: torch.device
) -> Tensor:
    """`[vocab_size]` bool: tokens after which a stop string may have just been completed.

    Every stop string ends with `>`, so the first token after which a turn's text contains one
    is a token whose text contains `>`. Only those need the exact (decoding) check of
    `StopChecker` (whose `stop_strings` these are); the other tokens are decided on the
    device. Ids the tokenizer does not know (a model vocabulary padded past the tokenizer's)
    are candidates too, to be safe.
    """
    known = min(vocab_size, len(tokenizer))
    texts = tokenizer.batch_decode([[i] for i in range(known)], skip_special_tokens=False)
    pieces = tokenizer.convert_ids_to_tokens(list(range(known)))
    flags = [">" in t or (p is not None and ">" in p) for t, p in zip(texts, pieces, strict=True)]
    flags += [True] * (vocab_size - known)
    if not all(s.endswith(">") for s in stop_strings):  # a custom stop string: every token
        flags = [True] * vocab_size
    return torch.tensor(flags, dtype=torch.bool, device=device)
