"""The Search-R1 `/retrieve` wire format: request validation and response encoding.

Pure functions, so every malformed-input case can be tested without a server.

Request: `{"queries": [str, ...], "topk": int (optional), "return_scores": bool (optional)}`.
`return_scores` defaults to false, as in the reference server. An empty `queries` list is valid
(Search-R1's trainer sends one when no rollout searched in a turn) and an empty query string gets
an empty hit list. Unknown extra fields are ignored.
Response: `{"result": [[hit, ...] per query]}` where a hit is `{"document": {"id", "contents"},
"score": float}` with `return_scores`, else the document object `{"id", "contents"}` itself.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from llds.retrieval.base import Hit


@dataclass(frozen=True)
class Limits:
    """Server-side bounds on one request; every violation is a 4xx naming the field."""

    max_queries: int = 512
    max_query_chars: int = 4096
    max_topk: int = 100
    max_body_bytes: int = 4 * 1024 * 1024


@dataclass(frozen=True)
class RetrieveRequest:
    queries: list[str]
    topk: int
    return_scores: bool


class RequestError(Exception):
    """A client error: HTTP `status`, short `error` code, `detail` naming the field."""

    def __init__(self, status: int, error: str, detail: str, field: str | None = None) -> None:
        super().__init__(detail)
        self.status = status
        self.error = error
        self.detail = detail
        self.field = field

    def body(self) -> dict[str, Any]:
        out: dict[str, Any] = {"error": self.error, "detail": self.detail}
        if self.field is not None:
            out["field"] = self.field
        return out


def _invalid(field: str, detail: str) -> RequestError:
    return RequestError(422, "invalid_field", f"field '{field}': {detail}", field)


def _type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _decode(raw: bytes) -> Any:
    """The JSON value of a body. Whatever the parser rejects is the client's error (400): bad
    syntax or encoding, integers past Python's digit limit (ValueError), and nesting deeper
    than the parser's recursion limit (RecursionError), which would otherwise be a 500."""
    try:
        return json.loads(raw)
    except RecursionError:
        raise RequestError(
            400, "invalid_json", "request body is nested too deeply to be a retrieve request"
        ) from None
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError are ValueErrors too
        raise RequestError(400, "invalid_json", f"request body is not valid JSON: {exc}") from None


def parse_request(raw: bytes, default_topk: int, limits: Limits) -> RetrieveRequest:
    """Decode and validate one request body; raises RequestError on any problem."""
    payload = _decode(raw)
    if not isinstance(payload, dict):
        raise RequestError(400, "invalid_json", "request body must be a JSON object")

    if "queries" not in payload:
        raise _invalid("queries", "required (a list of strings)")
    queries = payload["queries"]
    if not isinstance(queries, list):
        raise _invalid("queries", f"must be a list of strings, got {_type_name(queries)}")
    if len(queries) > limits.max_queries:
        raise RequestError(
            413,
            "too_many_queries",
            f"field 'queries': {len(queries)} queries exceed the limit of {limits.max_queries} "
            "per request; split the batch",
            "queries",
        )
    for i, query in enumerate(queries):
        if not isinstance(query, str):
            raise _invalid(f"queries[{i}]", f"must be a string, got {_type_name(query)}")
        if len(query) > limits.max_query_chars:
            raise RequestError(
                413,
                "query_too_long",
                f"field 'queries[{i}]': {len(query)} characters exceed the limit of "
                f"{limits.max_query_chars}",
                f"queries[{i}]",
            )

    topk = payload.get("topk")
    if topk is None:
        topk = default_topk
    elif isinstance(topk, bool) or not isinstance(topk, int):
        raise _invalid("topk", f"must be an integer, got {_type_name(topk)}")
    if not 1 <= topk <= limits.max_topk:
        raise _invalid("topk", f"must be between 1 and {limits.max_topk}, got {topk}")

    return_scores = payload.get("return_scores")
    if return_scores is None:
        return_scores = False
    elif not isinstance(return_scores, bool):
        raise _invalid("return_scores", f"must be true or false, got {_type_name(return_scores)}")
    return RetrieveRequest(queries=queries, topk=topk, return_scores=return_scores)


def encode_hits(results: Sequence[Sequence[Hit]], return_scores: bool) -> dict[str, Any]:
    """The response object for per-query hit lists."""
    if return_scores:
        out = [
            [
                {"document": {"id": h.id, "contents": h.contents}, "score": float(h.score)}
                for h in hits
            ]
            for hits in results
        ]
    else:
        out = [[{"id": h.id, "contents": h.contents} for h in hits] for hits in results]
    return {"result": out}


class ReplyError(ValueError):
    """A `/retrieve` reply that does not follow the Search-R1 schema; the message names the
    part (`result[0][1].score`) and what it holds instead."""


def _number(value: Any, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ReplyError(f"{where} is not a number (got {_type_name(value)})")
    try:
        return float(value)
    except ValueError:
        raise ReplyError(f"{where} is not a number (got {str(value)[:40]!r})") from None


def decode_hits(payload: Any) -> list[list[Hit]]:
    """Parse a `/retrieve` reply (either hit shape) back into hits; anything else is one
    `ReplyError` naming the part that is wrong."""
    if not isinstance(payload, dict) or not isinstance(payload.get("result"), list):
        got = f"keys {sorted(payload)[:5]}" if isinstance(payload, dict) else _type_name(payload)
        raise ReplyError(f"the reply has no 'result' list (got {got})")
    results: list[list[Hit]] = []
    for i, hits in enumerate(payload["result"]):
        if not isinstance(hits, list):
            raise ReplyError(f"result[{i}] is not a list of hits (got {_type_name(hits)})")
        parsed = []
        for j, hit in enumerate(hits):
            where = f"result[{i}][{j}]"
            doc = hit.get("document", hit) if isinstance(hit, dict) else None
            if not isinstance(doc, dict) or not isinstance(doc.get("contents"), str):
                raise ReplyError(
                    f"{where} has no 'contents' text (a hit is {{id, contents}}, or "
                    "{document: {id, contents}, score} with return_scores)"
                )
            score = _number(hit.get("score", 0.0), f"{where}.score") if "document" in hit else 0.0
            parsed.append(Hit(str(doc.get("id", "")), doc["contents"], score))
        results.append(parsed)
    return results
