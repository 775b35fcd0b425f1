"""Retrieval: corpora, BM25 and dense backends, the Search-R1-compatible HTTP service and client.

A backend object (`BM25Retriever`, `DenseRetriever`) is itself the in-process retriever;
`HTTPRetriever` is the same interface over the network; `open_retriever(spec)` picks one from a
URL, an index directory or a corpus file. Heavy modules load on first attribute access.
"""

from __future__ import annotations

from llds.lazy import lazy_attributes
from llds.retrieval.base import Hit, Retriever

_LAZY = {
    "BM25Retriever": "llds.retrieval.bm25",
    "DenseRetriever": "llds.retrieval.dense",
    "HTTPRetriever": "llds.retrieval.client",
    "RetrievalServiceError": "llds.retrieval.client",
    "Passage": "llds.retrieval.corpus",
    "make_contents": "llds.retrieval.corpus",
    "read_corpus": "llds.retrieval.corpus",
    "write_corpus": "llds.retrieval.corpus",
    "wiki_passages": "llds.retrieval.wiki",
    "open_retriever": "llds.retrieval.factory",
    "build_retriever": "llds.retrieval.factory",
    "load_index": "llds.retrieval.factory",
    "create_app": "llds.retrieval.service",
    "serve": "llds.retrieval.service",
}

__all__ = ["Hit", "Retriever", *sorted(_LAZY)]

__getattr__ = lazy_attributes(__name__, _LAZY)
