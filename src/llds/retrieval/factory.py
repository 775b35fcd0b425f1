"""`open_retriever(spec)`: one entry point for every way of naming a retriever."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from llds.errors import UserInputError
from llds.retrieval.base import Retriever
from llds.retrieval.manifest import is_index_dir, read_meta


def build_retriever(
    passages: Any,
    *,
    method: str = "bm25",
    model_dir: str | None = None,
    show_progress: bool = True,
    source: str = "the corpus",
) -> Retriever:
    """Build an in-process backend over `passages` (an iterable of pairs or corpus dicts);
    `source` names them in a warning (a corpus file)."""
    if method == "bm25":
        from llds.retrieval.bm25 import BM25Retriever

        return BM25Retriever.build(passages, show_progress=show_progress, source=source)
    if method == "dense":
        from llds.retrieval.dense import DenseRetriever

        return DenseRetriever.build(passages, model_dir, show_progress=show_progress)
    raise UserInputError(f"unknown retrieval method {method!r}; choose 'bm25' or 'dense'")


def load_index(
    directory: str | os.PathLike[str], *, mmap: bool = True, model_dir: str | None = None
) -> Retriever:
    """Load a saved index of either kind (the kind is read from its `meta.json`)."""
    meta = read_meta(directory)
    if meta["method"] == "bm25":
        from llds.retrieval.bm25 import BM25Retriever

        return BM25Retriever.load(directory, mmap=mmap)
    from llds.retrieval.dense import DenseRetriever

    return DenseRetriever.load(directory, mmap=mmap, model_dir=model_dir)


def is_url(spec: str | os.PathLike[str]) -> bool:
    """Whether a retriever spec names a remote service (opened as an `HTTPRetriever`)."""
    return os.fspath(spec).startswith(("http://", "https://"))


CHECK_TIMEOUT = 10.0
"""Seconds the connectivity check waits for the service's first answer."""


def open_retriever(spec: str | os.PathLike[str], **kwargs: Any) -> Retriever:
    """`http(s)://host:port[/retrieve]` -> HTTP client; index directory -> loaded backend;
    corpus jsonl file -> backend built on the fly (BM25 unless `method="dense"`).

    Extra keyword arguments go to the client (`timeout`, `retries`, ...) or to `build_retriever`.
    """
    text = os.fspath(spec)
    if is_url(text):
        from llds.retrieval.client import HTTPRetriever

        return HTTPRetriever(text, **kwargs)
    path = Path(text)
    if path.is_dir():
        if not is_index_dir(path):
            raise UserInputError(f"{path}: a directory but not an index (no meta.json)")
        return load_index(path, **kwargs)
    if path.is_file():
        from llds.retrieval.corpus import read_corpus

        kwargs = {"show_progress": False, "source": str(path), **kwargs}
        return build_retriever(read_corpus(path), **kwargs)
    raise UserInputError(
        f"retriever {text!r}: not a URL, an index directory or a corpus file{url_hint(text)}"
    )


def corpus_passages(
    corpus: str | None, *, wiki: bool = False, wiki_max_words: int | None = None
) -> Any:
    """Passages from a corpus file, or from the optional Wikipedia summaries package."""
    if wiki:
        from llds.retrieval.wiki import wiki_passages

        return wiki_passages(max_words=wiki_max_words)
    if corpus is None:
        raise UserInputError("give a corpus: --corpus FILE (jsonl) or --wiki")
    from llds.retrieval.corpus import read_corpus

    return read_corpus(corpus)


def open_answering_retriever(
    spec: str | os.PathLike[str], key: str = "retriever", *, topk: int = 1, **kwargs: Any
) -> Retriever:
    """`open_retriever(spec, **kwargs)`, and for a URL one real search at the run's `topk`,
    before a command loads its model: an unreachable service is one `ServiceUnavailableError`
    line naming `key` and the URL, at once (the check does not retry: the retries and
    `retry_seconds` of `kwargs` are for a service that answered and then stops); one that
    refuses the search (a top-k above its limit) or answers outside the Search-R1 schema is
    one `UserInputError` line, instead of a traceback after the model has loaded. The search is
    a plain `/retrieve` request, which every Search-R1 compatible server answers."""
    from llds.errors import ServiceUnavailableError
    from llds.retrieval.client import HTTPRetriever, RetrievalServiceError

    if is_url(spec):
        try:
            with HTTPRetriever(os.fspath(spec), retries=0, timeout=CHECK_TIMEOUT) as check:
                check.search(["connectivity check"], topk)
        except RetrievalServiceError as exc:
            if exc.status is not None:  # it answered: the answer is wrong, not the network
                raise UserInputError(
                    f"{key}: the retrieval service at {spec} fails a first search at top-k "
                    f"{topk}: {exc}"
                ) from None
            raise ServiceUnavailableError(
                f"{key}: the retrieval service at {spec} does not answer ({exc}); start it "
                "(`llds serve-retriever ...`) or fix the URL"
            ) from None
    return open_retriever(spec, **kwargs)


def url_hint(spec: str) -> str:
    """A hint for a retriever spec that looks like a URL without its scheme (`host:port`,
    `localhost:8000/retrieve`), else "": such a spec is otherwise read as a missing path."""
    head = spec.split("/", 1)[0]
    host, colon, port = head.rpartition(":")
    if colon and host and port.isdigit() and "://" not in spec:
        return f" (a URL? write it with its scheme: http://{spec})"
    return ""
