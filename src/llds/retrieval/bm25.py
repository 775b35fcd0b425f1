"""Sparse BM25 retrieval on `bm25s` with an English Snowball stemmer and English stopwords.

Defaults follow what Search-R1's BM25 baseline gets from Pyserini/Lucene: the Lucene BM25
variant with k1=0.9, b=0.4. Scores are exact Lucene BM25 (no k1+1 factor in the numerator):
    score(q, d) = sum_t idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)).
A passage that shares no term with the query scores 0 and is never returned, so a query may get
fewer than `k` hits (none at all for an empty query or one made only of stopwords).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path

# bm25s runs a JAX op when it is imported if JAX is installed, and JAX then takes most of the
# GPU's memory in every process that imports it (the trainer, each parallel run, the
# evaluator): the next process's CUDA start fails with out of memory. llds never computes with
# JAX, so it stays on the CPU unless the user has chosen its platform.
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import bm25s  # after JAX_PLATFORMS: its import initializes JAX
import numpy as np
import Stemmer

from llds.errors import UserInputError
from llds.io import atomic_directory
from llds.retrieval.base import Hit, check_search
from llds.retrieval.corpus import ids_and_contents
from llds.retrieval.docstore import DocStore, MappedDocs, MemoryDocs, save_docs
from llds.retrieval.manifest import read_meta, write_meta
from llds.retrieval.progress import progress_bar

BM25_SUBDIR = "bm25"
_TOKENIZE_CHUNK = 2000


def _stemmer() -> Stemmer.Stemmer:
    return Stemmer.Stemmer("english")


def tokenize(texts: Sequence[str], stemmer: Stemmer.Stemmer | None = None) -> list[list[str]]:
    """Lowercase, split on words of 2+ characters, drop English stopwords, Snowball-stem."""
    if not texts:
        return []
    out = bm25s.tokenize(
        list(texts),
        lower=True,
        stopwords="en",
        stemmer=stemmer or _stemmer(),
        return_ids=False,
        show_progress=False,
    )
    return [[t for t in tokens if t] for tokens in out]


class BM25Retriever:
    """In-process BM25 backend; the object itself is the in-process `Retriever`."""

    method = "bm25"

    def __init__(self, model: bm25s.BM25, docs: DocStore) -> None:
        self._model = model
        self.docs = docs
        self._stemmer = _stemmer()
        self._lock = threading.Lock()  # the stemmer's C state is not shared across threads

    @property
    def k1(self) -> float:
        return float(self._model.k1)

    @property
    def b(self) -> float:
        return float(self._model.b)

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def build(
        cls,
        passages: Iterable[object],
        *,
        k1: float = 0.9,
        b: float = 0.4,
        show_progress: bool = True,
    ) -> BM25Retriever:
        """Index `(id, contents)` pairs or corpus-row dicts (see `corpus.as_passages`)."""
        ids, contents = ids_and_contents(passages, "BM25")
        stemmer = _stemmer()
        tokens: list[list[str]] = []
        with progress_bar(show_progress) as bar:
            task = bar.add_task("BM25: tokenizing", total=len(contents))
            for start in range(0, len(contents), _TOKENIZE_CHUNK):
                chunk = contents[start : start + _TOKENIZE_CHUNK]
                tokens.extend(tokenize(chunk, stemmer))
                bar.advance(task, len(chunk))
            if not any(tokens):  # bm25s cannot index a corpus without a single term
                raise UserInputError(
                    f"cannot build a BM25 index: none of the {len(contents)} passages has a "
                    "searchable word (all are empty or stopwords)"
                )
            index_task = bar.add_task("BM25: indexing", total=1)
            model = bm25s.BM25(k1=k1, b=b, method="lucene")
            model.index(tokens, show_progress=False)
            bar.advance(index_task, 1)
        return cls(model, MemoryDocs(ids, contents))

    def save(self, directory: str | os.PathLike[str]) -> Path:
        """Write the index and its passages to `directory` (replaced atomically)."""
        with atomic_directory(directory) as tmp:
            self._model.save(str(tmp / BM25_SUBDIR), show_progress=False)
            count = save_docs(tmp, (self.docs[i] for i in range(len(self.docs))))
            write_meta(
                tmp,
                self.method,
                documents=count,
                k1=self.k1,
                b=self.b,
                variant="lucene",
                stemmer="english",
                stopwords="en",
            )
        return Path(directory)

    @classmethod
    def load(cls, directory: str | os.PathLike[str], *, mmap: bool = True) -> BM25Retriever:
        """Open a saved index; with `mmap` the score matrix and passages stay on disk."""
        meta = read_meta(directory)
        if meta["method"] != cls.method:
            raise UserInputError(f"{directory}: holds a {meta['method']} index, not bm25")
        root = Path(directory)
        docs = MappedDocs(root)
        if not (root / BM25_SUBDIR).is_dir():
            raise UserInputError(
                f"{root}: the index has no {BM25_SUBDIR}/ (its term scores); build it again "
                "with `llds index`"
            )
        model = bm25s.BM25.load(str(root / BM25_SUBDIR), mmap=mmap, show_progress=False)
        return cls(model, docs)

    def _top_k(self, token_ids: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """Sum the precomputed per-(term, passage) scores over the query's postings only.

        Work is proportional to the postings of the query terms, not to the corpus size, and
        only passages containing a query term are candidates (numpy's argpartition over a whole
        score vector that is mostly zeros is slow: ties make its selection degrade).
        """
        matrix = self._model.scores
        indptr, indices, data = matrix["indptr"], matrix["indices"], matrix["data"]
        spans = [(int(indptr[t]), int(indptr[t + 1])) for t in token_ids]
        doc_idx = np.concatenate([indices[a:b] for a, b in spans])
        weights = np.concatenate([data[a:b] for a, b in spans]).astype(np.float64)
        candidates, inverse = np.unique(doc_idx, return_inverse=True)
        totals = np.bincount(inverse, weights=weights, minlength=len(candidates))
        keep = totals > 0
        candidates, totals = candidates[keep], totals[keep]
        if len(candidates) > k:
            part = np.argpartition(-totals, k - 1)[:k]
            candidates, totals = candidates[part], totals[part]
        order = np.lexsort((candidates, -totals))  # best first, ties by passage position
        return candidates[order], totals[order]

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        """Top-`k` hits per query, best first (ties: earlier passage first).

        Queries are tokenized together; each is then scored over its terms' postings in the
        bm25s score matrix (see `_top_k`).
        """
        check_search(queries, k)
        results: list[list[Hit]] = [[] for _ in queries]
        if not queries:
            return results
        vocab = self._model.vocab_dict
        with self._lock:
            tokenized = tokenize(list(queries), self._stemmer)
        for qi, tokens in enumerate(tokenized):
            ids = [vocab[t] for t in tokens if t in vocab]
            if not ids:
                continue
            docs, scores = self._top_k(ids, k)
            results[qi] = [
                Hit(*self.docs[int(d)], float(sc)) for d, sc in zip(docs, scores, strict=True)
            ]
        return results
