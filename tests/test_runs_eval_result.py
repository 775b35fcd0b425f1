"""Typed evaluation results: scores by hand, the JSON round trip, named errors, file convention."""

from __future__ import annotations

import json
import math

import pytest

from llds.errors import DataFormatError
from llds.runs.eval_result import (
    EvalRecord,
    EvalResult,
    Scores,
    eval_file,
    eval_files,
    latest_eval_file,
)


def _record(i: int, source: str, hops: int | None, em: float, searches: int) -> EvalRecord:
    return EvalRecord(
        id=f"q{i}",
        source=source,
        question=f"question {i}?",
        golds=["A"],
        prediction="A" if em else "B",
        em=em,
        f1=em,
        sub_em=1.0,
        valid_searches=searches,
        answered=i != 3,
        hops=hops,
        queries=["capital of X"] * searches,
        response="...",
    )


RECORDS = [
    _record(0, "world", 1, 1.0, 1),
    _record(1, "world", 2, 0.0, 2),
    _record(2, "trivia", None, 1.0, 0),
    _record(3, "world", 2, 1.0, 3),
]


def test_scores_by_hand() -> None:
    res = EvalResult.of(RECORDS)
    assert res.overall == Scores(4, em=0.75, f1=0.75, sub_em=1.0, valid_searches=1.5, answered=0.75)
    assert list(res.by_source) == ["trivia", "world"]  # sorted
    assert res.by_source["world"].n == 3 and res.by_source["world"].em == pytest.approx(2 / 3)
    assert res.by_hops["2"] == Scores(
        2, em=0.5, f1=0.5, sub_em=1.0, valid_searches=2.5, answered=0.5
    )
    assert "3" not in res.by_hops  # questions without a hop count are in no hop bucket
    em = res.em_by_hops("123")
    assert em["1"] == 1.0 and em["2"] == 0.5 and math.isnan(em["3"])


def test_empty_scores_serialize_as_a_count_only() -> None:
    assert EvalResult.of([]).to_dict()["overall"] == {"n": 0}
    assert math.isnan(Scores(0).em)


def test_json_round_trip(tmp_path) -> None:
    res = EvalResult.of(RECORDS)
    path = res.write(tmp_path / "eval" / "step_000010.json")
    data = json.loads(path.read_text())
    assert list(data) == ["overall", "by_source", "by_hops", "records"]
    assert data["overall"]["em"] == 0.75 and data["records"][1]["prediction"] == "B"
    assert EvalResult.read(path) == res


def test_summaries_without_records_load() -> None:
    res = EvalResult.from_dict(
        {
            "overall": {
                "n": 2,
                **dict.fromkeys(("em", "f1"), 0.5),
                "sub_em": 1,
                "valid_searches": 1,
                "answered": 1,
            }
        },
        "x.json",
    )
    assert res.overall.em == 0.5 and res.records == [] and res.by_hops == {}


@pytest.mark.parametrize(
    ("data", "named"),
    [
        ([], "x.json: expected an object with an 'overall' object"),
        ({"overall": {"em": 0.5}}, "x.json: overall.n: expected a count"),
        ({"overall": {"n": 2, "em": "high"}}, "x.json: overall.em: expected a number"),
        ({"overall": {"n": 0}, "by_hops": {"2": {"n": -1}}}, "x.json: by_hops.2.n"),
        ({"overall": {"n": 0}, "records": [{"id": "q"}]}, "x.json: records[0]"),
        ({"overall": {"n": 0}, "records": [{"idd": "q"}]}, "unknown field(s) ['idd']"),
    ],
)
def test_bad_files_name_the_file_and_field(data, named) -> None:
    with pytest.raises(DataFormatError) as err:
        EvalResult.from_dict(data, "x.json")
    assert named in str(err.value)


def test_not_json_names_the_file(tmp_path) -> None:
    bad = tmp_path / "step_000001.json"
    bad.write_text("{")
    with pytest.raises(DataFormatError, match=r"step_000001\.json: not valid JSON"):
        EvalResult.read(bad)


def test_eval_file_convention(tmp_path) -> None:
    assert eval_file(tmp_path, 50) == tmp_path / "eval" / "step_000050.json"
    assert latest_eval_file(tmp_path) is None
    for step in (200, 0, 1000):
        EvalResult.of(RECORDS[:1]).write(eval_file(tmp_path, step))
    (tmp_path / "eval" / "step_notes.json").write_text("{}")  # not a step: ignored
    assert [s for s, _ in eval_files(tmp_path)] == [0, 200, 1000]
    assert latest_eval_file(tmp_path) == eval_file(tmp_path, 1000)
