"""`llds index` / `open_retriever`: building, loading and naming retrievers from the outside."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from llds.cli import main
from llds.errors import UserInputError
from llds.retrieval.bm25 import BM25Retriever
from llds.retrieval.client import HTTPRetriever, normalize_url
from llds.retrieval.corpus import read_corpus
from llds.retrieval.factory import open_retriever
from llds.retrieval.manifest import read_meta

ROWS = [
    {"title": "Saturn", "text": "Saturn is the sixth planet and has prominent rings."},
    {"title": "Mercury", "text": "Mercury is the smallest planet and closest to the Sun."},
    {"title": "Jupiter", "text": "Jupiter is the largest planet in the Solar System."},
]


@pytest.fixture()
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "plain.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in ROWS), encoding="utf-8")
    return path


def test_index_command_builds_a_loadable_index(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "idx"
    exported = tmp_path / "export.jsonl"
    rc = main(
        [
            "index",
            "--corpus",
            str(corpus),
            "--out",
            str(out),
            "--no-progress",
            f"write_corpus={exported}",
        ]
    )
    assert rc == 0
    assert read_meta(out)["documents"] == 3
    loaded = open_retriever(out)
    assert isinstance(loaded, BM25Retriever)
    assert loaded.search(["largest planet"], 1)[0][0].title == "Jupiter"
    # the index's docs.jsonl and the export are both Search-R1 corpora
    assert list(read_corpus(out / "docs.jsonl")) == list(read_corpus(exported))
    assert next(iter(read_corpus(exported))).contents.startswith('"Saturn"\n')


def test_index_command_reports_bad_rows_without_traceback(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"title": "A", "text": "a"}\n{"title": "B"}\n', encoding="utf-8")
    rc = main(["index", "--corpus", str(bad), "--out", str(tmp_path / "idx"), "--no-progress"])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"{bad}:2: missing field 'text'" in err
    assert "Traceback" not in err
    assert not (tmp_path / "idx").exists()


def test_open_retriever_builds_from_a_corpus_file(corpus: Path) -> None:
    retriever = open_retriever(corpus)
    assert retriever.search(["closest to the Sun"], 1)[0][0].title == "Mercury"


def test_open_retriever_urls_and_errors(tmp_path: Path) -> None:
    client = open_retriever("http://127.0.0.1:9/", retries=0)
    assert isinstance(client, HTTPRetriever)
    assert client.url == "http://127.0.0.1:9/retrieve"
    assert normalize_url("http://h:8000/retrieve") == "http://h:8000/retrieve"
    with pytest.raises(UserInputError):
        normalize_url("ftp://h")
    with pytest.raises(UserInputError, match=r"not a URL"):
        open_retriever(tmp_path / "missing")
    with pytest.raises(UserInputError, match=r"no meta\.json"):
        open_retriever(tmp_path)


def test_serve_retriever_rejects_a_bad_topk(
    corpus: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    rc = main(["serve-retriever", "--corpus", str(corpus), "--topk", "0"])
    assert rc == 2
    assert "command line: topk: Input should be greater than or equal to 1" in (
        capsys.readouterr().err
    )
    rc = main(["serve-retriever", "--corpus", str(corpus), "topk=20", "max_topk=10"])
    assert rc == 2
    assert "command line: topk: must be between 1 and max_topk=10" in capsys.readouterr().err
