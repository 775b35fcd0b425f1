"""The synthetic world: determinism, answerable chains, hop mix, names, splits, BM25, CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml

from llds.cli import main as cli_main
from llds.data.loaders import load_flashrag_jsonl
from llds.data.world import (
    RELATIONS,
    WorldConfig,
    generate_world,
    load_world_config,
    relabel_world,
    write_world,
)
from llds.errors import ConfigError


@pytest.fixture(scope="module")
def organism():
    return generate_world(WorldConfig.preset("organism"))


def words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower()))


def test_same_seed_same_files_different_seed_differs(tmp_path: Path) -> None:
    small = {"num_entities": 60, "num_train": 40, "num_test": 10}
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        write_world(
            generate_world(WorldConfig.preset("organism", seed=seed, **small)), tmp_path / name
        )
    for file in ("corpus.jsonl", "train.jsonl", "test.jsonl", "world.json"):
        assert (tmp_path / "a" / file).read_bytes() == (tmp_path / "b" / file).read_bytes()
    assert (tmp_path / "a" / "corpus.jsonl").read_bytes() != (
        tmp_path / "c" / "corpus.jsonl"
    ).read_bytes()
    assert not list(tmp_path.glob("*/.*.tmp"))  # atomic writes leave no temp files


def test_every_hop_is_answerable_from_its_gold_passage(organism) -> None:
    docs = {d["id"]: d["contents"] for d in organism.corpus}
    for ex in organism.train + organism.test:
        chain = ex.metadata["chain"]
        assert len(chain) == ex.metadata["hops"]
        for i, hop in enumerate(chain):
            gold = docs[hop["doc_id"]]
            keyword = RELATIONS[hop["relation"]].keyword
            assert hop["query"] == f"{keyword} of {hop['subject']}"
            assert {hop["subject"].lower(), hop["answer"].lower(), keyword} <= words(gold)
            if i:  # the previous hop's answer is this hop's search key
                assert hop["subject"] == chain[i - 1]["answer"]
        assert chain[0]["subject"] == ex.metadata["start"]
        assert chain[-1]["answer"] == ex.answers[0]
        assert ex.metadata["start"] in ex.question


def test_relabeled_world_moves_names_within_type_and_stays_answerable(organism) -> None:
    copy = relabel_world(organism, seed=7)
    assert relabel_world(organism, seed=7).corpus == copy.corpus  # deterministic
    assert relabel_world(organism, seed=8).corpus != copy.corpus
    kind = {e.name: e.type for e in organism.entities}
    # the same facts graph with names moved: each (subject, relation) -> object maps consistently
    renamed: dict[str, str] = {}
    for ((s, r), o), ((s2, r2), o2) in zip(organism.facts.items(), copy.facts.items(), strict=True):
        assert r == r2
        for old, new in ((s, s2), (o, o2)):
            assert renamed.setdefault(old, new) == new
            assert kind[old] == kind[new]  # a city stays a city
    assert sum(old != new for old, new in renamed.items()) > 0.9 * len(renamed)
    assert len(set(renamed.values())) == len(renamed)  # a permutation
    docs = {d["id"]: d["contents"] for d in copy.corpus}
    for ex in copy.train + copy.test:
        assert ex.id.endswith(":perm7")
        chain = ex.metadata["chain"]
        assert ex.metadata["start"] in ex.question and chain[-1]["answer"] == ex.answers[0]
        for hop in chain:
            assert copy.facts[(hop["subject"], hop["relation"])] == hop["answer"]
            assert copy.fact_doc[(hop["subject"], hop["relation"])] == hop["doc_id"]
            keyword = RELATIONS[hop["relation"]].keyword
            assert {hop["subject"].lower(), hop["answer"].lower(), keyword} <= words(
                docs[hop["doc_id"]]
            )
    assert len({ex.id for ex in copy.train + copy.test}) == len(copy.train) + len(copy.test)


def test_gold_passage_is_the_only_one_with_key_and_relation_word(organism) -> None:
    """No other passage pairs the hop's entity with the relation word: the fact is unambiguous."""
    index = [(d["id"], words(d["contents"])) for d in organism.corpus]
    for ex in organism.train[:200]:
        for hop in ex.metadata["chain"]:
            need = {hop["subject"].lower(), RELATIONS[hop["relation"]].keyword}
            assert [i for i, w in index if need <= w] == [hop["doc_id"]]


def test_hop_counts_follow_the_mix(organism) -> None:
    # 480 train / 120 test at 0.5 / 0.35 / 0.15, computed by hand
    assert organism.stats()["train_by_hops"] == {"1": 240, "2": 168, "3": 72}
    assert organism.stats()["test_by_hops"] == {"1": 60, "2": 42, "3": 18}
    odd = generate_world(
        WorldConfig.preset("organism", num_train=7, num_test=3, hop_mix={1: 1, 2: 1})
    )
    hops = [ex.metadata["hops"] for ex in odd.train]
    assert len(hops) == 7 and sorted(set(hops)) == [1, 2] and abs(hops.count(1) - 3.5) == 0.5


def test_names_unique_stemmer_safe_and_not_similar_by_default(organism) -> None:
    import Stemmer

    names = [e.name.lower() for e in organism.entities]
    assert len(set(names)) == len(names)
    stemmer = Stemmer.Stemmer("english")
    assert stemmer.stemWords(names) == names  # one intact BM25 term each
    hard = [e.name.lower() for e in generate_world(WorldConfig.preset("hard", seed=1)).entities]
    assert stemmer.stemWords(hard) == hard
    syl = [e.syllables for e in organism.entities]
    for i, a in enumerate(syl):
        for b in syl[:i]:
            if len(a) == len(b):
                assert sum(x != y for x, y in zip(a, b, strict=True)) >= 2, (a, b)
    assert all(e.near_duplicate_of is None for e in organism.entities)


