"""Passage storage for an index: in memory while building, memory-mapped after loading.

On disk a store is `docs.jsonl` (itself a valid Search-R1 corpus) plus `docs.offsets.npy`, the
byte offset of every line, so any passage is read by one slice of the mapped file: loading a
21M-passage index costs no parsing and almost no RAM.
"""

from __future__ import annotations

import json
import mmap
import os
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from llds.errors import DataFormatError, UserInputError
from llds.io import atomic_write

DOCS_FILE = "docs.jsonl"
OFFSETS_FILE = "docs.offsets.npy"


class DocStore(Protocol):
    """Random access to passages by position: `store[i] -> (id, contents)`."""

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> tuple[str, str]: ...


class MemoryDocs:
    """Passages held in two parallel lists (the state of a freshly built index)."""

    def __init__(self, ids: Sequence[str], contents: Sequence[str]) -> None:
        if len(ids) != len(contents):
            raise ValueError("ids and contents differ in length")
        self.ids = list(ids)
        self.contents = list(contents)

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> tuple[str, str]:
        return self.ids[i], self.contents[i]


class MappedDocs:
    """Passages read lazily from a saved store through mmap (read-only, thread-safe)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        root = Path(directory)
        missing = [name for name in (DOCS_FILE, OFFSETS_FILE) if not (root / name).is_file()]
        if missing:
            raise UserInputError(
                f"{root}: the index has no {' and no '.join(missing)} (its passages); build it "
                "again with `llds index`"
            )
        try:
            self.offsets = np.load(root / OFFSETS_FILE, mmap_mode="r")
        except (OSError, ValueError) as exc:
            raise DataFormatError(
                f"{root / OFFSETS_FILE}: damaged ({exc}); build it again"
            ) from None
        self._file = open(root / DOCS_FILE, "rb")  # noqa: SIM115 - lives as long as the store
        size = os.fstat(self._file.fileno()).st_size
        if self.offsets.ndim != 1 or len(self.offsets) < 1 or int(self.offsets[-1]) != size:
            self._file.close()
            raise DataFormatError(
                f"{root / DOCS_FILE}: {size} bytes, but {OFFSETS_FILE} says "
                f"{int(self.offsets[-1]) if self.offsets.size else 0} (a copy cut short?); "
                "build the index again"
            )
        self._map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ) if size else b""

    def __len__(self) -> int:
        return len(self.offsets) - 1

    def __getitem__(self, i: int) -> tuple[str, str]:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(i)
        start, end = int(self.offsets[i]), int(self.offsets[i + 1])
        row = json.loads(self._map[start:end])
        return row["id"], row["contents"]


def iter_docs(store: DocStore) -> Iterator[tuple[str, str]]:
    for i in range(len(store)):
        yield store[i]


def save_docs(directory: str | os.PathLike[str], docs: Iterable[tuple[str, str]]) -> int:
    """Write `docs.jsonl` and its offsets table into `directory`; returns the passage count."""
    root = Path(directory)
    offsets = [0]
    with atomic_write(root / DOCS_FILE, "wb") as handle:
        for pid, contents in docs:
            line = json.dumps({"id": pid, "contents": contents}, ensure_ascii=False)
            data = line.encode("utf-8") + b"\n"
            handle.write(data)
            offsets.append(offsets[-1] + len(data))
    with atomic_write(root / OFFSETS_FILE, "wb") as handle:
        np.save(handle, np.asarray(offsets, dtype=np.int64))
    return len(offsets) - 1
