"""The single question-answer example type every loader produces."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class QAExample:
    """A question with its accepted answers.

    `id` is globally unique across every file a run loads (GRPO groups are keyed by it), so it is
    never a bare per-file row index: loaders prefix it with the source and file.
    """

    id: str
    question: str
    answers: tuple[str, ...]
    source: str = "unknown"
    metadata: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "question": self.question,
            "golden_answers": list(self.answers),
            "source": self.source,
            "metadata": self.metadata,
        }