def test_name_similarity_creates_near_duplicates() -> None:
    world = generate_world(WorldConfig.preset("organism", name_similarity=0.5))
    by_name = {e.name: e for e in world.entities}
    dups = [e for e in world.entities if e.near_duplicate_of]
    assert len(dups) >= 0.3 * len(world.entities)
    for e in dups:
        base = by_name[e.near_duplicate_of]
        assert e.name != base.name
        assert len(e.syllables) == len(base.syllables)
        assert sum(x != y for x, y in zip(e.syllables, base.syllables, strict=True)) == 1
    assert len({e.name for e in world.entities}) == len(world.entities)


def test_train_and_test_do_not_overlap(organism) -> None:
    def chain_key(ex):
        return (ex.metadata["start"], tuple(ex.metadata["relations"]))

    assert not {ex.question for ex in organism.train} & {ex.question for ex in organism.test}
    assert not {chain_key(ex) for ex in organism.train} & {chain_key(ex) for ex in organism.test}
    assert len({chain_key(ex) for ex in organism.train}) == len(organism.train)
    ids = [ex.id for ex in organism.train + organism.test]
    assert len(set(ids)) == len(ids) and ids[0] == "world:s0:train:0"


def test_expert_queries_retrieve_gold_with_bm25(organism) -> None:
    bm25s = pytest.importorskip("bm25s")
    ids = [d["id"] for d in organism.corpus]
    retriever = bm25s.BM25()
    retriever.index([sorted(words(d["contents"])) for d in organism.corpus], show_progress=False)
    hops = [h for ex in organism.train + organism.test for h in ex.metadata["chain"]]
    results, _ = retriever.retrieve(
        [sorted(words(h["query"])) for h in hops], k=3, show_progress=False
    )
    hit = sum(h["doc_id"] in {ids[j] for j in row} for row, h in zip(results, hops, strict=True))
    assert hit / len(hops) >= 0.9


def test_written_files_load_back_with_the_same_ids(tmp_path: Path) -> None:
    world = generate_world(
        WorldConfig.preset("organism", num_entities=60, num_train=30, num_test=10)
    )
    paths = write_world(world, tmp_path)
    loaded = load_flashrag_jsonl(paths["train"])
    assert [ex.id for ex in loaded] == [ex.id for ex in world.train]
    assert loaded[5].metadata["chain"] == world.train[5].metadata["chain"]
    corpus = [json.loads(line) for line in paths["corpus"].read_text().splitlines()]
    assert all(set(d) == {"id", "contents"} and d["contents"].startswith('"') for d in corpus)
    meta = json.loads(paths["world"].read_text())
    assert meta["config"]["num_entities"] == 60 and meta["stats"]["passages"] == len(corpus)


def test_config_errors_name_the_field() -> None:
    with pytest.raises(ConfigError, match="'world-easy' is not a shipped preset"):
        WorldConfig.preset("easy")
    with pytest.raises(ConfigError, match=r"hop_mix\.x: Input should be a valid integer"):
        load_world_config(None, {"hop_mix": {"x": 0.5}})
    with pytest.raises(ConfigError, match="entities: unknown key"):
        load_world_config(None, {"entities": 60})
    with pytest.raises(ConfigError, match=r"world\.name_similarity"):
        generate_world(WorldConfig(name_similarity=2.0))
    with pytest.raises(ConfigError, match=r"1-hop chains; raise world\.num_entities"):
        generate_world(WorldConfig(num_entities=20, num_train=100))


def test_cli_writes_world_and_prints_stats(tmp_path: Path, capsys) -> None:
    rc = cli_main(
        [
            "world",
            "--out",
            str(tmp_path),
            "seed=1",
            "num_entities=60",
            "hop_mix=1:0.6,2:0.4",
            "num_train=20",
            "num_test=5",
            "name_similarity=0.2",
            "distractors_per_entity=2",
        ]
    )
    assert rc == 0
    stats = json.loads((tmp_path / "world.json").read_text())["stats"]
    assert stats["train_by_hops"] == {"1": 12, "2": 8}
    assert stats["distractor_passages"] == 2 * 60
    assert '"passages"' in capsys.readouterr().out
    assert cli_main(["world", "--out", str(tmp_path), "hop_mix=1=0.5"]) == 2
    assert "hop_mix: expected HOPS:WEIGHT pairs" in capsys.readouterr().err


def test_presets_load_through_the_one_loader(tmp_path: Path, capsys) -> None:
    """The organism preset spells out the WorldConfig defaults; world-hard overrides them."""
    assert load_world_config("world-organism") == WorldConfig()
    assert load_world_config(None) == WorldConfig()
    hard = WorldConfig.preset("hard", seed=4)
    assert (hard.num_entities, hard.hop_mix, hard.seed) == (600, {1: 0.3, 2: 0.4, 3: 0.3}, 4)
    own = tmp_path / "mine.yaml"
    own.write_text("base: world-hard\nnum_train: 10\nhop_mix: {1: 1}\n")
    cfg = load_world_config(own, {"num_test": 3})
    assert (cfg.num_entities, cfg.num_train, cfg.num_test, cfg.hop_mix) == (600, 10, 3, {1: 1.0})
    rc = cli_main(["world", "--out", str(tmp_path / "w"), "--config", str(own), "--print-config"])
    assert rc == 0 and not (tmp_path / "w").exists()
    printed = yaml.safe_load(capsys.readouterr().out)
    assert printed["num_train"] == 10 and printed["hop_mix"] == {"1": 1.0}
    assert printed.pop("out") == str(tmp_path / "w")
    assert WorldConfig.from_dict(printed) == load_world_config(own)  # world.json form
