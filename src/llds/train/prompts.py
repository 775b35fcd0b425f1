"""Which training questions each step draws, and their prompts as token ids."""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

from llds.data.example import QAExample
from llds.env.prompts import PromptTemplate, build_prompt_ids
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


class PromptEncoder:
    """A run's prompts as token ids: an example's question in the run's template (through the
    chat template or as raw text), encoded once per example id and then served from memory."""

    def __init__(self, tokenizer: Any, template: PromptTemplate, *, chat: bool | None) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.chat = chat
        self._ids: dict[str, list[int]] = {}

    def __call__(self, example: QAExample) -> list[int]:
        ids = self._ids.get(example.id)
        if ids is None:
            ids = build_prompt_ids(self.tokenizer, example.question, self.template, chat=self.chat)
            self._ids[example.id] = ids
        return ids
