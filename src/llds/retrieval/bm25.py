"""Sparse BM25 retrieval on `bm25s` with an English Snowball stemmer and English stopwords.

Defaults follow what Search-R1's BM25 baseline gets from Pyserini/Lucene: the Lucene BM25
variant with k1=0.9, b=0.4. Scores are exact Lucene BM25 (no k1+1 factor in the numerator):
    score(q, d) = sum_t idf(t) * tf / (tf + k1 * (1 - b + b * |d| / avgdl)),
    idf(t) = ln(1 + (N - df + 0.5) / (df + 0.5)).
A passage that shares no term with the query scores 0 and is never returned, so a query may get
fewer than `k` hits (none at all for an empty query or one made only of stopwords).
"""

from __future__ import annotations

import logging
import os
import re
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
_SAMPLED = 2000
"""passages (spread over the corpus) whose script is looked at, and their first 2000 characters"""

log = logging.getLogger(__name__)

UNSPACED_SCRIPTS = (
    (0x0E00, 0x0EFF),  # Thai, Lao
    (0x1000, 0x109F),  # Myanmar
    (0x1780, 0x17FF),  # Khmer
    (0x3040, 0x30FF),  # Hiragana, Katakana
    (0x3400, 0x4DBF),  # CJK Extension A
    (0x4E00, 0x9FFF),  # CJK Unified Ideographs
    (0xF900, 0xFAFF),  # CJK Compatibility Ideographs
)
"""scripts written without spaces between words: the analyzer keeps each run of them as one
"word" (a whole phrase), so a search finds a passage only by that phrase"""
_UNSPLIT_RUN = re.compile(
    "[" + "".join(f"\\u{lo:04x}-\\u{hi:04x}" for lo, hi in UNSPACED_SCRIPTS) + "]{7,}"
)
"""a run of 7 or more such letters: a phrase, not a word (segmented text has spaces between)"""


def unsplit_share(contents: Sequence[str]) -> tuple[int, int]:
    """`(passages mostly in unsplit phrases, passages looked at)`, over at most 2000 passages
    spread evenly over `contents`: a passage counts when over half of its letters are in runs of
    7 or more letters of one of `UNSPACED_SCRIPTS` (text already split into words has spaces
    between them, and passes)."""
    step = max(1, len(contents) // _SAMPLED)
    sample = contents[::step][:_SAMPLED]
    unsplit = 0
    for text in sample:
        head = text[:2000]
        letters = sum(ch.isalpha() for ch in head)
        in_runs = sum(len(m) for m in _UNSPLIT_RUN.findall(head))
        unsplit += 2 * in_runs > letters > 0
    return unsplit, len(sample)


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
        source: str = "the corpus",
    ) -> BM25Retriever:
        """Index `(id, contents)` pairs or corpus-row dicts (see `corpus.as_passages`). A
        corpus mostly in a script this analyzer does not split into words (Chinese, Japanese,
        Thai, ...) is named in a warning (`source`: the corpus's name in it): it is indexed, but
        its searches would find next to nothing."""
        ids, contents = ids_and_contents(passages, "BM25")
        unsplit, looked = unsplit_share(contents)
        if unsplit * 10 >= looked:  # a tenth or more of the passages
            log.warning(
                "%s: %d of %d passages looked at are mostly text without spaces between its "
                "words (Chinese, Japanese, Thai, ...); the BM25 analyzer is English (it splits "
                "at spaces and punctuation), so it keeps each phrase as one word and searches "
                "will find next to nothing: put spaces between the words first (a word "
                "segmenter), or build a dense index (method=dense)",
                source,
                unsplit,
                looked,
            )
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
