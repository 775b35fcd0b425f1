"""The one interface every retriever implements (in-process backends and the HTTP client alike)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Hit:
    """One retrieved passage; `contents` is Search-R1's form: a quoted title line, then text."""

    id: str
    contents: str
    score: float = 0.0

    @property
    def title(self) -> str:
        first = self.contents.split("\n", 1)[0].strip()
        return first[1:-1] if len(first) >= 2 and first[0] == first[-1] == '"' else first

    @property
    def text(self) -> str:
        parts = self.contents.split("\n", 1)
        return parts[1] if len(parts) == 2 else ""


@runtime_checkable
class Retriever(Protocol):
    """`search(queries, k)` returns, for each query, its top-`k` hits best first."""

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]: ...
