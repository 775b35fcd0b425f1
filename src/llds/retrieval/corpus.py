"""Passage corpora on disk: Search-R1 jsonl (`id`, `contents`) and plain jsonl (`title`, `text`).

Both formats are read lazily, one line at a time, so a 21M-passage Wikipedia dump never has to
fit in memory just to be validated. The format is detected per file from its first row.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, NamedTuple

from llds.errors import DataFormatError, UserInputError
from llds.io import text_lines, write_jsonl

SEARCH_R1 = "search-r1"
PLAIN = "plain"

log = logging.getLogger(__name__)


class Passage(NamedTuple):
    """One corpus entry in Search-R1 form (`contents` = quoted title line, newline, text)."""

    id: str
    contents: str


def make_contents(title: str, text: str) -> str:
    """Search-R1 `contents`: `"Title"` on the first line, then the text.

    Line breaks inside the title would shift the title/text split, so they become spaces.
    """
    clean_title = " ".join(str(title).split())
    return f'"{clean_title}"\n{text}'


def _open_binary(path: Path) -> IO[bytes]:
    if path.suffix == ".gz":
        return gzip.open(path, "rb")  # type: ignore[return-value]
    return open(path, "rb")


def _detect_format(row: dict, where: str) -> str:
    if "contents" in row:
        return SEARCH_R1
    if "text" in row:
        return PLAIN
    raise DataFormatError(
        f"{where}: unknown corpus row; expected field 'contents' (Search-R1 corpus) "
        f"or 'title' + 'text' (plain corpus), found fields {sorted(row)}"
    )


def _id_field(row: dict, default: int, where: str) -> str:
    if "id" not in row or row["id"] is None:
        return str(default)
    value = row["id"]
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise DataFormatError(
            f"{where}: field 'id' must be a string or integer, got {type(value).__name__}"
        )
    return str(value)


def _str_field(row: dict, field: str, where: str, *, required: bool = True) -> str:
    if field not in row or row[field] is None:
        if required:
            raise DataFormatError(f"{where}: missing field '{field}'")
        return ""
    value = row[field]
    if not isinstance(value, str):
        raise DataFormatError(
            f"{where}: field '{field}' must be a string, got {type(value).__name__}"
        )
    return value


def parse_row(row: object, fmt: str | None, index: int, where: str) -> tuple[Passage, str]:
    """Validate one decoded row; returns the passage and the (possibly just detected) format."""
    if not isinstance(row, dict):
        raise DataFormatError(f"{where}: expected a JSON object, got {type(row).__name__}")
    fmt = fmt or _detect_format(row, where)
    pid = _id_field(row, index, where)
    if fmt == SEARCH_R1:
        return Passage(pid, _str_field(row, "contents", where)), fmt
    title = _str_field(row, "title", where, required=False)
    text = _str_field(row, "text", where)
    return Passage(pid, make_contents(title, text)), fmt


def is_empty_passage(contents: str) -> bool:
    """No letter or digit anywhere (title included): no query can ever retrieve it."""
    return not any(ch.isalnum() for ch in contents)


def _numbered_passages(file: Path) -> Iterator[tuple[int, Passage]]:
    """(line number, passage) for every non-blank line of a corpus file, each row validated."""
    fmt: str | None = None
    index = 0
    with _open_binary(file) as handle:
        for line_no, line in text_lines(file, handle):
            if not line.strip():
                continue
            where = f"{file}:{line_no}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataFormatError(f"{where}: invalid JSON ({exc.msg})") from None
            passage, fmt = parse_row(row, fmt, index, where)
            index += 1
            yield line_no, passage


def _duplicate_id(file: Path, pid: str, line_no: int) -> DataFormatError:
    """The error for a repeated id, naming both lines (the file is read again to find the
    first one: only ids are kept while reading, not their lines)."""
    first = next(n for n, p in _numbered_passages(file) if p.id == pid)
    return DataFormatError(
        f"{file}: lines {first} and {line_no} have the same passage id {pid!r}; "
        "ids must be unique (search results are returned by id)"
    )


def read_corpus(path: str | os.PathLike[str]) -> Iterator[Passage]:
    """Yield the passages of a corpus jsonl (optionally .gz) file, validating every row.

    Rows without an `id` get their 0-based row number. Blank lines are skipped. Ids must be
    unique. Passages with no letter or digit are logged as a warning with their count (no
    search finds them); a file with no passage, or with nothing but empty ones, is an error.
    The file-level checks run once the last row has been read.
    """
    file = Path(path)
    if not file.is_file():
        raise UserInputError(f"corpus file not found: {file}")
    seen: set[str] = set()
    empty = 0
    for line_no, passage in _numbered_passages(file):
        if passage.id in seen:
            raise _duplicate_id(file, passage.id, line_no)
        seen.add(passage.id)
        empty += is_empty_passage(passage.contents)
        yield passage
    if not seen:
        raise DataFormatError(f"{file}: no passages (the corpus file is empty)")
    if empty == len(seen):
        raise DataFormatError(
            f"{file}: all {empty} passages are empty (no letter or digit): nothing to search"
        )
    if empty:
        log.warning(
            "%s: %d of %d passages are empty (no letter or digit); no search will find them",
            file,
            empty,
            len(seen),
        )


def write_corpus(path: str | os.PathLike[str], passages: Iterable[tuple[str, str]]) -> int:
    """Write passages as a Search-R1 corpus jsonl (atomically); returns the row count."""
    return write_jsonl(path, ({"id": str(pid), "contents": c} for pid, c in passages))


def as_passages(items: Iterable[object]) -> Iterator[Passage]:
    """Accept `(id, contents)` pairs or dicts in either corpus format (as a backend input)."""
    fmt: str | None = None
    for index, item in enumerate(items):
        if isinstance(item, dict):
            passage, fmt = parse_row(item, fmt, index, f"passage {index}")
            yield passage
        elif isinstance(item, (tuple, list)) and len(item) == 2:
            pid, contents = item
            if not isinstance(contents, str):
                raise DataFormatError(f"passage {index}: contents must be a string")
            yield Passage(str(pid), contents)
        else:
            raise DataFormatError(
                f"passage {index}: expected (id, contents) or a dict, got {type(item).__name__}"
            )


def ids_and_contents(items: Iterable[object], what: str) -> tuple[list[str], list[str]]:
    """Unzip a backend's input into ids and contents; an empty corpus is an error."""
    ids: list[str] = []
    contents: list[str] = []
    for pid, text in as_passages(items):
        ids.append(pid)
        contents.append(text)
    if not contents:
        raise UserInputError(f"cannot build a {what} index from an empty corpus")
    return ids, contents
