"""The `meta.json` that says what kind of index a directory holds, and atomic directory saves.

An index is several files; writing them straight into the target could leave a half-old,
half-new index after a crash. Saves therefore go to a sibling temp directory that is swapped in
only once complete.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from llds.errors import DataFormatError, UserInputError
from llds.io import write_json

META_FILE = "meta.json"
FORMAT_NAME = "llds-retrieval-index"
FORMAT_VERSION = 1


def write_meta(directory: Path, method: str, **fields: Any) -> None:
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "method": method, **fields}
    write_json(directory / META_FILE, meta)


def read_meta(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check an index's `meta.json`; errors name the directory."""
    path = Path(directory) / META_FILE
    if not path.is_file():
        raise UserInputError(f"{directory}: not an index directory (no {META_FILE})")
    try:
        meta = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{path}: invalid JSON ({exc.msg})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise DataFormatError(f"{path}: field 'format' must be {FORMAT_NAME!r}")
    if meta.get("version") != FORMAT_VERSION:
        raise DataFormatError(
            f"{path}: field 'version' is {meta.get('version')!r}; this llds reads {FORMAT_VERSION}"
        )
    if meta.get("method") not in ("bm25", "dense"):
        raise DataFormatError(f"{path}: field 'method' must be 'bm25' or 'dense'")
    return meta


def is_index_dir(path: str | os.PathLike[str]) -> bool:
    return (Path(path) / META_FILE).is_file()
