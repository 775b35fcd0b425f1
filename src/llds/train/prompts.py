"""Which training questions each step draws."""

from __future__ import annotations

import random
from collections.abc import Sequence

from llds.data.example import QAExample
from llds.errors import UserInputError


class PromptStream:
    """An endless, seeded stream of training examples: a fresh permutation every epoch.

    Position `p` of the stream is a pure function of (seed, p), so a resumed run draws exactly
    the questions the uninterrupted run would have drawn.
    """

    def __init__(self, examples: Sequence[QAExample], seed: int) -> None:
        if not examples:
            raise UserInputError("data.train: no training examples")
        self.examples = list(examples)
        self.seed = seed
        self._epoch = -1
        self._order: list[int] = []

    def _order_for(self, epoch: int) -> list[int]:
        if epoch != self._epoch:
            order = list(range(len(self.examples)))
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
            self._epoch, self._order = epoch, order
        return self._order

    def take(self, start: int, count: int) -> list[QAExample]:
        n = len(self.examples)
        out = []
        for pos in range(start, start + count):
            out.append(self.examples[self._order_for(pos // n)[pos % n]])
        return out
