"""BM25 backend: tokenization, scores vs an independent BM25, ranking, edge cases, save/load."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from llds.retrieval.bm25 import BM25Retriever, tokenize
from llds.retrieval.corpus import make_contents

DOCS = [
    ("d0", make_contents("Paris", "Paris is the capital of France. Paris hosts the Louvre.")),
    ("d1", make_contents("Berlin", "Berlin is the capital of Germany.")),
    ("d2", make_contents("Louvre", "The Louvre museum in Paris holds the Mona Lisa painting.")),
    ("d3", make_contents("Rhine", "The Rhine river flows through Germany and the Netherlands.")),
    ("d4", make_contents("Painting", "Painting is the practice of applying paint to a surface.")),
]


def reference_bm25(query: str, docs: list[str], k1: float, b: float) -> list[float]:
    """Lucene BM25 written out term by term (the formula, not the library)."""
    doc_tokens = tokenize(docs)
    q_tokens = tokenize([query])[0]
    n = len(docs)
    avgdl = sum(len(t) for t in doc_tokens) / n
    df = Counter(term for toks in doc_tokens for term in set(toks))
    scores = []
    for toks in doc_tokens:
        tf = Counter(toks)
        s = 0.0
        for term in q_tokens:
            if tf[term] == 0:
                continue
            idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
            s += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(toks) / avgdl))
        scores.append(s)
    return scores


@pytest.fixture(scope="module")
def retriever() -> BM25Retriever:
    return BM25Retriever.build(DOCS, show_progress=False)


def test_tokenize_lowercases_drops_stopwords_and_stems() -> None:
    assert tokenize(["The running Dogs of Paris", "", "the and of"]) == [
        ["run", "dog", "pari"],
        [],
        [],
    ]


@pytest.mark.parametrize("query", ["Paris Louvre", "capital of Germany", "painting museum"])
@pytest.mark.parametrize(("k1", "b"), [(0.9, 0.4), (1.5, 0.75)])
def test_scores_match_independent_bm25(query: str, k1: float, b: float) -> None:
    model = BM25Retriever.build(DOCS, k1=k1, b=b, show_progress=False)
    contents = [c for _, c in DOCS]
    expected = reference_bm25(query, contents, k1, b)
    hits = model.search([query], k=5)[0]
    got = {h.id: h.score for h in hits}
    for (pid, _), want in zip(DOCS, expected, strict=True):
        if want > 0:
            assert got[pid] == pytest.approx(want, rel=1e-5)
        else:
            assert pid not in got  # no shared term -> not returned
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_default_parameters_are_lucene_search_r1(retriever: BM25Retriever) -> None:
    assert (retriever.k1, retriever.b) == (0.9, 0.4)


def test_top_hit_and_hit_fields(retriever: BM25Retriever) -> None:
    results = retriever.search(["Mona Lisa", "Rhine river", "capital of Germany"], k=2)
    assert [r[0].id for r in results] == ["d2", "d3", "d1"]
    top = results[0][0]
    assert top.title == "Louvre"
    assert isinstance(top.score, float)


def test_empty_and_unknown_queries_get_no_hits(retriever: BM25Retriever) -> None:
    results = retriever.search(["", "   ", "the of and", "zzzqqq", "Paris"], k=3)
    assert results[:4] == [[], [], [], []]
    assert results[4][0].id in {"d0", "d2"}
    assert retriever.search([], k=3) == []


def test_k_is_capped_to_corpus_size(retriever: BM25Retriever) -> None:
    hits = retriever.search(["Paris Germany painting capital Rhine"], k=1000)[0]
    assert len(hits) == len(DOCS)
    assert len({h.id for h in hits}) == len(DOCS)


def test_bad_arguments(retriever: BM25Retriever) -> None:
    with pytest.raises(ValueError, match="k must be"):
        retriever.search(["x"], k=0)
    with pytest.raises(TypeError):
        retriever.search("Paris", k=1)


def test_save_load_round_trips_docs_and_scores(tmp_path: Path, retriever: BM25Retriever) -> None:
    odd = [("ü", make_contents("Zürich", 'Line\n"quoted" text ✓ Zürich')), *DOCS]
    built = BM25Retriever.build(odd, show_progress=False)
    built.save(tmp_path / "idx")
    built.save(tmp_path / "idx")  # overwriting an index replaces it
    loaded = BM25Retriever.load(tmp_path / "idx", mmap=True)
    assert len(loaded) == len(odd)
    assert [loaded.docs[i] for i in range(len(odd))] == odd
    queries = ["Zürich quoted", "Paris Louvre", "Germany"]
    assert loaded.search(queries, 4) == built.search(queries, 4)
    assert not list(tmp_path.glob(".idx*"))  # no temp directories left behind


def test_build_from_plain_dicts() -> None:
    rows = [{"title": "Oak", "text": "A tree."}, {"title": "Car", "text": "A vehicle."}]
    model = BM25Retriever.build(rows, show_progress=False)
    assert model.search(["vehicle"], 1)[0][0].id == "1"


FAKE_JAX_LAX = """
import json, os
def top_k(scores, k):
    with open(os.environ["SEEN_FILE"], "w") as f:
        json.dump(os.environ.get("JAX_PLATFORMS"), f)
    return scores, None
"""


@pytest.mark.parametrize("chosen", [None, "cuda"])
def test_bm25s_import_keeps_jax_off_the_gpu_unless_chosen(
    tmp_path: Path, chosen: str | None
) -> None:
    """bm25s calls `jax.lax.top_k` while it is imported when JAX is installed; on a GPU that
    makes JAX take most of the card in every llds process (a parallel run then failed to start
    CUDA). A stand-in `jax` records the platform it was started with."""
    (tmp_path / "jax").mkdir()
    (tmp_path / "jax" / "__init__.py").write_text("from jax import lax\n")
    (tmp_path / "jax" / "lax.py").write_text(FAKE_JAX_LAX)
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    env["PYTHONPATH"] = os.pathsep.join([str(tmp_path), env.get("PYTHONPATH", "")])
    env["SEEN_FILE"] = str(tmp_path / "seen.json")
    if chosen:
        env["JAX_PLATFORMS"] = chosen
    code = "import llds.retrieval.bm25, bm25s.selection as s; assert s.JAX_IS_AVAILABLE"
    subprocess.run([sys.executable, "-c", code], env=env, check=True)
    assert json.loads((tmp_path / "seen.json").read_text()) == (chosen or "cpu")
