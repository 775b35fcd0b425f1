"""Retrieval: corpora, BM25 and dense backends, the Search-R1-compatible HTTP service and client."""

from llds.retrieval.base import Hit, Retriever

__all__ = ["Hit", "Retriever"]
