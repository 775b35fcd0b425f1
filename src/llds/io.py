"""Small file helpers shared by every module that writes results: writes are atomic."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any


@contextmanager
def atomic_write(path: str | os.PathLike[str], mode: str = "w", **kwargs: Any) -> Iterator[IO[Any]]:
    """Open a temp file beside `path`; rename it over `path` only if the block succeeds.

    A crash or an exception leaves the previous file untouched, never a half-written one.
    """
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes a private file; give it normal permissions
    try:
        with os.fdopen(fd, mode, **kwargs) as handle:
            yield handle
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    current = os.umask(0)
    os.umask(current)
    return current


def write_json(path: str | os.PathLike[str], obj: Any, *, indent: int | None = 2) -> None:
    """Write `obj` as JSON atomically."""
    with atomic_write(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=indent, ensure_ascii=False)
        f.write("\n")


def write_jsonl(path: str | os.PathLike[str], rows: Iterable[Any]) -> int:
    """Write one JSON object per line atomically; returns the number of rows."""
    n = 0
    with atomic_write(path, "w", encoding="utf-8") as f:
        for row in rows:
            f.write(json.dumps(row, ensure_ascii=False))
            f.write("\n")
            n += 1
    return n
