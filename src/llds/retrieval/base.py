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


def check_search(queries: object, k: object) -> None:
    """A search batch as every retriever takes it, checked before any work (one `TypeError` or
    `ValueError` naming the argument, not an AttributeError from inside a tokenizer): a
    sequence of strings, not one string, and `k >= 1`."""
    if isinstance(queries, str) or not isinstance(queries, Sequence):
        what = "a single string" if isinstance(queries, str) else type(queries).__name__
        raise TypeError(f"search: queries must be a sequence of strings, not {what}")
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise TypeError(
                f"search: queries[{i}] must be a string, got {type(query).__name__} ({query!r:.40})"
            )
    if isinstance(k, bool) or not isinstance(k, int) or k < 1:
        raise ValueError(f"search: k must be an integer >= 1, got {k!r}")
