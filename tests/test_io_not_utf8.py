"""A data or corpus file that is not UTF-8 is one line naming the file, line and byte."""

from __future__ import annotations

import gzip
import json

import pytest

from llds.data.loaders import load_flashrag_json, load_flashrag_jsonl
from llds.errors import DataFormatError
from llds.retrieval.corpus import read_corpus

LATIN1 = "Qui a écrit Candide ?".encode("latin-1")  # é is 0xe9, not UTF-8


def test_jsonl_questions(tmp_path):
    path = tmp_path / "train.jsonl"
    good = json.dumps({"id": 1, "question": "q", "golden_answers": ["a"]}).encode()
    bad = b'{"id": 2, "question": "' + LATIN1 + b'", "golden_answers": ["Voltaire"]}'
    path.write_bytes(good + b"\n" + bad + b"\n")
    with pytest.raises(DataFormatError, match=rf"^{path} line 2: not UTF-8 text \(byte 0xe9"):
        load_flashrag_jsonl(path)


def test_json_questions(tmp_path):
    path = tmp_path / "train.json"
    path.write_bytes(b'[\n{"id": 1, "question": "' + LATIN1 + b'", "golden_answers": ["a"]}]')
    with pytest.raises(DataFormatError, match=rf"^{path} line 2: not UTF-8 text \(byte 0xe9"):
        load_flashrag_json(path)


@pytest.mark.parametrize("gz", [False, True])
def test_corpus(tmp_path, gz):
    rows = json.dumps({"id": "1", "contents": '"T"\nok'}).encode() + b"\n"
    rows += b'{"id": "2", "contents": "' + LATIN1 + b'"}\n'
    path = tmp_path / ("corpus.jsonl.gz" if gz else "corpus.jsonl")
    path.write_bytes(gzip.compress(rows) if gz else rows)
    with pytest.raises(DataFormatError, match=r"line 2: not UTF-8 text \(byte 0xe9 at column"):
        list(read_corpus(path))
