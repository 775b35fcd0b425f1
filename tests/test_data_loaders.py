"""Loaders: Search-R1 parquet, FlashRAG jsonl/json, dispatch, ids, error messages."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from llds.data.loaders import (
    _answers,
    load_examples,
    load_flashrag_jsonl,
    load_many,
    load_search_r1_parquet,
)
from llds.errors import DataFormatError, UserInputError

INSTRUCTION = (
    "Answer the given question. Reason inside <think> and </think>. For example, "
    "Question: what is 1+1? <answer> 2 </answer>. Question: "
)


def search_r1_row(source: str, index: int, question: str, target: object) -> dict:
    return {
        "data_source": source,
        "prompt": [{"role": "user", "content": f"{INSTRUCTION}{question}\n"}],
        "ability": "fact-reasoning",
        "reward_model": {"style": "rule", "ground_truth": {"target": target}},
        "extra_info": {"split": "train", "index": index},
    }


def write_parquet(path: Path, rows: list[dict]) -> Path:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return path


def write_jsonl(path: Path, rows: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_search_r1_parquet_parses_nested_structure(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "nq_train.parquet",
        [
            search_r1_row("nq", 7, "who wrote hamlet?", ["Shakespeare", "William Shakespeare"]),
            search_r1_row("nq", 9, "capital of france?", ["Paris"]),
        ],
    )
    examples = load_search_r1_parquet(path)
    assert [ex.question for ex in examples] == ["who wrote hamlet?", "capital of france?"]
    assert examples[0].answers == ("Shakespeare", "William Shakespeare")
    assert [ex.id for ex in examples] == ["nq:nq_train:7", "nq:nq_train:9"]
    assert examples[1].source == "nq"
    assert examples[1].metadata["split"] == "train"
    assert examples[1].metadata["index"] == 9
    assert examples[1].metadata["ability"] == "fact-reasoning"


def test_question_is_taken_after_the_last_marker(tmp_path: Path) -> None:
    # INSTRUCTION itself contains an earlier "Question:" (its one-shot example).
    path = write_parquet(tmp_path / "a.parquet", [search_r1_row("nq", 0, "who is x?", ["y"])])
    assert load_search_r1_parquet(path)[0].question == "who is x?"


def test_flashrag_question_column_is_preferred(tmp_path: Path) -> None:
    row = search_r1_row("hotpotqa", 3, "prompt version?", ["a"])
    row.update({"id": "train_3", "question": "column version?", "golden_answers": ["b"]})
    ex = load_search_r1_parquet(write_parquet(tmp_path / "h.parquet", [row]))[0]
    assert ex.question == "column version?"
    assert ex.answers == ("a",)  # the reward target is what Search-R1 scores against
    assert ex.metadata["flashrag_id"] == "train_3"


def test_string_target_and_numpy_targets(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "s.parquet", [search_r1_row("nq", 0, "q?", "Paris")])
    assert load_search_r1_parquet(path)[0].answers == ("Paris",)
    assert _answers(np.array(["a", "b"], dtype=object), "x") == ("a", "b")
    assert _answers([" a ", "", None, 3], "x") == ("a", "3")


def test_merged_file_keeps_datasets_apart(tmp_path: Path) -> None:
    path = write_parquet(
        tmp_path / "train.parquet",
        [
            search_r1_row("nq", 0, "q1?", ["a"]),
            search_r1_row("hotpotqa", 0, "q2?", ["b"]),
        ],
    )
    ids = [ex.id for ex in load_search_r1_parquet(path)]
    assert ids == ["nq:train:0", "hotpotqa:train:0"]


def test_ids_unique_across_files_with_same_row_indices(tmp_path: Path) -> None:
    rows = [search_r1_row("nq", i, f"q{i}?", ["a"]) for i in range(3)]
    a = write_parquet(tmp_path / "part_a.parquet", rows)
    b = write_parquet(tmp_path / "part_b.parquet", rows)
    j = write_jsonl(
        tmp_path / "nq" / "test.jsonl",
        [{"id": i, "question": f"q{i}?", "golden_answers": ["a"]} for i in range(3)],
    )
    examples = load_many([a, b, j])
    assert len(examples) == 9
    assert len({ex.id for ex in examples}) == 9


def test_same_stem_same_source_is_refused_not_merged(tmp_path: Path) -> None:
    rows = [search_r1_row("nq", 0, "q?", ["a"])]
    (tmp_path / "x").mkdir()
    (tmp_path / "y").mkdir()
    a = write_parquet(tmp_path / "x" / "train.parquet", rows)
    b = write_parquet(tmp_path / "y" / "train.parquet", rows)
    with pytest.raises(DataFormatError, match=r"nq:train:0.*x/train\.parquet.*y/train\.parquet"):
        load_many([a, b])


def test_duplicate_index_in_one_file_is_an_error(tmp_path: Path) -> None:
    path = write_parquet(tmp_path / "d.parquet", [search_r1_row("nq", 4, "q?", ["a"])] * 2)
    with pytest.raises(DataFormatError, match=r"d\.parquet: rows 0 and 1 .*nq:d:4"):
        load_search_r1_parquet(path)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda r: r.pop("reward_model"), "reward_model.ground_truth.target"),
        (lambda r: r.pop("prompt"), "'question' or a 'prompt'"),
        (lambda r: r["reward_model"]["ground_truth"].update(target=[""]), "no non-empty gold"),
    ],
)
def test_schema_errors_name_file_row_and_field(tmp_path: Path, mutate, field: str) -> None:
    bad = search_r1_row("nq", 1, "broken?", ["a"])
    mutate(bad)
    path = write_parquet(tmp_path / "bad.parquet", [search_r1_row("nq", 0, "fine?", ["a"]), bad])
    with pytest.raises(DataFormatError) as err:
        load_search_r1_parquet(path)
    assert "bad.parquet row 1" in str(err.value)
    assert field in str(err.value)


def test_flashrag_jsonl(tmp_path: Path) -> None:
    path = tmp_path / "popqa" / "dev.jsonl"
    path.parent.mkdir()
    path.write_text(
        json.dumps({"id": "dev_0", "question": " who? ", "golden_answers": ["A", "B"]})
        + "\n\n"
        + json.dumps({"question": "what?", "golden_answers": "C"})
        + "\n"
    )
    examples = load_flashrag_jsonl(path)
    assert [ex.id for ex in examples] == ["popqa:dev:dev_0", "popqa:dev:2"]
    assert examples[0].question == "who?"
    assert examples[0].answers == ("A", "B")
    assert examples[1].answers == ("C",)
    assert examples[0].source == "popqa"


def test_flashrag_errors_name_line_and_field(tmp_path: Path) -> None:
    path = write_jsonl(
        tmp_path / "d.jsonl",
        [{"id": 1, "question": "q", "golden_answers": ["a"]}, {"id": 2, "question": "q2"}],
    )
    with pytest.raises(DataFormatError, match=r"d\.jsonl line 2\.golden_answers: missing"):
        load_flashrag_jsonl(path)
    path.write_text('{"id": 1, "question": "q", "golden_answers": ["a"]}\n{not json\n')
    with pytest.raises(DataFormatError, match=r"d\.jsonl line 2: invalid JSON"):
        load_flashrag_jsonl(path)
    path.write_text('{"id": 1, "question": 5, "golden_answers": ["a"]}\n')
    with pytest.raises(DataFormatError, match=r"line 1\.question"):
        load_flashrag_jsonl(path)


def test_load_examples_dispatch_and_limit(tmp_path: Path) -> None:
    rows = [{"id": i, "question": f"q{i}", "golden_answers": [str(i)]} for i in range(5)]
    js = tmp_path / "ds" / "x.json"
    js.parent.mkdir()
    js.write_text(json.dumps(rows))
    pqf = write_parquet(tmp_path / "y.parquet", [search_r1_row("nq", 1, "q?", ["a"])])
    assert [ex.answers for ex in load_examples(js, limit=2)] == [("0",), ("1",)]
    assert load_examples(str(pqf))[0].id == "nq:y:1"
    with pytest.raises(UserInputError, match=r"cannot tell the format of .*data\.csv"):
        load_examples(tmp_path / "data.csv")
    with pytest.raises(UserInputError, match="not found"):
        load_examples(tmp_path / "missing.jsonl")
