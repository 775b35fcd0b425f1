"""The /retrieve wire format: every malformed request is a named 4xx, both hit shapes decode."""

from __future__ import annotations

import json

import pytest

from llds.retrieval.base import Hit
from llds.retrieval.protocol import (
    Limits,
    RequestError,
    decode_hits,
    encode_hits,
    parse_request,
)

LIMITS = Limits(max_queries=4, max_query_chars=20, max_topk=10)


def parse(obj: object) -> object:
    raw = obj if isinstance(obj, bytes) else json.dumps(obj).encode()
    return parse_request(raw, default_topk=3, limits=LIMITS)


def test_defaults_follow_the_reference_server() -> None:
    req = parse({"queries": ["a", ""]})
    assert (req.queries, req.topk, req.return_scores) == (["a", ""], 3, False)
    req = parse({"queries": [], "topk": None, "return_scores": None, "extra": 1})
    assert (req.queries, req.topk, req.return_scores) == ([], 3, False)
    req = parse({"queries": ["q"], "topk": 10, "return_scores": True})
    assert (req.topk, req.return_scores) == (10, True)


@pytest.mark.parametrize(
    ("body", "status", "field"),
    [
        (b"{nope", 400, None),
        (b"\xff\xfe", 400, None),
        ([1, 2], 400, None),
        ({}, 422, "queries"),
        ({"queries": None}, 422, "queries"),
        ({"queries": "a string"}, 422, "queries"),
        ({"queries": ["ok", None]}, 422, "queries[1]"),
        ({"queries": ["ok", 5]}, 422, "queries[1]"),
        ({"queries": ["a"] * 5}, 413, "queries"),
        ({"queries": ["x" * 21]}, 413, "queries[0]"),
        ({"queries": ["a"], "topk": 0}, 422, "topk"),
        ({"queries": ["a"], "topk": -3}, 422, "topk"),
        ({"queries": ["a"], "topk": 11}, 422, "topk"),
        ({"queries": ["a"], "topk": 10**30}, 422, "topk"),
        ({"queries": ["a"], "topk": 2.5}, 422, "topk"),
        ({"queries": ["a"], "topk": "3"}, 422, "topk"),
        ({"queries": ["a"], "topk": True}, 422, "topk"),
        ({"queries": ["a"], "return_scores": "yes"}, 422, "return_scores"),
        ({"queries": ["a"], "return_scores": 1}, 422, "return_scores"),
    ],
)
def test_bad_requests_are_4xx_naming_the_field(
    body: object, status: int, field: str | None
) -> None:
    with pytest.raises(RequestError) as err:
        parse(body)
    assert err.value.status == status
    assert err.value.field == field
    out = err.value.body()
    assert set(out) >= {"error", "detail"}
    if field is not None:
        assert f"'{field}'" in out["detail"]


def test_encode_both_shapes_and_decode_back() -> None:
    results = [[Hit("1", '"T"\ntext', 2.5), Hit("2", '"U"\nu', 1.0)], []]
    scored = encode_hits(results, return_scores=True)
    assert scored == {
        "result": [
            [
                {"document": {"id": "1", "contents": '"T"\ntext'}, "score": 2.5},
                {"document": {"id": "2", "contents": '"U"\nu'}, "score": 1.0},
            ],
            [],
        ]
    }
    plain = encode_hits(results, return_scores=False)
    assert plain == {
        "result": [[{"id": "1", "contents": '"T"\ntext'}, {"id": "2", "contents": '"U"\nu'}], []]
    }
    assert decode_hits(json.loads(json.dumps(scored))) == results
    assert decode_hits(plain) == [[Hit("1", '"T"\ntext', 0.0), Hit("2", '"U"\nu', 0.0)], []]


@pytest.mark.parametrize("payload", [None, {}, {"result": 3}, {"result": [3]}, {"result": [[{}]]}])
def test_decode_rejects_malformed_responses(payload: object) -> None:
    with pytest.raises(ValueError):
        decode_hits(payload)
